"""A fork server: one interpreter that has imported what trainer processes import (torch,
transformers, the trainer) and forks them from that state, so a process starts in a fraction
of a second of CPU instead of seconds of imports.

    python -m trainer.forkserver [--preload MODULE ...]

A local supervisor keeps one per job for its pods and standby (api/backends/local/forking.py);
a restart-mode pod's agent forks one of its own for its rounds' workers
(trainer.fault_tolerance.elastic). Its environment is its children's without their identity.
It speaks JSON lines, requests on its stdin, replies on its stdout (`ForkClient` is the other
end):

- `{"ready": true}`: written once the imports are done, before any request is read.
- `{"start": {"argv": [...], "env": {...}, "cwd": "...", "log": "..." | null, "stdin": bool}}`:
  fork `python argv...` (`[-u] -m module args...`) as the leader of a new session, its output
  appended to `log` (null: where the server's goes); with `stdin`, its standard input is a
  pipe this server holds. Reply `{"started": pid}`, or `{"error": "..."}`.
- `{"feed": pid, "data": "..."}`: write `data` to that child's stdin pipe and close it.
- Unprompted, for every child that ends: `{"exited": pid, "code": code}` (negative: the
  signal that killed it, as `subprocess` says).

End of input (whoever drives it is gone) ends the server; its children run on, their stdin
pipes closed. A child whose environment differs from the server's in what libraries read at
import (beyond the thread count, which is set again) executes a fresh interpreter instead, so
forking never changes what a process computes.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import importlib
import json
import logging
import os
import runpy
import select
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PRELOAD = ("torch", "transformers", "transformers.models.bert.modeling_bert", "pandas",
           "tokenizers", "trainer.main", "trainer.prepare", "trainer.standby",
           "trainer.fault_tolerance.live", "trainer.fault_tolerance.elastic")
"""What trainer processes import; a job's own extras come from `--preload`."""

IMPORT_TIME_PREFIXES = ("HF_", "TRANSFORMERS_", "TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_",
                        "PYTORCH_", "OMP_", "MKL_", "KMP_", "PYTHON", "LD_", "MALLOC_",
                        "TOKENIZERS_")
"""Variables read when a library or the interpreter loads: a child whose values differ needs a
fresh interpreter. (CUDA's and NCCL's are read when they initialise, in the child.)"""
READ_LATER = ("OMP_NUM_THREADS", "TORCH_NCCL_")
"""Of those, what is read again or only later: the thread count (set again in the child) and
torch's NCCL options (read when a process group is created), which torchrun sets per worker."""

REAP_SECONDS = 0.05
"""How often children that ended are looked for while no request comes."""
READY_SECONDS = 120.0
"""How long a server may take to import before its client gives up on it."""
REPLY_SECONDS = 10.0
"""How long a fork may take to be answered once the server is ready."""


def differences(server: Mapping[str, str], child: Mapping[str, str]) -> list[str]:
    """What keeps a child with environment `child` from computing the same forked from a
    server with `server` as started afresh: the names of the variables read at import whose
    values differ."""
    def read_at_import(environ: Mapping[str, str]) -> dict[str, str]:
        return {k: v for k, v in environ.items()
                if k.startswith(IMPORT_TIME_PREFIXES) and not k.startswith(READ_LATER)}
    ours, theirs = read_at_import(server), read_at_import(child)
    return sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))


# --- the server --------------------------------------------------------------------------

class Server:
    def __init__(self, requests: int, replies: int, environ: Mapping[str, str]) -> None:
        self.requests, self.replies = requests, replies
        self.environ = dict(environ)
        """The environment the imports saw."""
        self.set_by_imports = {k: v for k, v in os.environ.items() if k not in environ}
        """What the imports added to it (a fresh interpreter's imports add it again)."""
        self.pipes: dict[int, int] = {}
        """Each child's stdin pipe (its write end), until fed."""
        self._pending = b""

    def reply(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self.replies, data):]

    def serve(self) -> int:
        self.reply({"ready": True})
        while True:
            readable, _, _ = select.select([self.requests], [], [], REAP_SECONDS)
            if readable:
                chunk = os.read(self.requests, 65536)
                if not chunk:
                    break
                self._pending += chunk
                *lines, self._pending = self._pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        self.handle(line)
            self.reap()
        for fd in self.pipes.values():
            os.close(fd)
        return 0

    def handle(self, line: bytes) -> None:
        try:
            request = json.loads(line)
            if "start" in request:
                self.reply({"started": self.start(**request["start"])})
            elif "feed" in request:
                self.feed(int(request["feed"]), str(request["data"]))
            else:
                raise ValueError(f"unknown request {sorted(request)}")
        except Exception as exc:  # a bad request is answered, never the end of the server
            self.reply({"error": f"{type(exc).__name__}: {exc}"})

    def feed(self, pid: int, data: str) -> None:
        fd = self.pipes.pop(pid)
        try:
            os.write(fd, data.encode())
        finally:
            os.close(fd)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if (fd := self.pipes.pop(pid, None)) is not None:
                os.close(fd)
            self.reply({"exited": pid, "code": os.waitstatus_to_exitcode(status)})

    def start(self, argv: list[str], env: dict[str, str], cwd: str, log: str | None = None,
              stdin: bool = False) -> int:
        log_fd = -1 if log is None else os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                                                0o600)
        read_end, write_end = os.pipe() if stdin else (os.open(os.devnull, os.O_RDONLY), -1)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            try:
                os.setsid()
                os.dup2(read_end, 0)
                if log_fd >= 0:
                    os.dup2(log_fd, 1)
                    os.dup2(log_fd, 2)
                for fd in {read_end, log_fd, write_end, self.requests, self.replies,
                           *self.pipes.values()} - {-1, 0, 1, 2}:
                    os.close(fd)
                os.chdir(cwd)
                run_child(argv, env, self.environ, self.set_by_imports)
            finally:
                os._exit(1)  # run_child exits itself; this only if even that failed
        if log_fd >= 0:
            os.close(log_fd)
        os.close(read_end)
        if stdin:
            self.pipes[pid] = write_end
        return pid


def run_child(argv: list[str], env: dict[str, str], server_env: Mapping[str, str],
              set_by_imports: Mapping[str, str]) -> None:
    """In a forked child: become `python argv...` with environment `env`, then exit."""
    unbuffered = bool(argv) and argv[0] == "-u"
    rest = argv[1:] if unbuffered else argv
    differ = differences(server_env, env)
    if differ or len(rest) < 2 or rest[0] != "-m":
        if differ:  # the names only: values may be secrets
            print(f"fork server: a fresh interpreter, since {', '.join(differ)} differ from "  # noqa: T201
                  "the server's", file=sys.stderr, flush=True)
        os.execve(sys.executable, [sys.executable, *argv], env)
    os.environ.clear()
    os.environ.update({**set_by_imports, **env})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if unbuffered:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(write_through=True)  # type: ignore[union-attr]
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))  # read at import: the server's may differ
    module = rest[1]
    sys.argv = [module, *rest[2:]]  # runpy sets argv[0] to the module's file
    # Run as __main__ while imported already (preloaded), as intended here: not worth a word.
    warnings.filterwarnings("ignore", message=".* found in sys.modules after import of package",
                            category=RuntimeWarning)
    code: Any = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = 1
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)  # noqa: T201  (as the interpreter does with sys.exit("..."))
        code = 1
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def preload(modules: tuple[str, ...]) -> None:
    """Import what the children use, then freeze it: the collector never walks (nor writes to,
    making a child copy its pages) what every child shares."""
    for module in (*PRELOAD, *modules):
        importlib.import_module(module)
    gc.collect()
    gc.freeze()


# --- the client --------------------------------------------------------------------------

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
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.forkserver",
                                     description="Import what trainer processes import, then "
                                                 "fork them on request (JSON lines on stdin).")
    parser.add_argument("--preload", action="append", default=[], metavar="MODULE",
                        help="a module to import beyond the trainer's own (repeatable)")
    args = parser.parse_args(argv)
    # Replies go to the stdout it was given, by descriptor; whatever the imports print goes
    # to its log (stderr) instead, and nothing sits in a buffer a child would inherit.
    replies = os.dup(1)
    os.dup2(2, 1)
    environ = dict(os.environ)
    preload(tuple(args.preload))
    return Server(requests=0, replies=replies, environ=environ).serve()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
