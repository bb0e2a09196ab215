"""LocalBackend with real supervisors and real trainer pods (tiny model, tiny dataset)."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import signal
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from api.backends.base import BackendError, Launch, WorkloadNotFound, WorkloadStatus
from api.backends.local.backend import LocalBackend
from api.backends.local.jobdir import JobDir, same_process
from tests.api.backends.test_supervisor import SPEC, kill_everything, recorded_processes
from tests.conftest import ROOT
from tests.factories import make_reviews_csv
from tests.support import PEER_SECRET, ReportServer, observed, wait_for
from trainer.checkpoint import MARKER
from trainer.contract.spec import JobSpec


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Iterator[Path]:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    yield jobs
    kill_everything(jobs)


@pytest.fixture
def backend(jobs_dir: Path) -> LocalBackend:
    return LocalBackend(jobs_dir)


@pytest.fixture
def make_launch(jobs_dir: Path, inputs_dir: Path, sink: ReportServer,
                tmp_path: Path) -> Callable[..., Launch]:
    def build(job_id: str, replicas: int = 2, **spec: Any) -> Launch:
        job_dir = jobs_dir / job_id
        return Launch(job_id=job_id, pods=replicas, fault_tolerance="restart",
                      spec=JobSpec(**{**SPEC, "replicas": replicas, **spec}), report_url=sink.url,
                      report_token="secret-token", checkpoint_dir=job_dir / "checkpoints",
                      model_dir=job_dir / "model", inputs_dir=inputs_dir,
                      cache_dir=tmp_path / "cache", peer_secret=PEER_SECRET)

    return build


def wait_finished(backend: LocalBackend, job_id: str, timeout: float = 60.0) -> WorkloadStatus:
    status: WorkloadStatus = wait_for(
        lambda: (s := observed(backend, job_id)).finished and not s.present and s,
        what=f"{job_id} to finish", timeout=timeout)
    return status


def assert_no_processes(job_dir: Path) -> None:
    recorded = recorded_processes(job_dir)
    assert recorded
    # The supervisor may still be between writing its last state and exiting.
    wait_for(lambda: all(same_process(pid, started) is None for pid, started, _ in recorded),
             what="every recorded process to be gone", timeout=15)


@pytest.mark.slow
def test_two_pods_run_to_completion(backend: LocalBackend, make_launch: Callable[..., Launch],
                                    jobs_dir: Path, sink: ReportServer) -> None:
    backend.launch(make_launch("job-ok"))
    launch_file = jobs_dir / "job-ok" / "launch.json"
    assert stat.S_IMODE(launch_file.stat().st_mode) == 0o600
    assert json.loads(launch_file.read_text())["report_token"] == "secret-token"
    assert observed(backend, "job-ok").present
    assert backend.active_jobs() == ["job-ok"]

    status = wait_finished(backend, "job-ok")
    assert status.reason is None
    assert [(p.name, p.phase, p.restarts, p.exit_code) for p in status.pods] == [
        ("job-ok-0", "Succeeded", 0, 0), ("job-ok-1", "Succeeded", 0, 0)]
    assert (jobs_dir / "job-ok" / "model" / "config.json").is_file()
    assert_no_processes(jobs_dir / "job-ok")
    assert backend.active_jobs() == []
    # One worker per pod, started by its torchrun agent in the pod's first incarnation.
    for pod in ("job-ok-0", "job-ok-1"):
        assert [i.split("-")[0] for i in sink.incarnations(pod)] == ["0"]
    ranks = {line.split("joined process group: ")[1] for ordinal in (0, 1)
             for line in backend.tail_logs("job-ok", ordinal, 200)
             if "joined process group: " in line}
    assert ranks == {"rank 0 of 2 (gloo)", "rank 1 of 2 (gloo)"}


@pytest.mark.slow
def test_sigkilled_pod_is_recreated_alone_and_the_survivor_restarts_its_worker(
        backend: LocalBackend, make_launch: Callable[..., Launch], jobs_dir: Path,
        inputs_dir: Path, sink: ReportServer) -> None:
    make_reviews_csv(inputs_dir / "reviews.csv", rows=2000)
    # Far more epochs than the test waits for: however fast this machine trains, the job is
    # still running when pod 0's warm worker has loaded and when the new round has stepped.
    # The job is deleted at the end (test_fault_tolerance runs a restart-mode kill to the end).
    backend.launch(make_launch("job-kill", epochs=100, checkpoint_every_steps=100_000))
    wait_for(lambda: len(sink.records("job-kill-0", "metric")) >= 5, what="five steps")
    # Pod 0's agent keeps a warm worker for its next round once this one has settled.
    wait_for(lambda: any("waiting to become a pod" in line
                         for line in backend.tail_logs("job-kill", 0, 500)),
             what="pod 0's warm worker to be loaded", timeout=90)
    survivor = recorded_processes(jobs_dir / "job-kill")[1][0]
    backend.kill_pod("job-kill", 1, grace_seconds=0)

    restarted = wait_for(lambda: (s := observed(backend, "job-kill")).pods[1].restarts == 1 and s,
                         what="pod 1 to be recreated", timeout=30)
    assert restarted.present and not restarted.finished
    # The new round steps on both pods: pod 1's second incarnation reports steps.
    wait_for(lambda: any(b["pod"] == "job-kill-1" and b["incarnation"].split("-")[0] == "1"
                         and any(r["kind"] == "metric" for r in b["records"])
                         for b in list(sink.batches)),
             what="pod 1's new incarnation to step", timeout=90)
    assert recorded_processes(jobs_dir / "job-kill")[1][0] == survivor  # pod 0 was not touched
    # Pod 0's agent restarted its worker (peer lost, then peer back) from the emergency
    # checkpoint of its last committed step: no step was lost or done twice.
    assert len(sink.incarnations("job-kill-0")) >= 2
    steps = sorted(r["data"]["step"] for r in sink.records("job-kill-0", "metric"))
    assert steps == list(range(1, steps[-1] + 1))
    emergency = [r for r in sink.records("job-kill-0", "checkpoint") if r["data"]["emergency"]]
    assert emergency
    # The round after the kill started from the warm worker, not a fresh Python.
    assert any("becomes pod job-kill-0" in line for line in backend.tail_logs("job-kill", 0, 2000))

    backend.delete("job-kill")
    wait_finished(backend, "job-kill", timeout=60)
    assert_no_processes(jobs_dir / "job-kill")
    assert not [p for p in psutil.process_iter(["cmdline"])
                if "--die-with-parent" in (p.info["cmdline"] or [])
                and str(jobs_dir) in " ".join(p.info["cmdline"] or [])
                ], "a warm worker outlived its pod"


def listening(pid: int) -> list[tuple[str, int]]:
    """The listening sockets of a process and its descendants (a pod, a coordinator).

    An IPv4-mapped address counts as its IPv4 one: gRPC (the lighthouse) binds 127.0.0.1 with
    an IPv6 socket on ::ffff:127.0.0.1, which takes connections to 127.0.0.1 only."""
    root = psutil.Process(pid)
    return [(ipv4(c.laddr.ip), c.laddr.port)
            for process in (root, *root.children(recursive=True))
            for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]


def ipv4(ip: str) -> str:
    mapped = getattr(ipaddress.ip_address(ip), "ipv4_mapped", None)
    return str(mapped) if mapped is not None else ip


def http_status(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10):
            return 200
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["live", "restart"])
def test_every_process_of_a_job_listens_on_the_pod_address_only(
        mode: str, backend: LocalBackend, make_launch: Callable[..., Launch], jobs_dir: Path,
        sink: ReportServer) -> None:
    job = f"job-net-{mode}"
    launch = dataclasses.replace(make_launch(job, epochs=50, fault_tolerance=mode),
                                 fault_tolerance=mode, peer_secret="the-peer-secret")
    backend.launch(launch)
    wait_for(lambda: all(sink.records(f"{job}-{o}", "metric") for o in (0, 1)),
             what="both pods to train")
    state = json.loads(JobDir(jobs_dir / job).state.read_text())
    sockets = {pod["name"]: listening(pod["pid"]) for pod in state["pods"]}
    sockets[state["coordinator"]["name"]] = listening(state["coordinator"]["pid"])
    # Local pods' address is 127.0.0.1: nothing listens on a wildcard (0.0.0.0, ::) or beyond.
    assert {ip for found in sockets.values() for ip, _ in found} == {"127.0.0.1"}, sockets
    env = psutil.Process(state["pods"][0]["pid"]).environ()
    assert (env["POD_ADDRESS"], env["PEER_SECRET"]) == ("127.0.0.1", "the-peer-secret")
    # The coordinator tells members from strangers with the job's secret, which is in its
    # environment (readable by its user only), never in its command line.
    coordinator = psutil.Process(state["coordinator"]["pid"])
    assert coordinator.environ()["PEER_SECRET"] == "the-peer-secret"
    assert "the-peer-secret" not in " ".join(coordinator.cmdline())
    if mode == "live":
        # Per pod: manager server, heal server, process group store, gloo (the replica
        # group's store, which only the pod's process uses, is in memory).
        assert [len(sockets[f"{job}-{o}"]) for o in (0, 1)] == [4, 4], sockets
        heal_url = next(line.split("heal server listening on ")[1].strip()
                        for line in backend.tail_logs(job, 0, 100_000)
                        if "heal server listening on " in line)
        # Whatever the step, nobody without the job's secret gets past the door.
        assert http_status(f"{heal_url}0/full", {}) == 403
        assert http_status(f"{heal_url}0/full", {"Authorization": "Bearer another-job"}) == 403
    else:
        # Rank 0 hosts the workers' store besides its gloo listener; the rendezvous store.
        assert sorted(len(sockets[f"{job}-{o}"]) for o in (0, 1)) == [1, 2], sockets
        assert len(sockets["store"]) == 1
    backend.delete(job)
    assert_no_processes(jobs_dir / job)


@pytest.mark.slow
def test_bad_input_finishes_without_restarts(backend: LocalBackend,
                                             make_launch: Callable[..., Launch],
                                             jobs_dir: Path) -> None:
    backend.launch(make_launch("job-bad", replicas=1, dataset="missing.csv"))
    status = wait_finished(backend, "job-bad")
    assert status.reason is not None
    assert status.reason.startswith("pod job-bad-0 failed: bad input: dataset 'missing.csv': ")
    assert [(p.phase, p.restarts, p.exit_code) for p in status.pods] == [("Failed", 0, 2)]
    assert_no_processes(jobs_dir / "job-bad")


@pytest.mark.slow
def test_delete_mid_training_stops_everything_and_keeps_checkpoints(
        make_launch: Callable[..., Launch], jobs_dir: Path, inputs_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Spawned pods: /proc/<pid>/environ shows what a process started with, which for a fork
    # is its fork server's (tests/api/backends/test_forking.py checks what a fork is given).
    backend = LocalBackend(jobs_dir, fork_pods=False)
    make_reviews_csv(inputs_dir / "reviews.csv", rows=400)
    monkeypatch.setenv("MIGRATOR_ADMIN_TOKEN", "the-admin-token")
    monkeypatch.setenv("HF_TOKEN", "the-hub-token")  # for initializers alone
    backend.launch(make_launch("job-del", epochs=5))
    checkpoints = jobs_dir / "job-del" / "checkpoints"
    wait_for(lambda: (checkpoints / "step-5" / MARKER).exists(), what="the step-5 checkpoint")
    pods = [psutil.Process(pod["pid"]) for pod in
            json.loads((jobs_dir / "job-del" / "state.json").read_text())["pods"]]
    env = [pod.environ() for pod in pods]
    assert [(e["POD_NAME"], e["POD_INCARNATION"]) for e in env] == [
        ("job-del-0", "0"), ("job-del-1", "0")]
    assert env[0]["REPORT_TOKEN"] == "secret-token"
    store = psutil.Process(json.loads((jobs_dir / "job-del" / "state.json").read_text())[
        "coordinator"]["pid"])
    assert not any("MIGRATOR_ADMIN_TOKEN" in e or "HF_TOKEN" in e
                   for e in [*env, store.environ()])
    # Each pod is a torchrun agent whose worker joined one elastic world of two (beside it,
    # once the round has run 5 s, its warm worker; pids wrap, so not always the older one).
    workers = [next(child.environ() for child in pod.children()
                    if "trainer.standby" not in child.cmdline()) for pod in pods]
    assert sorted((w["RANK"], w["WORLD_SIZE"]) for w in workers) == [("0", "2"), ("1", "2")]
    assert workers[0]["MASTER_PORT"] == workers[1]["MASTER_PORT"]

    backend.delete("job-del")
    status = observed(backend, "job-del")
    assert (status.present, status.finished, status.reason) == (False, True, "deleted")
    assert_no_processes(jobs_dir / "job-del")
    assert list(checkpoints.glob(f"step-*/{MARKER}"))
    assert backend.tail_logs("job-del", 0, 5)
    backend.delete("job-del")  # idempotent
    assert backend.active_jobs() == []
    with pytest.raises(WorkloadNotFound):
        backend.kill_pod("job-del", 0, 0)


@pytest.mark.slow
@pytest.mark.parametrize("fate", ["dead", "hung"])
def test_delete_kills_the_pods_of_a_dead_or_hung_supervisor(
        fate: str, make_launch: Callable[..., Launch], jobs_dir: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    backend = LocalBackend(jobs_dir, delete_timeout=0.5)
    backend.launch(make_launch("job-orphans", replicas=1, epochs=20))
    wait_for(lambda: observed(backend, "job-orphans").pods[0].phase == "Running",
             what="pod 0 to run")
    supervisor_pid, started, _ = recorded_processes(jobs_dir / "job-orphans")[0]
    os.kill(supervisor_pid, signal.SIGKILL if fate == "dead" else signal.SIGSTOP)
    if fate == "dead":  # and not replaced: nothing observed the job in between
        wait_for(lambda: same_process(supervisor_pid, started) is None,
                 what="the supervisor to die")
    assert not backend.gone("job-orphans")  # its pod still runs, and may write
    with caplog.at_level("WARNING", logger="api.backends.local.watchdog"):
        backend.delete("job-orphans")
    assert "pod job-orphans-0 left behind: SIGKILL" in caplog.text
    assert ("supervisor did not stop" in caplog.text) == (fate == "hung")
    assert_no_processes(jobs_dir / "job-orphans")
    assert backend.gone("job-orphans")


def kill_supervisor(job_dir: Path) -> dict[str, Any]:
    """SIGKILL the job's supervisor; returns the state it left once it is gone."""
    state: dict[str, Any] = json.loads((job_dir / "state.json").read_text())
    pid, started = state["supervisor_pid"], state["supervisor_started"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: same_process(pid, started) is None, what="the supervisor to die", timeout=10)
    return state


@pytest.mark.slow
def test_a_killed_supervisor_is_replaced_by_one_that_adopts_the_pods(
        backend: LocalBackend, make_launch: Callable[..., Launch], jobs_dir: Path) -> None:
    backend.launch(make_launch("job-heal", epochs=50, checkpoint_every_steps=1000))
    job_dir = jobs_dir / "job-heal"
    wait_for(lambda: [p.phase for p in observed(backend, "job-heal").pods] == ["Running"] * 2,
             what="both pods to run")
    left = kill_supervisor(job_dir)

    # Observing it acts on nothing: the supervisor is dead and stays so until a reconcile.
    assert not backend.status("job-heal").present
    assert backend.active_jobs() == []
    assert json.loads((job_dir / "state.json").read_text()) == left
    assert observed(backend, "job-heal").present  # the reconcile starts the new supervisor
    adopted = wait_for(lambda: (s := json.loads((job_dir / "state.json").read_text()))
                       ["adoptions"] == 1 and s, what="a supervisor to adopt the pods")
    assert adopted["supervisor_pid"] != left["supervisor_pid"]
    assert [(p["pid"], p["restarts"]) for p in adopted["pods"]] == [
        (p["pid"], 0) for p in left["pods"]]
    assert adopted["coordinator"] == left["coordinator"]
    assert backend.active_jobs() == ["job-heal"]

    # An adopted pod is killed and recreated like any other, and a delete stops everything.
    backend.kill_pod("job-heal", 1, grace_seconds=0)
    recreated = wait_for(lambda: (s := observed(backend, "job-heal")).pods[1].restarts == 1 and s,
                         what="pod 1 to be recreated", timeout=30)
    assert (recreated.present, recreated.pods[0].restarts) == (True, 0)
    assert recorded_processes(job_dir)[1][0] == left["pods"][0]["pid"]
    backend.delete("job-heal")
    assert observed(backend, "job-heal").reason == "deleted"
    assert_no_processes(job_dir)
    assert all(same_process(p["pid"], p["pid_started"]) is None for p in left["pods"])


@pytest.mark.slow
@pytest.mark.parametrize("why", ["state", "launch", "budget"])
def test_pods_are_killed_before_a_dead_supervisor_that_cannot_be_replaced_fails_the_job(
        why: str, jobs_dir: Path, make_launch: Callable[..., Launch]) -> None:
    backend = LocalBackend(jobs_dir, supervisor_restarts=0 if why == "budget" else 3)
    backend.launch(make_launch("job-lost", epochs=50))
    job_dir = jobs_dir / "job-lost"
    wait_for(lambda: [p.phase for p in observed(backend, "job-lost").pods] == ["Running"] * 2,
             what="both pods to run")
    left = kill_supervisor(job_dir)
    listed = [(p["pid"], p["pid_started"]) for p in [*left["pods"], left["coordinator"]]]
    if why == "state":  # the backend read it before: it knows what to stop
        (job_dir / "state.json").write_text("{")
    elif why == "launch":
        (job_dir / "launch.json").write_text("{")

    status = observed(backend, "job-lost")
    assert all(same_process(pid, started) is None for pid, started in listed)
    assert (status.present, status.finished) == (False, True)
    assert status.reason is not None
    assert status.reason.endswith("every pod it last listed was stopped" if why == "state"
                                  else "every pod was stopped")
    assert {"state": "its state is unreadable (invalid state.json: ",
            "launch": "cannot be replaced (invalid launch.json: ",
            "budget": "is not replaced again: replaced 0 times already"}[why] in status.reason
    assert [p.phase for p in status.pods] == ["Failed", "Failed"]
    backend.delete("job-lost")  # nothing is left to stop, and the reason stays
    assert observed(backend, "job-lost").reason == status.reason


LAUNCH_FROM_CHILD = """
import json, sys
from pathlib import Path
from api.backends.local import backend as local
from api.backends.base import Launch
from api.backends.local.backend import LocalBackend
from trainer.contract.spec import JobSpec
doc = json.loads(sys.argv[2])
paths = {k: Path(doc[k]) for k in ("checkpoint_dir", "model_dir", "inputs_dir", "cache_dir")}
LocalBackend(Path(sys.argv[1])).launch(Launch(**{**doc, **paths,
                                                 "spec": JobSpec.model_validate(doc["spec"])}))
"""


@pytest.mark.slow
def test_supervisor_outlives_its_launcher_and_is_re_adopted(
        make_launch: Callable[..., Launch], jobs_dir: Path, sink: ReportServer) -> None:
    launch = make_launch("job-adopt", replicas=1, epochs=20, checkpoint_every_steps=1000)
    document = {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(launch).items()},
                "spec": launch.spec.model_dump(mode="json")}
    launcher = subprocess.run([sys.executable, "-c", LAUNCH_FROM_CHILD, str(jobs_dir),
                               json.dumps(document)], cwd=ROOT, timeout=60, check=True)
    assert launcher.returncode == 0  # the launching process is gone

    adopter = LocalBackend(jobs_dir)
    assert adopter.active_jobs() == ["job-adopt"]
    running = wait_for(lambda: (s := observed(adopter, "job-adopt")).pods[0].phase == "Running"
                       and s, what="pod 0 to run")
    assert running.present
    supervisor_pid = recorded_processes(jobs_dir / "job-adopt")[0][0]
    assert os.getsid(supervisor_pid) == supervisor_pid  # its own session: no terminal signals
    wait_for(lambda: sink.records("job-adopt-0", "metric"), what="the first training step")

    # A graceful kill: the worker checkpoints on SIGTERM and the agent exits 0 (it was asked to
    # leave); the pod is recreated as a new incarnation, with no failure and no restart counted.
    adopter.kill_pod("job-adopt", 0, grace_seconds=5)
    restarted = wait_for(lambda: (s := observed(adopter, "job-adopt")).pods[0].incarnation == "1"
                         and s.pods[0].phase == "Running" and s, what="pod 0 to be recreated",
                         timeout=30)
    assert (restarted.pods[0].exit_code, restarted.pods[0].restarts) == (0, 0)
    assert [r["data"]["type"] for r in sink.records("job-adopt-0", "event")
            if r["data"]["type"] == "sigterm"] == ["sigterm"]
    LocalBackend(jobs_dir).delete("job-adopt")
    assert observed(adopter, "job-adopt").reason == "deleted"
    assert_no_processes(jobs_dir / "job-adopt")


def fake_live_job(jobs_dir: Path, job_id: str, replicas: int = 2,
                  started: float | None = None) -> Path:
    """A job dir whose recorded supervisor is this test process (alive, never reused)."""
    job_dir = jobs_dir / job_id
    (job_dir / "commands").mkdir(parents=True)
    (job_dir / "launch.json").write_text(json.dumps({"job_id": job_id, "pods": replicas}))
    me = psutil.Process()
    pods = [{"ordinal": i, "name": f"{job_id}-{i}", "pid": None, "pid_started": None,
             "phase": "Pending", "restarts": 0, "started_at": None, "exit_code": None}
            for i in range(replicas)]
    (job_dir / "state.json").write_text(json.dumps({
        "supervisor_pid": me.pid, "supervisor_started": started or me.create_time(),
        "finished": False, "reason": None, "pods": pods}))
    return job_dir


@pytest.fixture
def fake_jobs(tmp_path: Path) -> Path:
    """Outside jobs_dir: its finalizer must never treat this test process as a supervisor."""
    return tmp_path / "fake-jobs"


def test_unknown_jobs_and_ordinals_are_not_found(fake_jobs: Path) -> None:
    backend, jobs_dir = LocalBackend(fake_jobs), fake_jobs
    assert observed(backend, "nope") == WorkloadStatus(present=False)
    assert backend.tail_logs("nope", 0, 10) == []
    backend.delete("nope")
    with pytest.raises(WorkloadNotFound):
        backend.kill_pod("nope", 0, 0)
    job_dir = fake_live_job(jobs_dir, "job-live")
    with pytest.raises(WorkloadNotFound):
        backend.kill_pod("job-live", 2, 0)
    with pytest.raises(WorkloadNotFound):
        backend.kill_pod("job-live", -1, 0)
    backend.kill_pod("job-live", 1, 3)
    [command] = (job_dir / "commands").glob("*.json")
    assert json.loads(command.read_text()) == {"op": "kill", "ordinal": 1, "grace_seconds": 3.0}
    assert backend.active_jobs() == ["job-live"]
    with pytest.raises(BackendError):
        backend.launch(Launch("job-live", 1, "restart", {}, "http://127.0.0.1:9/", "t",
                              jobs_dir, jobs_dir, jobs_dir, jobs_dir))


def test_a_reused_pid_is_not_a_live_supervisor(fake_jobs: Path) -> None:
    backend, jobs_dir = LocalBackend(fake_jobs), fake_jobs
    job_dir = fake_live_job(jobs_dir, "job-stale",
                            started=psutil.Process().create_time() - 3600)
    # Observing acts on nothing: the dead supervisor is neither replaced nor given up on.
    left = (job_dir / "state.json").read_text()
    seen = backend.status("job-stale")
    assert (seen.present, seen.finished, seen.reason) == (False, False, None)
    assert (job_dir / "state.json").read_text() == left
    status = observed(backend, "job-stale")
    # Dead, then: the job is finished, as this fake job's supervisor cannot be replaced.
    assert (status.present, status.finished) == (False, True)
    assert status.reason is not None
    assert status.reason.startswith(f"the job's supervisor (pid {os.getpid()}) died and cannot "
                                    "be replaced (invalid launch.json: ")
    assert [p.phase for p in status.pods] == ["Pending", "Pending"]
    assert backend.active_jobs() == []
    with pytest.raises(WorkloadNotFound):
        backend.kill_pod("job-stale", 0, 0)
    backend.delete("job-stale")  # kills nothing: the recorded process is not that supervisor


@pytest.mark.parametrize("job_id", ["../jobs", "a/b", "/etc", "Job-1", "", ".", "..", "a b",
                                    "job\n"])
def test_path_like_job_ids_are_rejected(backend: LocalBackend, job_id: str) -> None:
    for call in (lambda: observed(backend, job_id), lambda: backend.kill_pod(job_id, 0, 0),
                 lambda: backend.delete(job_id), lambda: backend.tail_logs(job_id, 0, 5),
                 lambda: backend.gone(job_id)):
        with pytest.raises(WorkloadNotFound):
            call()


def test_tail_logs_reads_only_the_end(backend: LocalBackend, jobs_dir: Path) -> None:
    logs = jobs_dir / "job-log" / "logs"
    logs.mkdir(parents=True)
    (logs / "job-log-0.log").write_text("".join(f"line {i}\n" for i in range(200_000)))
    assert backend.tail_logs("job-log", 0, 3) == ["line 199997", "line 199998", "line 199999"]
    assert backend.tail_logs("job-log", 0, 0) == []
    assert backend.tail_logs("job-log", 1, 3) == []
