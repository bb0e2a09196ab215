"""A live job's warm standby, as its supervisor keeps it: one trainer process
(trainer.standby) that has loaded the job's model and data and becomes the next pod to start.

The next pod the supervisor starts (recreated after a failure or a graceful leave, added by a
scale-up, a migration's replacement) is handed to the standby on its stdin instead of being
spawned, so it takes part after a heal rather than after a Python start-up and a model load.
A new standby starts only once the job is quiet again (every pod takes part, none started in
the last `Standby.settle_seconds`): loading one costs CPU the pods would miss during a heal.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path

from api.backends import programs
from api.backends.local.jobdir import JobDir, StandbyRecord, same_process, signal_group
from api.backends.local.processes import Start, Watched

logger = logging.getLogger(__name__)

SETTLE_SECONDS = 5.0
"""How long after the last pod started a new standby may start loading."""
MAX_FAILURES = 3
"""Standbys that ended on their own (bad input, a crash) before the job stops keeping one."""
NAME = "standby"


class Standby:
    """At most one warm process, and what it takes to start, hand over and stop one."""

    def __init__(self, job_dir: JobDir, start: Start,
                 settle_seconds: float = SETTLE_SECONDS) -> None:
        self.job_dir, self._start = job_dir, start
        self.settle_seconds = settle_seconds
        """How long after the last pod started a new standby may start loading."""
        self.process: Watched | None = None
        self.failures = 0
        self._starts = 0

    @property
    def ready_file(self) -> Path:
        return self.job_dir.ready(NAME, self._starts)

    @property
    def ready(self) -> bool:
        return self.process is not None and self.ready_file.exists()

    def record(self) -> StandbyRecord | None:
        if self.process is None:
            return None
        return StandbyRecord(pid=self.process.pid, pid_started=self.process.started,
                             ready=self.ready)

    @staticmethod
    def discard(record: StandbyRecord | None) -> None:
        """A dead supervisor's standby: nobody can hand it a pod any more (it ends by itself at
        the end of its input, once loaded; this ends it now)."""
        if record is not None and same_process(record.pid, record.pid_started) is not None:
            signal_group(record.pid, signal.SIGKILL)

    def may_start(self) -> bool:
        """Whether none runs and the job has not given up on standbys; notes a standby that
        ended by itself."""
        process = self.process
        if process is not None and process.poll():
            self.process = None
            self.failures += 1
            logger.warning("standby (pid %d) exited with code %s before it was needed%s",
                           process.pid, process.exit_code,
                           "; no more standbys for this job" if self.failures >= MAX_FAILURES
                           else "")
        return self.process is None and self.failures < MAX_FAILURES

    def start(self, env: dict[str, str]) -> None:
        self._starts += 1
        self.ready_file.parent.mkdir(parents=True, exist_ok=True)
        for stale in self.ready_file.parent.glob(f"{NAME}.*"):  # one taken while loading
            stale.unlink(missing_ok=True)
        argv = programs.standby_argv(self.ready_file, python=sys.executable)
        self.process = self._start(argv, self.job_dir.log(NAME), env, True)
        logger.info("standby started (pid %d)", self.process.pid)

    def take(self, env: dict[str, str], log: Path) -> Watched | None:
        """The standby, told to become the pod of `env` logging to `log`; None if there is no
        live one (the caller starts the pod)."""
        process, self.process = self.process, None
        if process is None or process.poll():
            return None
        if not process.hand(json.dumps({"environ": env, "log": str(log)}) + "\n"):
            signal_group(process.pid, signal.SIGKILL)  # it died just now
            return None
        logger.info("standby (pid %d, %s) becomes the next pod", process.pid,
                    "loaded" if self.ready_file.exists() else "still loading")
        self.ready_file.unlink(missing_ok=True)
        return process

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and not process.poll():
            signal_group(process.pid, signal.SIGKILL)
            process.wait(timeout=5.0)
        self.ready_file.unlink(missing_ok=True)

