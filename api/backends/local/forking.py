"""A job's fork server (trainer.forkserver) as its supervisor uses it: pods and the standby
start as forks of one interpreter that imported torch, transformers and the trainer once,
instead of each importing them again, and are watched as the processes it spawns are.

Anything wrong with the server makes the supervisor spawn instead: forking only saves time.
"""

from __future__ import annotations

from pathlib import Path

import psutil

from api.backends.local.jobdir import same_process
from api.backends.local.processes import Watched
from trainer.forkserver import ForkClient

NAME = "forkserver"
"""Its log's name among the job's logs."""


class ForkServer:
    """One job's fork server, started when its supervisor starts."""

    def __init__(self, client: ForkClient) -> None:
        self.client = client

    @classmethod
    def start(cls, env: dict[str, str], cwd: Path, log: Path,
              preload: tuple[str, ...] = ()) -> ForkServer:
        return cls(ForkClient.spawn(env, cwd, log, preload))

    def fork(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path,
             stdin: bool = False) -> Forked | None:
        """`argv` (`[python, "-m", module, ...]`) forked, its output appended to `log`; None
        where the server cannot (the caller spawns it)."""
        pid = self.client.fork(argv, env, cwd, log, stdin)
        if pid is None:
            return None
        try:
            started: float | None = psutil.Process(pid).create_time()
        except psutil.Error:  # it ended at once: the server says how
            started = None
        return Forked(self.client, pid, started)

    def close(self) -> None:
        self.client.close()


class Forked(Watched):
    """A process its job's fork server started: the server waits for it and says how it
    ended; once the server is gone, it is seen to end by polling, its status unknown."""

    def __init__(self, client: ForkClient, pid: int, started: float | None) -> None:
        super().__init__(pid, started)
        self.client = client

    def poll(self) -> bool:
        if self.ended:
            return True
        if (code := self.client.exit_code(self.pid)) is not None:
            self.ended, self.exit_code = True, code
        elif self.client.broken and same_process(self.pid, self.started) is None:
            self.ended = True
        return self.ended

    def hand(self, line: str) -> bool:
        return self.client.feed(self.pid, line)
