"""The other end of a fork server (trainer.forkserver): start one, ask it for children, hear
how they ended, and use a child as a `subprocess.Popen` is used."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from trainer.forkserver import IMPORT_TIME_PREFIXES, Server, preload

logger = logging.getLogger(__name__)

READY_SECONDS = 120.0
"""How long a server may take to import before its client gives up on it."""
REPLY_SECONDS = 10.0
"""How long a fork may take to be answered once the server is ready."""


class ForkClient:
    """The other end of a fork server: asks it for children, hears which ended.

    Anything wrong with the server (it ended, refuses, is not ready in time) makes it `broken`
    and `fork` answer None: the caller starts the process itself, forking only saves time.
    """

    def __init__(self, pid: int, requests: int, replies: int,
                 popen: subprocess.Popen[bytes] | None = None) -> None:
        self.pid, self.popen = pid, popen
        self._requests, self._replies = requests, replies
        os.set_blocking(replies, False)
        self.ready = False
        self.broken = False
        self.exits: dict[int, int] = {}
        """Exit codes of children that ended and were not asked about yet, by pid."""
        self._pending = b""
        self._answers: list[dict[str, Any]] = []

    @classmethod
    def spawn(cls, env: dict[str, str], cwd: Path, log: Path,
              preload: tuple[str, ...] = ()) -> ForkClient:
        """`python -m trainer.forkserver` as a child of this process, in a session of its own
        (a signal to the caller's group is not for it: it ends when the caller closes its
        input, or dies); it imports while the caller goes on."""
        argv = [sys.executable, "-m", "trainer.forkserver",
                *(arg for module in preload for arg in ("--preload", module))]
        with log.open("ab") as handle:
            return cls.over(subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=handle,
                                             start_new_session=True))

    @classmethod
    def attach(cls, template: str, env: dict[str, str], cwd: Path, log: Path,
               preload: tuple[str, ...] = ()) -> ForkClient | None:
        """A server forked by the template listening at `template` (trainer.forktemplate),
        for children with environment `env`, ready at once; None where the template cannot
        (it is not there, or its imports are not what `env` would import): spawn one."""
        requests_read, requests = os.pipe()
        replies, replies_write = os.pipe()
        answer: dict[str, Any] = {}
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.settimeout(REPLY_SECONDS)
                connection.connect(template)
                request = {"serve": {"env": {k: v for k, v in env.items()
                                             if k.startswith(IMPORT_TIME_PREFIXES)},
                                     "cwd": str(cwd), "log": str(log), "preload": preload}}
                socket.send_fds(connection, [(json.dumps(request) + "\n").encode()],
                                [requests_read, replies_write])
                with connection.makefile("rb") as reader:
                    answer = json.loads(reader.readline() or b"{}")
        except (OSError, ValueError) as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            os.close(requests_read)
            os.close(replies_write)
        if "started" not in answer:
            logger.info("fork server template %s: %s; spawning one", template,
                        answer.get("error", "no answer"))
            os.close(requests)
            os.close(replies)
            return None
        return cls(int(answer["started"]), requests, replies)

    @classmethod
    def over(cls, popen: subprocess.Popen[bytes]) -> ForkClient:
        """The client of a server started with pipes on its stdin and stdout."""
        assert popen.stdin is not None and popen.stdout is not None
        # The client writes and reads the descriptors themselves: no file object holds them.
        requests, replies = os.dup(popen.stdin.fileno()), os.dup(popen.stdout.fileno())
        popen.stdin.close()
        popen.stdout.close()
        popen.stdin = popen.stdout = None
        return cls(popen.pid, requests, replies, popen)

    @classmethod
    def fork_here(cls, modules: tuple[str, ...] = ()) -> ForkClient:
        """A server forked from this process, as it is now (call it before any thread
        starts), in a session of its own; it dies with this process, never by a signal to its
        group (a SIGTERM the caller's workers must outlive to save their state)."""
        requests_read, requests = os.pipe()
        replies, replies_write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                from trainer.distributed import die_with_parent

                die_with_parent()
                os.setsid()
                os.close(requests)
                os.close(replies)
                environ = dict(os.environ)
                preload(modules)
                code = Server(requests_read, replies_write, environ).serve()
            finally:
                os._exit(code)
        os.close(requests_read)
        os.close(replies_write)
        return cls(pid, requests, replies)

    def fork(self, argv: list[str], env: dict[str, str], cwd: Path | str,
             log: Path | None, stdin: bool = False) -> int | None:
        """Start `argv` (`[python, [-u,] -m, module, ...]`) as a fork, output to `log` (None:
        the server's); its pid, or None where the server cannot (start it yourself)."""
        if self.broken:
            return None
        if not self.ready and not self._wait(lambda: self.ready, READY_SECONDS):
            self.give_up("not ready in time" if not self.broken else "it ended")
            return None
        if not self._send({"start": {"argv": argv[1:], "env": env, "cwd": str(cwd),
                                     "log": None if log is None else str(log),
                                     "stdin": stdin}}):
            return None
        answer = self._wait(self._answer, REPLY_SECONDS)
        if not answer or "started" not in answer:
            self.give_up(f"no fork: {answer.get('error') if answer else 'no answer'}")
            return None
        return int(answer["started"])

    def feed(self, pid: int, data: str) -> bool:
        """Write `data` to child `pid`'s stdin and close it; whether the server took it."""
        return not self.broken and self._send({"feed": pid, "data": data})

    def exit_code(self, pid: int) -> int | None:
        """How child `pid` ended, if the server said so (once)."""
        self.drain()
        return self.exits.pop(pid, None)

    def drain(self) -> None:
        """Read what the server said since (never blocks)."""
        while self._replies >= 0:
            try:
                chunk = os.read(self._replies, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._ended()
                return
            self._pending += chunk
            *lines, self._pending = self._pending.split(b"\n")
            for line in lines:
                try:
                    self._heard(json.loads(line))
                except (ValueError, TypeError, KeyError):
                    logger.warning("fork server said something unreadable: %.200r", line)

    def close(self) -> None:
        """End it (its children run on) and wait for it."""
        self.broken = True  # nothing more is asked of it
        with contextlib.suppress(OSError):
            os.close(self._requests)
        self._reap(timeout=5.0)
        self.drain()

    def give_up(self, why: str) -> None:
        if not self.broken:
            logger.warning("fork server: %s; processes start afresh from now on", why)
        self.broken = True
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)

    def _reap(self, timeout: float) -> None:
        if self.popen is not None:
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
            return
        deadline = time.monotonic() + timeout
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(self.pid, os.WNOHANG)[0] == 0:
                if time.monotonic() >= deadline:
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    return
                time.sleep(0.01)

    def _heard(self, message: dict[str, Any]) -> None:
        if message.get("ready"):
            self.ready = True
        elif "exited" in message:
            self.exits[int(message["exited"])] = int(message["code"])
        else:
            self._answers.append(message)

    def _answer(self) -> dict[str, Any] | None:
        return self._answers.pop(0) if self._answers else None

    def _ended(self) -> None:
        if not self.broken:
            logger.warning("fork server ended: processes start afresh from now on")
        self.broken = True
        with contextlib.suppress(OSError):
            os.close(self._replies)
        self._replies = -1

    def _send(self, request: dict[str, Any]) -> bool:
        data = (json.dumps(request) + "\n").encode()
        try:
            while data:
                data = data[os.write(self._requests, data):]
        except OSError:
            self.give_up("it stopped reading")
            return False
        return True

    def _wait(self, found: Callable[[], Any], timeout: float) -> Any:
        """`found()` once true, reading replies until then; None after `timeout` or once the
        server ended."""
        deadline = time.monotonic() + timeout
        while True:
            self.drain()
            if (result := found()) or self.broken:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            select.select([self._replies], [], [], min(remaining, 0.5))


class ForkedProcess:
    """A server's child, as a `subprocess.Popen` is used: `pid`, `poll`, `wait`, `returncode`,
    signals (to the process, as Popen sends them)."""

    def __init__(self, forks: ForkClient, pid: int) -> None:
        self.forks, self.pid = forks, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self.forks.exit_code(self.pid)
            if code is None and self.forks.broken and not _alive(self.pid):
                code = -signal.SIGKILL  # it died with its server (see die_with_parent)
            self.returncode = code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.01)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def hand(self, line: str) -> bool:
        """Write `line` to its stdin (a pipe its server holds) and close that."""
        return self.forks.feed(self.pid, line)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (not a zombie): a child of a server that is gone is nobody's to wait
    for."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
