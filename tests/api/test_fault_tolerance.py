"""Kill scenarios on the whole product: `python -m api`, the local backend, real pods, SIGKILLs.

Every scenario runs in both fault-tolerance modes and checks the invariants of DESIGN.md: the
job succeeds, replicas end identical, every training sample is used once per epoch, and no
committed step is computed twice unless every pod died at once.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from api.backends.local import SUPERVISOR_RESTARTS
from api.backends.local_jobdir import same_process
from tests.api.control_plane import ControlPlane
from tests.conftest import Processes
from tests.factories import make_reviews_csv, make_tiny_model
from tests.support import wait_for
from trainer.checkpoint import MARKER, latest_checkpoint

pytestmark = pytest.mark.slow

MODES = ["live", "restart"]


@pytest.fixture
def plane(tmp_path: Path, inputs_dir: Path, processes: Processes) -> Iterator[ControlPlane]:
    """The control plane; its pods report the sample ids of every committed step.

    Killed pods come back after 6 s: a live pod rejoins within about 5 s of its start, and a
    kill that lands between a pod's quorum request and its group set-up stalls the survivors
    for the 5 s collective timeout, which could otherwise outlast the whole outage."""
    make_reviews_csv(inputs_dir / "reviews.csv", rows=2400)
    control = ControlPlane(processes, tmp_path / "data", inputs_dir,
                           env={"LOG_SAMPLE_IDS": "true", "MIGRATOR_RESTART_BUDGET": "10",
                                "MIGRATOR_RESTART_BACKOFF": "6"})
    control.start()
    yield control
    control.close()


def spec(mode: str, **overrides: Any) -> dict[str, Any]:
    return {"model": "tiny", "dataset": "reviews.csv", "replicas": 3, "epochs": 12,
            "batch_size": 8, "learning_rate": 0.003, "max_eval_samples": 100,
            "checkpoint_every_steps": 5, "fault_tolerance": mode, **overrides}


class Job:
    """One job of the control plane, with views on what its pods reported."""

    def __init__(self, plane: ControlPlane, body: dict[str, Any]) -> None:
        self.plane = plane
        created = plane.http.post("/api/v1/jobs", json=body)
        assert created.status_code == 201, created.text
        self.id: str = created.json()["id"]

    def pod(self, ordinal: int) -> str:
        return f"{self.id}-{ordinal}"

    def steps(self, after: float = 0.0) -> list[dict[str, Any]]:
        """Committed-step metrics (pod, step, participants), reported after `after`."""
        return [e["data"] | {"time": e["time"]} for e in self.plane.events(self.id, "metric")
                if e["data"]["kind"] == "metric" and e["time"] > after]

    def reports(self, kind: str, after: float = 0.0) -> list[dict[str, Any]]:
        """The trainers' lifecycle events of one type (`healed`, `primary`, ...)."""
        return [e["data"] | {"time": e["time"]} for e in self.plane.events(self.id, "job")
                if e["data"].get("type") == kind and e["time"] > after]

    def kill(self, *ordinals: int) -> float:
        """Kill pods through the API (SIGKILL, grace 0); returns when the last one was dead."""
        pids = [self.plane.state(self.id)["pods"][o]["pid"] for o in ordinals]
        for ordinal in ordinals:
            response = self.plane.http.post(f"/api/v1/jobs/{self.id}/pods/{ordinal}/kill",
                                            json={"grace_seconds": 0})
            assert response.status_code == 202, response.text
        wait_for(lambda: not any(alive(pid) for pid in pids),
                 timeout=30, what=f"pods {ordinals} to die")
        return time.time()

    def wait_steps(self, count: int, after: float, participants: int,
                   pods: tuple[int, ...], what: str) -> None:
        def enough() -> bool:
            steps = self.steps(after)
            return all(sum(s["pod"] == self.pod(o) and s["participants"] == participants
                           for s in steps) >= count for o in pods)
        wait_for(enough, timeout=120, what=what)

    def wait_rejoined(self, ordinals: tuple[int, ...], after: float) -> None:
        """The recreated pods take part in steps again, and every pod has reported such a step.

        A pod reports in order, so the survivors' records of the steps before it (those a
        recreated pod healed past instead of committing, when a heal attempt failed) have
        arrived too: a later SIGKILL, which loses a pod's last second of records, cannot lose
        the only record of a committed step."""
        self.wait_steps(1, after, 3, ordinals, f"pods {ordinals} to train with the others")
        self.wait_steps(1, after, 3, (0, 1, 2), "every pod to report a step with all three")

    def finish(self) -> dict[str, Any]:
        job = self.plane.wait_status(self.id, "succeeded", "failed", timeout=300)
        assert job["status"] == "succeeded", job["reason"]
        return job


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_identical_replicas(job: Job) -> None:
    checksums = {r["pod"]: r["checksum"] for r in job.reports("completed")}
    assert sorted(checksums) == [job.pod(o) for o in range(3)]
    assert len(set(checksums.values())) == 1, checksums


def assert_exactly_once(job: Job) -> None:
    """Per epoch, the windows of the committed steps cover the training split exactly once,
    every participant trained only inside its step's window, and all agree on each window."""
    samples = [e["data"] for e in job.plane.events(job.id, "samples")]
    assert samples
    windows: dict[tuple[int, int], list[int]] = {}
    for record in samples:
        key = (record["epoch"], record["step"])
        assert windows.setdefault(key, record["window"]) == record["window"], key
        assert set(record["ids"]) <= set(record["window"])
    train_size = job.reports("started")[0]["samples"]["train"]
    epochs = sorted({epoch for epoch, _ in windows})
    assert epochs == list(range(1, epochs[-1] + 1))
    for epoch in epochs:
        used = Counter(i for (e, _), window in windows.items() if e == epoch for i in window)
        assert used == Counter(range(train_size)), f"epoch {epoch}"


def assert_no_step_computed_twice(job: Job) -> None:
    counts = Counter((s["pod"], s["step"]) for s in job.steps())
    assert max(counts.values()) == 1, [key for key, n in counts.items() if n > 1][:5]


@pytest.mark.parametrize("mode", MODES)
def test_primary_killed_then_two_of_three(plane: ControlPlane, mode: str) -> None:
    live = mode == "live"
    # Long enough that pod 0, training alone at three times the steps per epoch, does not
    # finish before the recreated pods 1 and 2 start (6 s of back-off plus up to 15 s of
    # start-up on a loaded machine) and rejoin.
    job = Job(plane, spec(mode, epochs=20))
    wait_for(lambda: len(job.steps()) >= 30, timeout=180, what="training with three pods")

    killed_at = job.kill(0)
    if live:
        # The survivors keep committing steps without pod 0, and one of them takes over as
        # the primary: it reports so and writes the checkpoints.
        job.wait_steps(3, killed_at, 2, (1, 2), "pods 1 and 2 to train without pod 0")
        new_primary = wait_for(lambda: job.reports("primary", killed_at),
                               timeout=60, what="a new primary")
        assert new_primary[0]["pod"] in (job.pod(1), job.pod(2))
        wait_for(lambda: [e for e in plane.events(job.id, "checkpoint")
                          if e["time"] > killed_at and e["data"]["pod"] != job.pod(0)],
                 timeout=60, what="a checkpoint written by the new primary")
    # In restart mode every worker restarts in a new rendezvous round, usually joined by the
    # recreated pod already; either way a primary of the new world takes over.
    job.wait_rejoined((0,), killed_at)
    assert job.reports("primary", killed_at)
    assert [p["restarts"] for p in plane.job(job.id)["pods"]] == [1, 0, 0]  # only pod 0's

    killed_at = job.kill(1, 2)
    if live:
        job.wait_steps(3, killed_at, 1, (0,), "pod 0 to train alone")
    job.wait_rejoined((1, 2), killed_at)

    finished = job.finish()
    assert [p["restarts"] for p in finished["pods"]] == [1, 1, 1]
    statuses = [e["data"].get("status") for e in plane.events(job.id, "job")]
    assert "degraded" in statuses
    if live:  # recreated pods fetched the weights from a live peer
        healed = job.reports("healed")
        assert {h["target"] for h in healed} >= {job.pod(0), job.pod(1), job.pod(2)}
        assert all(h["bytes"] > 0 and h["source"] != h["target"] for h in healed)
    else:  # survivors restarted from the emergency checkpoint of their last committed step
        assert [e for e in plane.events(job.id, "checkpoint") if e["data"]["emergency"]]
    kills = [e["data"] for e in plane.events(job.id, "pod") if e["data"].get("action") == "kill"]
    assert sorted(k["ordinal"] for k in kills) == [0, 1, 2]
    assert_identical_replicas(job)
    assert_exactly_once(job)
    assert_no_step_computed_twice(job)


@pytest.mark.parametrize("mode", MODES)
def test_coordinator_killed_then_every_pod_during_a_checkpoint_write(
        plane: ControlPlane, mode: str, tmp_path: Path) -> None:
    # Wide embeddings make each checkpoint big enough (~45 MB) to be caught half-written.
    make_tiny_model(plane.inputs_dir / "wide", vocab_size=60_000)
    job = Job(plane, spec(mode, model="wide", epochs=6, checkpoint_every_steps=25))
    wait_for(lambda: len(job.steps()) >= 30, timeout=180, what="training with three pods")

    coordinator = plane.state(job.id)["coordinator"]
    os.killpg(coordinator["pid"], signal.SIGKILL)
    wait_for(lambda: plane.state(job.id)["coordinator"]["restarts"] == 1,
             timeout=30, what=f"the {coordinator['name']} to be restarted")
    restarted_at = time.time()
    wait_for(lambda: len(job.steps(restarted_at)) >= 3,
             timeout=120, what="training to go on after it")

    checkpoints = plane.data_dir / "jobs" / job.id / "checkpoints"
    wait_for(lambda: latest_checkpoint(checkpoints), timeout=120, what="a complete checkpoint")

    def writing() -> os.DirEntry[str] | None:
        return next((entry for entry in os.scandir(checkpoints) if ".tmp" in entry.name), None)

    staging = wait_for(writing, timeout=120, what="a checkpoint write", interval=0.002)
    for pod in plane.state(job.id)["pods"]:
        os.killpg(pod["pid"], signal.SIGKILL)
    killed_at = time.time()
    half_written = int(staging.name.split(".")[0].removeprefix("step-"))
    assert not (checkpoints / f"step-{half_written}" / MARKER).exists()  # killed mid-write
    complete = latest_checkpoint(checkpoints)
    assert complete is not None and complete.step < half_written

    finished = job.finish()
    # Every pod was recreated and training resumed from the newest complete checkpoint, never
    # from the half-written one (later restarts may resume from newer checkpoints).
    resumed = job.reports("resumed", killed_at)
    assert min(r["step"] for r in resumed) == complete.step
    assert {r["pod"] for r in resumed} == {job.pod(o) for o in range(3)}
    assert all(p["restarts"] >= 1 for p in finished["pods"])
    assert not list(checkpoints.glob("*.tmp*"))
    assert_identical_replicas(job)


def test_a_killed_supervisor_is_replaced_and_its_pods_train_on(plane: ControlPlane) -> None:
    job = Job(plane, spec("live", replicas=2, epochs=10))
    wait_for(lambda: len(job.steps()) >= 10, timeout=180, what="training with two pods")
    left = plane.state(job.id)
    os.kill(left["supervisor_pid"], signal.SIGKILL)

    # The control plane starts a supervisor that adopts the running pods and lighthouse, as a
    # restarted kubelet re-adopts its containers: nothing is restarted.
    adopted = wait_for(lambda: (s := plane.state(job.id)).get("adoptions") == 1 and s,
                       timeout=30, what="a new supervisor to adopt the pods")
    assert adopted["supervisor_pid"] != left["supervisor_pid"]
    assert [(p["pid"], p["restarts"]) for p in adopted["pods"]] == [
        (p["pid"], 0) for p in left["pods"]]
    assert adopted["coordinator"] == left["coordinator"]
    adopted_at = time.time()
    job.wait_steps(3, adopted_at, 2, (0, 1), "both pods to train on")
    assert plane.job(job.id)["status"] == "running"

    # An adopted pod that is killed is recreated as usual.
    killed_at = job.kill(1)
    job.wait_steps(1, killed_at, 2, (1,), "pod 1 to train with pod 0 again")
    finished = job.finish()
    assert [p["restarts"] for p in finished["pods"]] == [0, 1]
    assert plane.state(job.id)["pods"][0]["pid"] == left["pods"][0]["pid"]
    statuses = [e["data"].get("status") for e in plane.events(job.id, "job")]
    assert "failed" not in statuses


def test_a_pod_stopped_with_a_grace_leaves_gracefully_and_is_recreated(
        plane: ControlPlane) -> None:
    """SIGTERM (what an eviction or a drain sends): the pod leaves at a step boundary instead of
    dying, so nothing fails and no restart is counted; the recreated pod heals and rejoins."""
    job = Job(plane, spec("live"))
    wait_for(lambda: len(job.steps()) >= 30, timeout=180, what="training with three pods")
    response = plane.http.post(f"/api/v1/jobs/{job.id}/pods/2/kill", json={"grace_seconds": 30})
    assert response.status_code == 202, response.text
    stopped_at = time.time()
    left = wait_for(lambda: job.reports("left", stopped_at), timeout=60, what="pod 2 to leave")
    assert left[0]["pod"] == job.pod(2)
    job.wait_steps(3, stopped_at, 2, (0, 1), "pods 0 and 1 to train without pod 2")
    job.wait_rejoined((2,), stopped_at)

    finished = job.finish()
    assert [p["restarts"] for p in finished["pods"]] == [0, 0, 0]
    phases = [(e["data"]["ordinal"], e["data"]["phase"]) for e in plane.events(job.id, "pod")
              if "phase" in e["data"]]
    assert (2, "Running") in phases  # the pod events carry phases (from the start on)
    assert not [p for p in phases if p[1] == "Failed"], phases
    healed = [h for h in job.reports("healed", stopped_at) if h["target"] == job.pod(2)]
    assert healed and healed[0]["step"] >= left[0]["step"]
    assert_identical_replicas(job)
    assert_exactly_once(job)
    assert_no_step_computed_twice(job)


def test_a_supervisor_that_keeps_dying_fails_the_job_with_no_pod_left(
        plane: ControlPlane) -> None:
    job = Job(plane, spec("restart", replicas=2))
    wait_for(lambda: len(job.steps()) >= 5, timeout=180, what="training with two pods")
    listed: set[tuple[int, float]] = set()
    for death in range(SUPERVISOR_RESTARTS + 1):
        state = plane.state(job.id)
        listed |= {(p["pid"], p["pid_started"]) for p in [*state["pods"], state["coordinator"]]}
        os.kill(state["supervisor_pid"], signal.SIGKILL)
        if death < SUPERVISOR_RESTARTS:
            wait_for(lambda n=death + 1: plane.state(job.id).get("adoptions") == n,
                     timeout=30, what=f"supervisor {death + 2} to adopt the pods")
    assert len(listed) == 3  # the same two pods and store throughout

    failed = plane.wait_status(job.id, "failed", "succeeded", timeout=60)
    assert [pid for pid, started in listed if same_process(pid, started)] == []
    assert failed["status"] == "failed"
    assert failed["reason"].startswith("the job's supervisor (pid ")
    assert failed["reason"].endswith(f"replaced {SUPERVISOR_RESTARTS} times already (the most "
                                     "allowed); every pod was stopped")
