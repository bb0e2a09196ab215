"""The supervisor process on its own (commands, its lock, SIGTERM, the restart budget, adopting
a dead supervisor's pods), and the report sink and process helpers that the backend tests
share."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.backends.base import BackendError
from api.backends.local.backend import LocalBackend
from api.backends.local.jobdir import same_process, write_json_atomic
from tests.conftest import ROOT
from tests.factories import make_reviews_csv, tiny_spec
from tests.support import PEER_SECRET, ReportServer, wait_for

SPEC = tiny_spec(epochs=2, checkpoint_every_steps=5)


def recorded_processes(job_dir: Path) -> list[tuple[int, float, bool]]:
    """(pid, create time, is a pod group) of the supervisor and pods listed in state.json."""
    try:
        state = json.loads((job_dir / "state.json").read_text())
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


def write_job(job_dir: Path, inputs_dir: Path, sink: ReportServer, max_restarts: int = 5,
              restart_backoff: float = 1.0, replicas: int = 1, **spec: Any) -> None:
    for sub in ("logs", "commands"):
        (job_dir / sub).mkdir(parents=True)
    write_json_atomic(job_dir / "launch.json", {
        "max_restarts": max_restarts, "restart_backoff": restart_backoff,
        "job_id": job_dir.name, "pods": replicas, "fault_tolerance": "restart",
        "spec": {**SPEC, "replicas": replicas, **spec}, "report_url": sink.url,
        "report_token": "t", "peer_secret": PEER_SECRET,
        "checkpoint_dir": str(job_dir / "checkpoints"), "model_dir": str(job_dir / "model"),
        "inputs_dir": str(inputs_dir), "cache_dir": str(job_dir / "cache")})


class Supervisors:
    """Supervisor processes a test started; teardown stops them and every pod they recorded."""

    def __init__(self, jobs_dir: Path) -> None:
        self.jobs_dir = jobs_dir
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, job_dir: Path, *args: str) -> subprocess.Popen[bytes]:
        with (job_dir / "supervisor.log").open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "api.backends.local.supervisor", str(job_dir), *args],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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
        document: dict[str, Any] = json.loads((job_dir / "state.json").read_text())
    except FileNotFoundError:
        return {}
    return document


def pod_phase(job_dir: Path) -> str | None:
    pods = state(job_dir).get("pods") or [{}]
    phase: str | None = pods[0].get("phase")
    return phase


@pytest.mark.slow
def test_commands_lock_and_sigterm(tmp_path: Path, inputs_dir: Path, sink: ReportServer,
                                   supervisors: Supervisors) -> None:
    job_dir = tmp_path / "jobs" / "job-sup"
    write_job(job_dir, inputs_dir, sink, epochs=20, checkpoint_every_steps=1000)
    process = supervisors.start(job_dir)
    wait_for(lambda: pod_phase(job_dir) == "Running", what="pod 0 to run")
    second = subprocess.run([sys.executable, "-m", "api.backends.local.supervisor", str(job_dir)],
                            cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert second.returncode == 1
    assert "another supervisor already runs" in second.stderr

    commands = job_dir / "commands"
    write_json_atomic(commands / "1-a.json", {"op": "kill", "ordinal": 7})
    write_json_atomic(commands / "2-b.json", {"op": "kill", "ordinal": 0, "grace_seconds": "x"})
    (commands / "3-c.json").write_text("not json")
    write_json_atomic(commands / "4-d.json", {"op": "reboot"})
    log = job_dir / "supervisor.log"

    def ignored_lines() -> list[str]:
        return [line for line in log.read_text().splitlines() if "command ignored: " in line]

    # The bad grace, the JSON error, the unknown op; the unknown ordinal is logged first.
    ignored = wait_for(lambda: len(found := ignored_lines()) == 3 and found,
                       what="the commands to run")
    assert "kill: no running pod with ordinal 7; ignored" in log.read_text()
    assert "grace_seconds" in ignored[0] and "Invalid JSON" in ignored[1]
    assert "does not match any of the expected tags: 'kill', 'delete'" in ignored[2]
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
def test_restart_budget_spent(tmp_path: Path, inputs_dir: Path, sink: ReportServer,
                              supervisors: Supervisors) -> None:
    job_dir = tmp_path / "jobs" / "job-budget"
    write_job(job_dir, inputs_dir, sink, max_restarts=0)
    process = supervisors.start(job_dir)
    wait_for(lambda: pod_phase(job_dir) == "Running", what="pod 0 to run")
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
                                                     sink: ReportServer,
                                                     supervisors: Supervisors) -> None:
    job_dir = tmp_path / "jobs" / "job-backoff"
    write_job(job_dir, inputs_dir, sink, restart_backoff=3.0, epochs=20,
              checkpoint_every_steps=1000)
    supervisors.start(job_dir)
    wait_for(lambda: pod_phase(job_dir) == "Running", what="pod 0 to run")
    killed_at = time.time()
    write_json_atomic(job_dir / "commands" / "1-a.json",
                      {"op": "kill", "ordinal": 0, "grace_seconds": 0})
    pod = wait_for(lambda: (p := state(job_dir)["pods"][0])["restarts"] == 1 and p,
                   what="pod 0 to be recreated")
    assert pod["started_at"] - killed_at >= 3.0


@pytest.mark.slow
def test_an_adopting_supervisor_keeps_live_pods_and_recreates_dead_ones(
        tmp_path: Path, inputs_dir: Path, sink: ReportServer, supervisors: Supervisors) -> None:
    make_reviews_csv(inputs_dir / "reviews.csv", rows=400)
    job_dir = tmp_path / "jobs" / "job-adopt"
    # Pod 0 resumes at once (the store is told that pod 1 ended) and may finish before pod 1 is
    # back (the adopting supervisor starts its fork server first): pod 1 then finds the
    # rendezvous closed and the model exported, and ends with 0 as its peer did.
    write_job(job_dir, inputs_dir, sink, replicas=2, epochs=3, checkpoint_every_steps=1000)
    first = supervisors.start(job_dir)
    wait_for(lambda: len(sink.records("job-adopt-0", "metric")) >= 3, what="three steps")
    left = state(job_dir)
    first.kill()
    first.wait(timeout=10)
    # Pod 1 dies while no supervisor watches it.
    os.killpg(left["pods"][1]["pid"], signal.SIGKILL)
    wait_for(lambda: same_process(left["pods"][1]["pid"], left["pods"][1]["pid_started"])
             is None, what="pod 1 to die")
    log = job_dir / "logs" / "job-adopt-0.log"
    size = log.stat().st_size

    second = supervisors.start(job_dir, "--adopt")
    adopted = wait_for(lambda: (s := state(job_dir))["adoptions"] == 1
                       and s["pods"][1]["restarts"] == 1 and s, what="pod 1 to be recreated")
    assert adopted["supervisor_pid"] == second.pid
    assert (adopted["pods"][0]["pid"], adopted["pods"][0]["restarts"]) == (
        left["pods"][0]["pid"], 0)
    assert adopted["coordinator"] == left["coordinator"]  # the same store, on the same port
    wait_for(lambda: log.stat().st_size > size, what="the adopted pod to go on logging")

    # The adopted pod's exit status cannot be known: it succeeded since the model is exported.
    assert second.wait(timeout=180) == 0
    final = state(job_dir)
    assert (final["finished"], final["reason"]) == (True, None)
    assert [(p["phase"], p["restarts"], p["exit_code"]) for p in final["pods"]] == [
        ("Succeeded", 0, None), ("Succeeded", 1, 0)]
    assert (job_dir / "model" / "config.json").is_file()
    assert "job-adopt-1 exited with code unknown: Failed" in (
        job_dir / "supervisor.log").read_text()


def test_adopting_needs_a_state_to_adopt(tmp_path: Path, inputs_dir: Path,
                                         sink: ReportServer) -> None:
    job_dir = tmp_path / "jobs" / "job-none"
    write_job(job_dir, inputs_dir, sink)
    adopter = subprocess.run([sys.executable, "-m", "api.backends.local.supervisor", str(job_dir),
                              "--adopt"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert adopter.returncode == 1
    assert "nothing to adopt" in adopter.stderr
    assert not (job_dir / "state.json").exists()
