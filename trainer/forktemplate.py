"""A template for fork servers: one interpreter that has imported what trainer processes import
and forks, on request, a job's fork server (trainer.forkserver) from that state, so a job's
server is ready at once instead of after seconds of imports.

    python -m trainer.forktemplate --listen PATH

It listens on a Unix socket at PATH (this user's alone) once its imports are done. Each
connection asks for one server, a JSON line with two descriptors attached (SCM_RIGHTS): the
server's requests (a pipe's read end) and its replies (a pipe's write end), as a spawned server
has them on its stdin and stdout:

- `{"serve": {"env": {...}, "cwd": "...", "log": "...", "preload": [...]}}`: `env` holds the
  variables of the server's children that a library reads as it loads
  (`trainer.forkserver.differences`); where they differ from the template's, it refuses, since
  its imports would not be theirs. `log` takes the server's own output; `preload`, what it
  imports beyond the trainer's own. Reply `{"started": pid}`, or `{"error": "..."}`.

A server it forked runs in a session of its own and ends as a spawned one does, when its
client closes its requests; the template waits for it. The template ends at the end of its
stdin (whoever started it is gone); the servers it forked run on.

Its environment is what every job's processes share, without any job's or the control plane's
secrets: a process forked from it holds nothing of theirs, in its memory or its
`/proc/<pid>/environ`, but what its own request brought.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import socket
import sys
from pathlib import Path
from typing import Any

from trainer.forkserver import REAP_SECONDS, Server, differences, preload, settle

BUFFER = 65536


class Template:
    def __init__(self, listener: socket.socket, environ: dict[str, str]) -> None:
        self.listener, self.environ = listener, environ
        self.set_by_imports = {k: v for k, v in os.environ.items() if k not in environ}

    def serve(self) -> int:
        while True:
            readable, _, _ = select.select([0, self.listener.fileno()], [], [], REAP_SECONDS)
            if 0 in readable and not os.read(0, BUFFER):
                return 0
            if self.listener.fileno() in readable:
                connection, _ = self.listener.accept()
                with connection:
                    self.answer(connection)
            self.reap()

    def answer(self, connection: socket.socket) -> None:
        connection.settimeout(5.0)
        fds: list[int] = []
        try:
            data, fds, _, _ = socket.recv_fds(connection, BUFFER, 2)
            request = json.loads(data)["serve"]
            reply: dict[str, Any] = {"started": self.fork(
                fds, request["env"], request["cwd"], request["log"],
                tuple(request.get("preload", ())))}
        except Exception as exc:  # a bad request is answered, never the end of the template
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        with contextlib.suppress(OSError):
            connection.sendall((json.dumps(reply) + "\n").encode())

    def fork(self, fds: list[int], env: dict[str, str], cwd: str, log: str,
             modules: tuple[str, ...]) -> int:
        if len(fds) != 2:
            raise ValueError(f"2 descriptors expected, {len(fds)} came")
        # As a fresh interpreter's imports would, a child gets what the imports set where it
        # has no value of its own (torch sets its inductor cache's directory, for one).
        imported = {**self.environ, **self.set_by_imports}
        if differ := differences(imported, {**self.set_by_imports, **env}):
            raise ValueError(f"{', '.join(differ)} differ from the template's")
        log_fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: a fork server, never returns
            code = 1
            try:
                self.listener.close()
                null = os.open(os.devnull, os.O_RDONLY)
                settle(null, log_fd, cwd, {null, log_fd})
                preload(modules)
                requests, replies = fds
                code = Server(requests, replies, self.environ).serve()
            finally:
                os._exit(code)
        os.close(log_fd)
        return pid

    @staticmethod
    def reap() -> None:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.forktemplate",
                                     description="Import what trainer processes import, then "
                                                 "fork a job's fork server on request.")
    parser.add_argument("--listen", required=True, metavar="PATH",
                        help="the Unix socket to listen on")
    args = parser.parse_args(argv)
    environ = dict(os.environ)
    preload(())
    path = Path(args.listen)
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket: this user's alone
    try:
        listener.bind(args.listen)
    finally:
        os.umask(old)
    listener.listen(16)
    try:
        return Template(listener, environ).serve()
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
