"""What tests of every package share: polling with a deadline, free ports, and a stand-in for
the API's report endpoint."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

from api.backends.base import Backend, WorkloadStatus

T = TypeVar("T")

PEER_SECRET = "the-peer-secret"
"""The peer secret of the jobs that tests start by hand (trainer.contract.credentials)."""


class ThrowawayServer:
    """A server a session fixture starts on a free port and stops by pid (tests/postgres.py,
    tests/stores.py): `start` runs the subclass's `_start` and, should that fail half-way,
    stops whatever it had started before raising."""

    def start(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class Starter(Protocol):
    """tests.conftest.Processes: starts a process that is killed at teardown."""

    def start(self, args: list[str], env: dict[str, str], log: Path) -> Any: ...


def wait_for(condition: Callable[[], T], *, what: str = "condition", timeout: float = 60.0,
             interval: float = 0.05, process: subprocess.Popen[Any] | None = None) -> T:
    """Poll `condition` until it returns something true, and return that; fail at the deadline,
    or as soon as `process` (when given) exits."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert process is None or process.poll() is None, f"the process exited before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)
    return value


def observed(backend: Backend, job_id: str) -> WorkloadStatus:
    """The job's status after one reconcile step: what a control-plane pass sees."""
    backend.reconcile(job_id)
    return backend.status(job_id)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


def not_private(root: Path) -> list[str]:
    """What under `root`, itself included, a group or other users may read, write or enter, as
    `mode path` lines (links left out: their own mode means nothing; what vanishes meanwhile,
    too)."""
    found = []
    for directory, _, files in os.walk(root):
        for path in (Path(directory), *(Path(directory) / name for name in files)):
            try:
                mode = path.lstat().st_mode
            except FileNotFoundError:
                continue
            if not path.is_symlink() and mode & 0o077:
                found.append(f"{oct(mode & 0o777)} {path}")
    return found


def accepts(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on `host:port`."""
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return False
    return True


def start_lighthouse(processes: Starter, log: Path, replicas: int, secret: str = PEER_SECRET,
                     host: str = "127.0.0.1", **flags: int) -> str:
    """A job's lighthouse process, started as the backends start it (`flags` override its
    `--name value` options), on a free port of `host`, for a job of `replicas` (its first
    quorum waits for them) whose peer secret is `secret`; its address once it listens."""
    from api.backends.programs import Endpoint, lighthouse_argv
    from trainer.contract.credentials import SECRET_ENV

    port = free_port(host)
    argv = lighthouse_argv(host, port, replicas, python=sys.executable)
    for name, value in flags.items():
        argv[argv.index(f"--{name}") + 1] = str(value)
    processes.start(argv, {SECRET_ENV: secret}, log)
    wait_for(lambda: accepts(port, host), what="the lighthouse to listen", timeout=30)
    return f"http://{Endpoint(host, port)}"


class ReportServer:
    """A real HTTP server on 127.0.0.1 in place of the API's report endpoint: it keeps every
    batch it accepts and answers `status`; while `release` is clear, requests wait."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.batches: list[dict[str, Any]] = []
        self.headers: list[str] = []
        self.status = 200
        self.release = threading.Event()
        self.release.set()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1/jobs/job/reports"

    def start(self) -> ReportServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                owner.release.wait(30)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                owner.headers.append(self.headers.get("Authorization", ""))
                if owner.status == 200:
                    owner.batches.append(body)
                self.send_response(owner.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def records(self, pod: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """Records as the API would store them (duplicates of retried batches dropped by
        (pod, incarnation, seq)), in arrival order; of one pod and kind when given."""
        seen, unique = set(), []
        for batch in list(self.batches):
            if pod is not None and batch["pod"] != pod:
                continue
            for record in batch["records"]:
                key = (batch["pod"], batch["incarnation"], record["seq"])
                if key not in seen and (kind is None or record["kind"] == kind):
                    seen.add(key)
                    unique.append(record)
        return unique

    def incarnations(self, pod: str) -> set[str]:
        return {batch["incarnation"] for batch in self.batches if batch["pod"] == pod}
