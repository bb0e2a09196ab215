"""Pods forked from their job's fork server (trainer.forkserver): each job's supervisor has one
that holds torch, transformers and the trainer imported, and its pods, standby and coordinator
are forks of it, watched as the processes it spawns are. The server is forked by the control
plane's template (api/backends/local/template.py) where it serves, ready at once; else the
supervisor spawns it (`ForkClient.spawn`), and it imports first.

Anything wrong with the server makes the supervisor spawn instead: forking only saves time.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from api.backends import programs
from api.backends.local.jobdir import same_process
from api.backends.local.processes import Watched
from trainer.forkclient import ForkClient

NAME = "forkserver"
"""Its log's name among the job's logs."""


def job_server(env: dict[str, str], cwd: Path, log: Path,
               preload: tuple[str, ...]) -> ForkClient:
    """The fork server for a job's pods (`env`: theirs, without their identity): from the
    control plane's template where it serves (ready at once), else spawned (it imports)."""
    template = os.environ.get(programs.TEMPLATE_ENV)
    if template and (client := ForkClient.attach(template, env, cwd, log, preload)):
        return client
    return ForkClient.spawn(env, cwd, log, preload)


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
