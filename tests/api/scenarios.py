"""Scenarios on the whole product: `python -m api`, the local backend, real pods; a job and
views on what its pods reported, and the invariants of DESIGN.md that every scenario checks."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import psutil

from api.models import FINISHED_STATUSES
from tests.api.control_plane import ControlPlane
from tests.factories import tiny_spec
from tests.support import wait_for

MODES = ["live", "restart"]


def spec(mode: str, **overrides: Any) -> dict[str, Any]:
    return tiny_spec(**{"replicas": 3, "epochs": 12, "max_eval_samples": 100,
                        "checkpoint_every_steps": 5, "fault_tolerance": mode, **overrides})


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
            if all(sum(s["pod"] == self.pod(o) and s["participants"] == participants
                       for s in steps) >= count for o in pods):
                return True
            status = self.plane.job(self.id)["status"]
            assert status not in FINISHED_STATUSES, (
                f"the job ended ({status}) before {what}; {tally(steps)}")
            return False
        # Each look reads the job's new steps over HTTP: a few a second keep the API's and this
        # process's share of the two cores small beside the pods'.
        wait_for(enough, timeout=120, what=what, interval=0.2)

    def wait_rejoined(self, ordinals: tuple[int, ...], after: float) -> None:
        """The recreated pods take part in steps again, and every pod has reported such a step.

        A pod reports in order, so the survivors' records of the steps before it (those a
        recreated pod healed past instead of committing, when a heal attempt failed) have
        arrived too: a later SIGKILL, which loses a pod's last second of records, cannot lose
        the only record of a committed step. (The step's metric can arrive a post before its
        sample ids: the window of the step a recreated pod healed into is its to report too.)"""
        self.wait_steps(1, after, 3, ordinals, f"pods {ordinals} to train with the others")
        self.wait_steps(1, after, 3, (0, 1, 2), "every pod to report a step with all three")

    def finish(self, after_epoch: int | None = None, early: bool = True) -> dict[str, Any]:
        """The job, once it succeeded. `early`: asked first to finish after `after_epoch` (none:
        the epoch under way), as a user does once the scenario has played out: the epochs are
        sized for a loaded machine, and what they would run on after it checks nothing new."""
        if early:
            self.ask_to_finish(after_epoch)
        job = self.plane.wait_status(self.id, "succeeded", "failed", timeout=300)
        assert job["status"] == "succeeded", job["reason"]
        agreed = {r["epoch"] for r in self.reports("finishing")}
        assert len(agreed) <= 1, agreed  # every participant settled on the same epoch
        if agreed:  # none, where the job ended before its pods heard
            assert max(s["epoch"] for s in self.steps()) == agreed.pop() == job["progress"][
                "epochs"]
        return job

    def ask_to_finish(self, after_epoch: int | None = None) -> None:
        asked = self.plane.http.post(f"/api/v1/jobs/{self.id}/finish",
                                     json={"after_epoch": after_epoch})
        assert asked.status_code == 202 or "already succeeded" in asked.text, asked.text


def finish_together(*jobs: Job) -> list[dict[str, Any]]:
    """Jobs compared step for step, finished after the same epoch: the one after the latest any
    of them is in, so that none is past it when its pods agree."""
    progress = [job.plane.job(job.id)["progress"] for job in jobs]
    after = min(max(p["epoch"] for p in progress) + 1, min(p["epochs"] for p in progress))
    for job in jobs:
        job.ask_to_finish(after)
    return [job.finish(early=False) for job in jobs]


def tally(steps: list[dict[str, Any]]) -> str:
    """How a job got on over these committed steps, for a failure's message."""
    if not steps:
        return "no step was reported since"
    per_pod = Counter((s["pod"], s["participants"]) for s in steps)
    counts = ", ".join(f"{pod} {n} with {k}" for (pod, k), n in sorted(per_pod.items()))
    numbers = [s["step"] for s in steps]
    return (f"steps {min(numbers)} to {max(numbers)} since, reports per pod and "
            f"participants: {counts}")


def power_cut(pids: list[int], known: Iterable[psutil.Process] = ()) -> None:
    """Every process of these pods stops at once, then all are SIGKILLed, as in a power cut:
    each pod's first process and every descendant, such as the workers that restart-mode pods
    fork into sessions of their own (which would otherwise run on for the moment their parents
    take to die, long enough to finish a checkpoint's write). `known`: these pods' processes
    found beforehand (`pods_processes`), stopped first: finding them reads every process's
    parent, which on a loaded machine takes long enough for a write to end."""
    stopped: dict[int, psutil.Process] = {}
    found = {p.pid: p for p in known}
    while found:
        for process in found.values():  # a stopped process starts no other
            with contextlib.suppress(psutil.NoSuchProcess):
                process.suspend()
        stopped |= found
        found = {p.pid: p for p in pods_processes(pids) if p.pid not in stopped}
    for process in stopped.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def pods_processes(pids: list[int]) -> list[psutil.Process]:
    """These pods' first processes and their descendants."""
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            pod = psutil.Process(pid)
            found += [pod, *pod.children(recursive=True)]
    return found


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_identical_replicas(job: Job, pods: int = 3) -> None:
    checksums = {r["pod"]: r["checksum"] for r in job.reports("completed")}
    assert sorted(checksums) == [job.pod(o) for o in range(pods)]
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
        assert used == Counter(range(train_size)), uncovered(samples, epoch, used, train_size)


def uncovered(samples: list[dict[str, Any]], epoch: int, used: Counter[int],
              train_size: int) -> str:
    """What an epoch's windows got wrong: the samples missing or doubled, and the steps
    (with the pods that reported them) whose windows hold a doubled one or border a gap."""
    missing = sorted(set(range(train_size)) - set(used))
    doubled = sorted(i for i, count in used.items() if count > 1)
    steps: dict[int, set[str]] = {}
    for record in samples:
        if record["epoch"] == epoch:
            steps.setdefault(record["step"], set()).add(f"{record['pod']}/r{record['rank']}")
    cursors = {r["step"]: (r["cursor"], len(r["window"])) for r in samples
               if r["epoch"] == epoch}
    suspects = sorted({r["step"] for r in samples if r["epoch"] == epoch
                       and set(r["window"]) & set(doubled)})
    return (f"epoch {epoch}: {len(missing)} samples missing, {len(doubled)} doubled; "
            f"steps with doubled samples {[(s, cursors[s], sorted(steps[s])) for s in suspects]}; "
            f"the epoch's steps (cursor, window) {sorted(cursors.items())}")


def assert_no_step_computed_twice(job: Job, stages: int = 1) -> None:
    """Each step was committed by one quorum: all its reports name the same number of
    participants, and there are no more reports than participants (times a pipeline's stages:
    each stage pod of a replica reports). (A pod's two incarnations both take part in the
    steps of a migration's overlap; a killed pod has not reported the step it committed last,
    which its peers may have failed and redone, and may have lost the reports of its last
    second.)"""
    reports: dict[int, list[int]] = {}
    for step in job.steps():
        reports.setdefault(step["step"], []).append(step["participants"])
    twice = [(step, counts) for step, counts in sorted(reports.items())
             if len(set(counts)) > 1 or len(counts) > counts[0] * stages]
    assert not twice, twice[:5]
