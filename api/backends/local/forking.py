"""Pods forked from their job's fork server (trainer.forkserver): each job's supervisor starts
one (`ForkClient.spawn`) that imports torch, transformers and the trainer once, and its pods
and standby are forks of it, watched as the processes it spawns are.

Anything wrong with the server makes the supervisor spawn instead: forking only saves time.
"""

from __future__ import annotations

from pathlib import Path

import psutil

from api.backends.local.jobdir import same_process
from api.backends.local.processes import Watched
from trainer.forkclient import ForkClient

NAME = "forkserver"
"""Its log's name among the job's logs."""


def fork(client: ForkClient, argv: list[str], env: dict[str, str], cwd: Path, log: Path,
         stdin: bool = False) -> Forked | None:
    """`argv` (`[python, "-m", module, ...]`) forked, its output appended to `log`; None where
    the server cannot (the caller spawns it)."""
    pid = client.fork(argv, env, cwd, log, stdin)
    if pid is None:
        return None
    try:
        started: float | None = psutil.Process(pid).create_time()
    except psutil.Error:  # it ended at once: the server says how
        started = None
    return Forked(client, pid, started)


class Forked(Watched):
    """A process its job's fork server started: the server waits for it and says how it
    ended; once the server is gone, it is seen to end by polling, its status unknown (a pod
    outlives its server, unlike a worker forked by its agent's)."""

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
