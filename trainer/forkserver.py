"""A fork server: one interpreter that has imported what trainer processes import (torch,
transformers, the trainer) and forks them from that state, so a process starts in a fraction
of a second of CPU instead of seconds of imports.

    python -m trainer.forkserver [--preload MODULE ...]

A local supervisor keeps one per job for its pods, standby and coordinator
(api/backends/local/forking.py); a restart-mode pod's agent forks one of its own for its
rounds' workers (trainer.fault_tolerance.elastic). Its environment is its children's without
their identity.
It speaks JSON lines, requests on its stdin, replies on its stdout (trainer.forkclient is the
other end):

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
import os
import runpy
import select
import signal
import sys
import traceback
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

PRELOAD = ("torch", "transformers", "transformers.models.bert.modeling_bert", "pandas",
           "tokenizers", "trainer.main", "trainer.prepare", "trainer.standby",
           "trainer.fault_tolerance.live", "trainer.fault_tolerance.elastic")
"""What trainer processes import; a job's own extras come from `--preload`."""

IMPORT_TIME_PREFIXES = ("HF_", "TRANSFORMERS_", "TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_",
                        "PYTORCH_", "OMP_", "MKL_", "KMP_", "PYTHON", "LD_", "MALLOC_",
                        "TOKENIZERS_")
"""Variables read when a library or the interpreter loads: a child whose values differ needs a
fresh interpreter. (CUDA's and NCCL's are read when they initialise, in the child.)"""
READ_LATER = ("OMP_NUM_THREADS", "TORCH_NCCL_", "TOKENIZERS_PARALLELISM",
              "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
"""Of those, what is read again or only later: the thread count (set again in the child),
torch's NCCL options (read when a process group is created), which torchrun sets per worker,
the tokenizers library's parallelism (read each time it tokenizes; transformers' pipelines
set it in a running process, so a parent's environment may gain it after its fork server
started), and whether torchrun's workers share its rendezvous store (read as it rendezvouses;
restart-mode pods set it)."""

REAP_SECONDS = 0.05
"""How often children that ended are looked for while no request comes."""


def differences(server: Mapping[str, str], child: Mapping[str, str]) -> list[str]:
    """What keeps a child with environment `child` from computing the same forked from a
    server with `server` as started afresh: the names of the variables read at import whose
    values differ."""
    def read_at_import(environ: Mapping[str, str]) -> dict[str, str]:
        return {k: v for k, v in environ.items()
                if k.startswith(IMPORT_TIME_PREFIXES) and not k.startswith(READ_LATER)}
    ours, theirs = read_at_import(server), read_at_import(child)
    return sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))


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
                settle(read_end, log_fd, cwd, {read_end, log_fd, write_end, self.requests,
                                               self.replies, *self.pipes.values()})
                run_child(argv, env, self.environ, self.set_by_imports)
            finally:
                os._exit(1)  # run_child exits itself; this only if even that failed
        if log_fd >= 0:
            os.close(log_fd)
        os.close(read_end)
        if stdin:
            self.pipes[pid] = write_end
        return pid


def settle(stdin: int, log: int, cwd: str, close: Iterable[int]) -> None:
    """In a forked child: a session of its own, `stdin` as its standard input, `log` (where
    not -1) as its standard output and error, the descriptors in `close` closed, `cwd` its
    directory."""
    os.setsid()
    os.dup2(stdin, 0)
    if log >= 0:
        os.dup2(log, 1)
        os.dup2(log, 2)
    for fd in set(close) - {-1, 0, 1, 2}:
        os.close(fd)
    os.chdir(cwd)


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
