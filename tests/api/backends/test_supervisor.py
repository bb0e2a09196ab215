"""The supervisor process on its own (commands, its lock, SIGTERM, the restart budget), its file
helpers, and the report sink and process helpers that the backend tests share."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from api.backends.base import BackendError
from api.backends.local import (
    STATE_FILE,
    LocalBackend,
    same_process,
    tail_lines,
    write_json_atomic,
)
from tests.conftest import ROOT

SPEC: dict[str, Any] = {"model": "tiny", "dataset": "reviews.csv", "batch_size": 8,
                        "learning_rate": 0.003, "epochs": 2, "checkpoint_every_steps": 5}


class ReportSink:
    """Accepts the trainers' report posts (so their final flush never waits) and keeps them."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.bodies.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/reports"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def incarnations(self, pod: str) -> set[str]:
        return {b["incarnation"] for b in self.bodies if b["pod"] == pod}

    def records(self, pod: str, kind: str) -> list[dict[str, Any]]:
        return [r for b in list(self.bodies) if b["pod"] == pod for r in b["records"]
                if r["kind"] == kind]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sink() -> Iterator[ReportSink]:
    server = ReportSink()
    yield server
    server.close()


def recorded_processes(job_dir: Path) -> list[tuple[int, float, bool]]:
    """(pid, create time, is a pod group) of the supervisor and pods listed in state.json."""
    try:
        state = json.loads((job_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return []
    found = [(state["supervisor_pid"], state["supervisor_started"], False)]
    found += [(p["pid"], p["pid_started"], True) for p in state["pods"] if p["pid"]]
    coordinator = state.get("coordinator") or {}
    if coordinator.get("pid"):
        found.append((coordinator["pid"], coordinator["pid_started"], True))
    return found


def kill_everything(jobs_dir: Path) -> None:
    for job_dir in jobs_dir.glob("*"):
        with contextlib.suppress(BackendError):
            LocalBackend(jobs_dir).delete(job_dir.name)
        for pid, started, group in recorded_processes(job_dir):
            if pid != os.getpid() and same_process(pid, started) is not None:
                with contextlib.suppress(ProcessLookupError):
                    (os.killpg if group else os.kill)(pid, signal.SIGKILL)


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return result


def write_job(job_dir: Path, inputs_dir: Path, sink: ReportSink, max_restarts: int = 5,
              restart_backoff: float = 1.0, **spec: Any) -> None:
    for sub in ("logs", "commands"):
        (job_dir / sub).mkdir(parents=True)
    write_json_atomic(job_dir / "launch.json", {
        "max_restarts": max_restarts, "restart_backoff": restart_backoff,
        "job_id": job_dir.name, "replicas": 1, "fault_tolerance": "restart",
        "spec": {**SPEC, "replicas": 1, **spec}, "report_url": sink.url, "report_token": "t",
        "checkpoint_dir": str(job_dir / "checkpoints"), "model_dir": str(job_dir / "model"),
        "inputs_dir": str(inputs_dir), "cache_dir": str(job_dir / "cache")}, mode=0o600)


class Supervisors:
    """Supervisor processes a test started; teardown stops them and every pod they recorded."""

    def __init__(self, jobs_dir: Path) -> None:
        self.jobs_dir = jobs_dir
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, job_dir: Path) -> subprocess.Popen[bytes]:
        with (job_dir / "supervisor.log").open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "api.backends.supervisor", str(job_dir)], cwd=ROOT,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.started.append(process)
        return process

    def cleanup(self) -> None:
        kill_everything(self.jobs_dir)
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)


@pytest.fixture
def supervisors(tmp_path: Path) -> Iterator[Supervisors]:
    tracker = Supervisors(tmp_path / "jobs")
    yield tracker
    tracker.cleanup()


def state(job_dir: Path) -> dict[str, Any]:
    try:
        document: dict[str, Any] = json.loads((job_dir / STATE_FILE).read_text())
    except FileNotFoundError:
        return {}
    return document


def pod_phase(job_dir: Path) -> str | None:
    pods = state(job_dir).get("pods") or [{}]
    phase: str | None = pods[0].get("phase")
    return phase


@pytest.mark.slow
def test_commands_lock_and_sigterm(tmp_path: Path, inputs_dir: Path, sink: ReportSink,
                                   supervisors: Supervisors) -> None:
    job_dir = tmp_path / "jobs" / "job-sup"
    write_job(job_dir, inputs_dir, sink, epochs=20, checkpoint_every_steps=1000)
    process = supervisors.start(job_dir)
    wait_for(lambda: pod_phase(job_dir) == "Running", "pod 0 to run")
    second = subprocess.run([sys.executable, "-m", "api.backends.supervisor", str(job_dir)],
                            cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert second.returncode == 1
    assert "another supervisor already runs" in second.stderr

    commands = job_dir / "commands"
    write_json_atomic(commands / "1-a.json", {"op": "kill", "ordinal": 7})
    write_json_atomic(commands / "2-b.json", {"op": "kill", "ordinal": 0, "grace_seconds": "x"})
    (commands / "3-c.json").write_text("not json")
    write_json_atomic(commands / "4-d.json", {"op": "reboot"})
    log = job_dir / "supervisor.log"
    wait_for(lambda: "unknown command" in log.read_text(), "the commands to be handled")
    assert "kill: no running pod with ordinal 7; ignored" in log.read_text()
    assert log.read_text().count("ignored: ") == 2  # the bad grace and the JSON error
    assert not list(commands.iterdir())
    assert (state(job_dir)["pods"][0]["restarts"], pod_phase(job_dir)) == (0, "Running")

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    final = state(job_dir)
    assert (final["finished"], final["reason"]) == (True, "deleted")
    assert final["pods"][0]["phase"] == "Failed"
    assert all(same_process(pid, started) is None
               for pid, started, _ in recorded_processes(job_dir))


@pytest.mark.slow
def test_restart_budget_spent(tmp_path: Path, inputs_dir: Path, sink: ReportSink,
                              supervisors: Supervisors) -> None:
    job_dir = tmp_path / "jobs" / "job-budget"
    write_job(job_dir, inputs_dir, sink, max_restarts=0)
    process = supervisors.start(job_dir)
    wait_for(lambda: pod_phase(job_dir) == "Running", "pod 0 to run")
    write_json_atomic(job_dir / "commands" / "1-a.json",
                      {"op": "kill", "ordinal": 0, "grace_seconds": 0})
    assert process.wait(timeout=30) == 0
    final = state(job_dir)
    assert final["finished"]
    assert final["reason"] == ("restart budget spent: pod job-budget-0 restarted 0 times, last "
                               f"exit code {-signal.SIGKILL}")
    assert [(p["phase"], p["restarts"], p["exit_code"]) for p in final["pods"]] == [
        ("Failed", 0, -signal.SIGKILL)]


@pytest.mark.slow
def test_a_killed_pod_is_recreated_after_the_backoff(tmp_path: Path, inputs_dir: Path,
                                                     sink: ReportSink,
                                                     supervisors: Supervisors) -> None:
    job_dir = tmp_path / "jobs" / "job-backoff"
    write_job(job_dir, inputs_dir, sink, restart_backoff=3.0, epochs=20,
              checkpoint_every_steps=1000)
    supervisors.start(job_dir)
    wait_for(lambda: pod_phase(job_dir) == "Running", "pod 0 to run")
    killed_at = time.time()
    write_json_atomic(job_dir / "commands" / "1-a.json",
                      {"op": "kill", "ordinal": 0, "grace_seconds": 0})
    pod = wait_for(lambda: (p := state(job_dir)["pods"][0])["restarts"] == 1 and p,
                   "pod 0 to be recreated")
    assert pod["started_at"] - killed_at >= 3.0


def test_tail_lines_reads_a_bounded_tail(tmp_path: Path) -> None:
    path = tmp_path / "pod.log"
    path.write_text("a\n\nb\nc")
    assert tail_lines(path, 2) == ["b", "c"]
    assert tail_lines(path, 10) == ["a", "", "b", "c"]
    path.write_text("".join(f"{i:099d}\n" for i in range(100)))  # 100 lines of 100 bytes
    tail = tail_lines(path, 50, max_bytes=1000)
    assert 1 <= len(tail) <= 10
    assert tail[-1] == f"{99:099d}" and all(len(line) == 99 for line in tail)
    assert tail_lines(tmp_path / "missing.log", 5) == []


def test_write_json_atomic_sets_the_mode_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "launch.json"
    write_json_atomic(path, {"report_token": "secret"}, mode=0o600)
    write_json_atomic(path, {"report_token": "other"}, mode=0o600)
    assert json.loads(path.read_text()) == {"report_token": "other"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["launch.json"]
