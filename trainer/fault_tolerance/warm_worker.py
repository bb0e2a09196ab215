"""Restart mode's warm worker: the next round's worker has already imported and loaded.

Torchrun's agent starts a fresh `python -m trainer` for every rendezvous round, and every
membership change (a peer killed, a pod recreated) is a new round of every pod: each restart
then waits for Python, torch and transformers to import and for the tokenizer, data and model
to load, which is most of a restart. Here the agent keeps one warm standby (trainer.standby)
beside its worker once the round has run for a while, and the next round's worker is that
process, handed its environment on its stdin, so the round starts at the checkpoint load.

The standby is a torchrun worker in every way torchrun sees: it runs in a session of its own
(torchrun signals a worker's process group), dies with the agent, and its exit code is the
worker's.

Where the agent runs a fork server (trainer.forkserver, forked from the agent before torchrun
starts), workers without a ready standby, and the standby itself, are forks of it: a round
then never waits for Python's imports.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing import api as processes
from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

from trainer.distributed import STACKS_SIGNAL
from trainer.forkclient import ForkClient, ForkedProcess

logger = logging.getLogger(__name__)

STACKS_SECONDS = 0.5
"""How long a hung worker has to write its stacks before its SIGKILL."""
SETTLE_SECONDS = 5.0
"""How long a round's workers run before a standby may start loading: loading takes CPU the
round's start would miss."""


Process = subprocess.Popen[bytes] | ForkedProcess


class WarmHandler(SubprocessHandler):
    """Torchrun's handle of a worker process it did not spawn: a standby, or a fork."""

    def __init__(self, proc: Process, local_rank_id: int) -> None:
        # SubprocessHandler's own constructor starts a process: only its state is set here.
        self._stdout = self._stderr = None
        self.local_rank_id = local_rank_id
        self.proc = proc  # type: ignore[assignment]  # what torchrun uses of a Popen

    def close(self, death_sig: signal.Signals | None = None) -> None:
        if death_sig == signal.SIGKILL and self.proc.poll() is None:
            # It outlived torchrun's SIGTERM (30 s), and the job's next round waited for it:
            # its stacks, in the pod's log, say where it hung (trainer.distributed).
            with contextlib.suppress(OSError):
                os.kill(self.proc.pid, STACKS_SIGNAL)
                logger.warning("worker %d outlived its SIGTERM: its stacks follow in the log",
                               self.proc.pid)
                time.sleep(STACKS_SECONDS)  # written from a C signal handler, at once
        super().close(death_sig)


class WarmWorker:
    """At most one standby, started once a round has settled, taken by the next round."""

    def __init__(self, settle: float = SETTLE_SECONDS, forks: ForkClient | None = None) -> None:
        self.settle, self.forks = settle, forks
        self.process: Process | None = None
        self._directory = Path(tempfile.mkdtemp(prefix="warm-worker-"))
        self._ready = self._directory / "ready"
        self._round_started: float | None = None

    def round_started(self) -> None:
        self._round_started = time.monotonic()

    def poll(self) -> None:
        """Start a standby if none runs and the current round has settled."""
        if self.process is not None and self.process.poll() is not None:
            logger.warning("the warm worker exited with code %s", self.process.returncode)
            self.process = None
        if (self.process is None and self._round_started is not None
                and time.monotonic() - self._round_started >= self.settle):
            self._ready.unlink(missing_ok=True)
            argv = [sys.executable, "-m", "trainer.standby", "--ready-file", str(self._ready),
                    "--die-with-parent"]
            forks = self.forks
            pid = forks.fork(argv, dict(os.environ), Path.cwd(), None, True) if forks else None
            self.process = (ForkedProcess(forks, pid) if forks and pid else
                            subprocess.Popen(argv, stdin=subprocess.PIPE, start_new_session=True))
            logger.info("warm worker started (pid %d)", self.process.pid)

    def take(self, env: dict[str, str]) -> Process | None:
        """The standby, become the worker whose variables `env` holds, if one is loaded."""
        process = self.process
        if process is None or process.poll() is not None or not self._ready.exists():
            return None
        line = json.dumps({"environ": {**os.environ, **env}, "log": None}) + "\n"
        if not _hand(process, line):  # it died meanwhile: a fresh process instead
            logger.warning("the warm worker could not take the round")
            return None
        self.process, self._round_started = None, None
        logger.info("warm worker (pid %d) is the round's worker", process.pid)
        return process

    def close(self) -> None:
        process, self.process = self.process, None
        if isinstance(process, subprocess.Popen) and process.stdin is not None:
            process.stdin.close()  # end of input: it exits
        # A fork's pipe closes with its server, which ends with the agent.


def _hand(process: Process, line: str) -> bool:
    if isinstance(process, ForkedProcess):
        return process.hand(line)
    assert process.stdin is not None
    try:
        process.stdin.write(line.encode())
        process.stdin.close()
    except OSError:
        return False
    return True


def use(warm: WarmWorker | None, forks: ForkClient | None) -> None:
    """Torchrun's worker starts take the warm worker where one is ready, else fork from
    `forks` where it serves; else torchrun spawns them as usual."""
    start = processes.get_subprocess_handler

    def handler(entrypoint: str, args: tuple[Any, ...], env: dict[str, str], stdout: str,
                stderr: str, local_rank_id: int, numa_options: Any = None) -> SubprocessHandler:
        if not stdout and not stderr and numa_options is None:
            if warm is not None and (process := warm.take(env)) is not None:
                return WarmHandler(process, local_rank_id)
            if forks is not None and (pid := forks.fork(
                    [entrypoint, *map(str, args)], {**os.environ, **env}, Path.cwd(),
                    None)) is not None:
                return WarmHandler(ForkedProcess(forks, pid), local_rank_id)
        return start(entrypoint=entrypoint, args=args, env=env, stdout=stdout, stderr=stderr,
                     local_rank_id=local_rank_id, numa_options=numa_options)

    processes.get_subprocess_handler = handler
