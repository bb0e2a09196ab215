"""The local job directory's documents and file helpers, on literal files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import psutil
import pytest

from api.backends.base import Launch, Resources
from api.backends.local.jobdir import (
    DeleteCommand,
    JobDir,
    KillCommand,
    LaunchDocument,
    PodRecord,
    StateDocument,
    UnreadableDocument,
    pending_commands,
    read_command,
    read_launch,
    read_state,
    same_process,
    send_command,
    tail_lines,
    try_lock,
    write_json_atomic,
    write_launch,
    write_state,
)
from trainer.contract.spec import JobSpec

# state.json as the supervisor before the typed documents wrote it (commit 4ffa6c5), mid-job.
PREVIOUS_STATE = """{"supervisor_pid": 4242, "supervisor_started": 1754300000.12,
 "finished": false, "reason": null,
 "pods": [{"ordinal": 0, "name": "job-old-0", "pid": 4250, "pid_started": 1754300001.5,
           "phase": "Running", "restarts": 0, "started_at": 1754300001.52,
           "signalled_at": null, "exit_code": null},
          {"ordinal": 1, "name": "job-old-1", "pid": 4391, "pid_started": 1754300042.25,
           "phase": "Running", "restarts": 1, "started_at": 1754300042.27,
           "signalled_at": null, "exit_code": -9}],
 "coordinator": {"name": "lighthouse", "endpoint": "127.0.0.1:41234", "pid": 4243,
                 "pid_started": 1754300000.9, "restarts": 0}}"""

# launch.json as LocalBackend wrote it before `resources` existed.
PREVIOUS_LAUNCH = """{"job_id": "job-old", "replicas": 2, "fault_tolerance": "live",
 "spec": {"model": "tiny", "replicas": 2}, "report_url": "http://127.0.0.1:8000/r",
 "report_token": "secret", "checkpoint_dir": "/data/jobs/job-old/checkpoints",
 "model_dir": "/data/jobs/job-old/model", "inputs_dir": "/inputs", "cache_dir": "/cache",
 "heal_secret": "the-secret", "max_restarts": 5, "restart_backoff": 1.0}"""


@pytest.fixture
def job_dir(tmp_path: Path) -> JobDir:
    job = JobDir(tmp_path / "job-old")
    job.commands.mkdir(parents=True)
    return job


def test_a_state_written_by_the_previous_version_reads(job_dir: JobDir) -> None:
    job_dir.state.write_text(PREVIOUS_STATE)
    state = read_state(job_dir)
    assert state is not None
    assert (state.supervisor_pid, state.finished, state.reason) == (4242, False, None)
    assert [(p.name, p.pid, p.phase, p.restarts, p.exit_code) for p in state.pods] == [
        ("job-old-0", 4250, "Running", 0, None), ("job-old-1", 4391, "Running", 1, -9)]
    assert state.coordinator is not None
    assert (state.coordinator.endpoint, state.coordinator.pid) == ("127.0.0.1:41234", 4243)
    # What that version did not record: a job running, never adopted.
    assert (state.mode, state.final_reason, state.adoptions) == ("running", None, 0)
    assert state.listed_processes() == [("pod job-old-0", 4250, 1754300001.5),
                                        ("pod job-old-1", 4391, 1754300042.25),
                                        ("lighthouse", 4243, 1754300000.9)]


def test_the_state_round_trips(job_dir: JobDir) -> None:
    state = StateDocument(supervisor_pid=1, supervisor_started=2.0, pods=[
        PodRecord(ordinal=0, name="job-old-0", pid=3, pid_started=4.0, phase="Failed",
                  exit_code=None)], mode="finishing", final_reason="deleted", adoptions=2)
    write_state(job_dir, state)
    assert read_state(job_dir) == state
    assert read_state(JobDir(job_dir.path / "missing")) is None


@pytest.mark.parametrize("text", ["{", "[]", '{"pods": []}', '{"supervisor_pid": 1, '
                                  '"supervisor_started": 1, "pods": [{"ordinal": "x"}]}'])
def test_a_broken_state_is_unreadable(job_dir: JobDir, text: str) -> None:
    job_dir.state.write_text(text)
    with pytest.raises(UnreadableDocument, match=r"state\.json"):
        read_state(job_dir)


def test_a_launch_written_by_the_previous_version_reads(job_dir: JobDir) -> None:
    job_dir.launch.write_text(PREVIOUS_LAUNCH)
    document = read_launch(job_dir)
    assert document is not None
    assert document.launch == Launch(
        "job-old", 2, "live", JobSpec(model="tiny", replicas=2), "http://127.0.0.1:8000/r",
        "secret", Path("/data/jobs/job-old/checkpoints"), Path("/data/jobs/job-old/model"),
        Path("/inputs"), Path("/cache"), peer_secret="the-secret")
    assert (document.max_restarts, document.restart_backoff) == (5, 1.0)


def test_the_launch_round_trips_with_absolute_paths_and_a_private_mode(
        job_dir: JobDir, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(job_dir.path)
    launch = Launch("job-old", 3, "restart", JobSpec(epochs=1), "http://x/r", "secret",
                    Path("checkpoints"), Path("/m"), Path("/i"), Path("/c"),
                    resources=Resources(cpu="500m", gpus=1))
    write_launch(job_dir, LaunchDocument(launch, max_restarts=2, restart_backoff=0.5))
    assert stat.S_IMODE(job_dir.launch.stat().st_mode) == 0o600
    document = read_launch(job_dir)
    assert document is not None
    assert document.launch.checkpoint_dir == job_dir.path / "checkpoints"
    assert document.launch.resources == Resources(cpu="500m", gpus=1)
    assert (document.max_restarts, document.restart_backoff) == (2, 0.5)
    job_dir.launch.write_text(json.dumps({"job_id": "job-old", "replicas": 1}))
    with pytest.raises(UnreadableDocument, match=r"invalid launch\.json: launch\.fault_tolerance"):
        read_launch(job_dir)


def test_commands_are_read_in_order_and_checked(job_dir: JobDir) -> None:
    send_command(job_dir, KillCommand(ordinal=1, grace_seconds=2.5))
    send_command(job_dir, DeleteCommand())
    first, second = pending_commands(job_dir)
    assert json.loads(first.read_text()) == {"op": "kill", "ordinal": 1, "grace_seconds": 2.5}
    assert read_command(first) == KillCommand(ordinal=1, grace_seconds=2.5)
    assert read_command(second) == DeleteCommand()
    for bad in ({"op": "kill", "ordinal": 0, "grace_seconds": -1}, {"op": "kill"},
                {"op": "reboot"}, {"ordinal": 0}):
        write_json_atomic(job_dir.commands / "bad.json", bad)
        with pytest.raises(UnreadableDocument):
            read_command(job_dir.commands / "bad.json")


def test_the_lock_is_exclusive(job_dir: JobDir) -> None:
    held = try_lock(job_dir)
    assert held is not None
    try:
        assert try_lock(job_dir) is None
    finally:
        os.close(held)
    again = try_lock(job_dir)
    assert again is not None
    os.close(again)


def test_same_process_needs_the_start_time() -> None:
    me = psutil.Process()
    assert same_process(me.pid, me.create_time()) is not None
    assert same_process(me.pid, me.create_time() - 3600) is None
    assert same_process(me.pid, None) is None
    assert same_process(None, me.create_time()) is None


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


def test_write_json_atomic_is_private_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "launch.json"
    write_json_atomic(path, {"report_token": "secret"})  # whatever this process's umask
    write_json_atomic(path, {"report_token": "other"})
    assert json.loads(path.read_text()) == {"report_token": "other"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["launch.json"]
