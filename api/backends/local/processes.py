"""What a supervisor watches: the process groups it started, or took over from a dead
predecessor, and the pods that run in them."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from api.backends.base import PodPhase
from api.backends.local.jobdir import PodRecord, ProcessRecord, same_process, signal_group

POLL_SECONDS = 0.1
STOP_GRACE_SECONDS = 10.0
"""How long a process group the supervisor stops has between SIGTERM and SIGKILL."""


class Watched(ABC):
    """A process group leader, identified by pid and start time."""

    def __init__(self, pid: int, started: float | None) -> None:
        self.pid, self.started = pid, started
        self.ended = False
        self.exit_code: int | None = None
        """Once ended: its exit status (negative: the signal that killed it), where known."""
        self.kill_at: float | None = None
        """Monotonic time at which it gets SIGKILL, once stopped with a grace."""

    def stop(self, grace: float) -> None:
        """SIGTERM its group now and SIGKILL it after `grace` seconds (at once for 0)."""
        if self.poll():
            return
        if grace <= 0:
            signal_group(self.pid, signal.SIGKILL)
            return
        signal_group(self.pid, signal.SIGTERM)
        self.kill_at = min(self.kill_at or float("inf"), time.monotonic() + grace)

    def overdue(self, now: float) -> bool:
        """Whether its grace ran out while it still runs: it gets SIGKILL now (once)."""
        if self.kill_at is None or now < self.kill_at or self.poll():
            return False
        signal_group(self.pid, signal.SIGKILL)
        self.kill_at = None
        return True

    @abstractmethod
    def poll(self) -> bool:
        """Whether it has ended (looked at again only until it has)."""

    def hand(self, line: str) -> bool:
        """Write `line` to its stdin, a pipe its starter holds, and close that; whether it was
        written (not for a process it is gone or that has no such pipe)."""
        return False

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for it to end."""
        deadline = time.monotonic() + timeout
        while not self.poll() and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS / 10)


class Child(Watched):
    """A process this supervisor started: waiting on it yields its exit status."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        started = None
        with contextlib.suppress(psutil.Error):  # it died at once: poll() records how
            started = psutil.Process(process.pid).create_time()
        super().__init__(process.pid, started)
        self.process = process

    def poll(self) -> bool:
        if not self.ended and (code := self.process.poll()) is not None:
            self.ended, self.exit_code = True, code
        return self.ended

    def hand(self, line: str) -> bool:
        stdin = self.process.stdin
        if stdin is None or self.poll():
            return False
        try:
            stdin.write(line.encode())
            stdin.close()
        except OSError:  # it died just now
            return False
        return True

    def wait(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout)
        self.poll()


class Adopted(Watched):
    """A process a dead supervisor started. Only a parent can wait for a process, so this one
    is seen to end by polling, and its exit status stays unknown (None)."""

    def poll(self) -> bool:
        if not self.ended and same_process(self.pid, self.started) is None:
            self.ended = True
        return self.ended


Start = Callable[[list[str], Path, dict[str, str], bool], Watched]
"""How the supervisor starts a process group (forked from the job's fork server where it
serves, else spawned): argv, log, environment, whether it gets a stdin pipe."""


def spawn(argv: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None,
          stdin: int = subprocess.DEVNULL) -> Child:
    """Start `argv` as the leader of a new session, appending its output to `log`;
    `stdin=subprocess.PIPE`: this supervisor writes to it (the child sees its end close with
    this process)."""
    # The child keeps its own descriptor of the log, so its output outlives this supervisor.
    with log.open("ab") as handle:
        return Child(subprocess.Popen(argv, env=env, cwd=cwd, stdin=stdin,
                                      stdout=handle, stderr=subprocess.STDOUT,
                                      start_new_session=True))


@dataclass
class Extra:
    """A pod's second process group during a migration: its replacement, or the incarnation
    the replacement took over from."""

    process: Watched
    incarnation: int
    started_at: float

    def record(self) -> ProcessRecord:
        return ProcessRecord(pid=self.process.pid, pid_started=self.process.started,
                             incarnation=self.incarnation, started_at=self.started_at)

    @classmethod
    def adopt(cls, record: ProcessRecord | None, kill_after: float | None = None,
              ) -> Extra | None:
        """The process a dead supervisor recorded; `kill_after`: it was stopped already, and
        gets SIGKILL after that many more seconds."""
        if record is None:
            return None
        process = Adopted(record.pid, record.pid_started)
        if kill_after is not None:
            process.kill_at = time.monotonic() + kill_after
        return cls(process, record.incarnation, record.started_at)


@dataclass
class Pod:
    ordinal: int
    name: str
    restarts: int = 0
    """Failed incarnations recreated: what the restart budget counts."""
    incarnation: int = 0
    """Counts every start (POD_INCARNATION: reports of each process are told apart)."""
    phase: PodPhase = "Pending"
    process: Watched | None = None
    started_at: float | None = None
    exit_code: int | None = None
    signalled_at: float | None = None
    """Unix time the supervisor first signalled this incarnation (a kill, a stop)."""
    restart_at: float | None = None
    """Monotonic time at which this failed pod is recreated."""
    removing: bool = False
    """Scaled away: dropped once its processes have ended."""
    replace_on_exit: bool = False
    """Recreated at once when it stops, no restart counted (a restart-mode migration)."""
    surge: Extra | None = None
    """A migration's replacement, running beside the current process until it takes over
    (supervisor.migration.promote_replacements)."""
    retiring: Extra | None = None
    """The process a replacement took over from, leaving."""

    @property
    def processes(self) -> list[Watched]:
        """Every process group of the pod that may still run."""
        extras = [extra.process for extra in (self.surge, self.retiring) if extra is not None]
        return [*([self.process] if self.process is not None else []), *extras]

    @property
    def stopped(self) -> bool:
        """The supervisor signalled this incarnation: it did not end its training by itself."""
        return self.signalled_at is not None

    @property
    def alive(self) -> bool:
        return self.process is not None and not self.process.ended

    def record(self) -> PodRecord:
        process = self.process
        return PodRecord(ordinal=self.ordinal, name=self.name,
                         pid=process.pid if process else None,
                         pid_started=process.started if process else None, phase=self.phase,
                         restarts=self.restarts, incarnation=self.incarnation,
                         started_at=self.started_at,
                         signalled_at=self.signalled_at, exit_code=self.exit_code,
                         removing=self.removing,
                         replace_on_exit=self.replace_on_exit,
                         surge=self.surge.record() if self.surge else None,
                         retiring=self.retiring.record() if self.retiring else None)

    def adopt(self, record: PodRecord, stop_grace: float) -> None:
        """Take over this pod as a dead supervisor left it; a signalled incarnation keeps its
        deadline (counted from when it was signalled, the grace given being unknown)."""
        self.restarts, self.phase = record.restarts, record.phase
        # A state.json of an older supervisor counted only restarts.
        self.incarnation = max(record.incarnation, record.restarts)
        self.removing, self.replace_on_exit = record.removing, record.replace_on_exit
        self.surge = Extra.adopt(record.surge)
        self.retiring = Extra.adopt(record.retiring, kill_after=stop_grace)
        self.started_at, self.exit_code = record.started_at, record.exit_code
        self.signalled_at = record.signalled_at
        if record.phase == "Running" and record.pid is not None:
            # One that died while no supervisor watched is seen to end at the first poll.
            self.process = Adopted(record.pid, record.pid_started)
            if record.signalled_at is not None:
                self.process.kill_at = time.monotonic() + max(
                    0.0, record.signalled_at + stop_grace - time.time())
