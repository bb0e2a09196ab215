"""Failure-invariant training: the demo job undisturbed, and again with failures and membership
changes, same seed; what each disturbed run computed against the undisturbed one.

The demo job (MiniLM, Rotten Tomatoes, 2,000 training samples, 2 pods, a fixed global batch of
32 in 2 shards), for 2 epochs (126 steps: room for every disturbance), through the real control
plane and the local backend, in each mode asked for:

    undisturbed; 5 SIGKILLs (pods 1, 0, 1, 0, 1, each after the last one's pod took part again);
    scale 2 -> 3 -> 1 -> 2; a migration of each pod; a SIGTERM (pod 1, 30 s grace); all of them,
    one after the other.

Each disturbance comes when the job's pods have committed a given step. Per disturbed run: the
largest difference between a step's loss and the undisturbed run's (every pod's report of every
step; the steps must be the same ones), the largest difference between its final weights and
the undisturbed run's (model.safetensors), the test accuracy's difference in points, and its
wall time (creation to success) over the undisturbed run's. Goals: 0, 0, 0.0. With more than
one mode, each mode's undisturbed run is also compared with the first mode's: the mode of
fault tolerance changes nothing either.

    PYTHONPATH=. .venv/bin/python -m bench.invariance [--modes live,restart]
        [--runs kills,scale,migrate,sigterm,all] [--samples 2000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import torch
from safetensors.torch import load_file

from api.cli.demo import DEMO_SPEC
from bench.control_plane import events, serve, wait

Act = Callable[["Job"], None]


@dataclass
class Outcome:
    run: str
    losses: dict[int, set[float]]
    """Every step's losses, as the pods reported them."""
    weights: dict[str, torch.Tensor]
    accuracy: float
    seconds: float


class Job:
    def __init__(self, http: httpx.Client, spec: dict[str, Any]) -> None:
        self.http = http
        created = http.post("/api/v1/jobs", json=spec)
        created.raise_for_status()
        self.id: str = created.json()["id"]
        self.created = time.monotonic()

    def step(self) -> int:
        """The last step any pod committed."""
        metrics = [e["data"]["step"] for e in events(self.http, self.id, "metric")
                   if e["data"].get("kind") == "metric"]
        return max(metrics, default=0)

    def at_step(self, step: int) -> None:
        wait(lambda: self.step() >= step, 600, f"step {step}")

    def reports(self, kind: str, after: float) -> list[dict[str, Any]]:
        return [e["data"] | {"time": e["time"]} for e in events(self.http, self.id, "job")
                if e["data"].get("type") == kind and e["time"] > after]

    def kill(self, ordinal: int, grace: float = 0) -> None:
        """Kill a pod through the API and wait for its next incarnation to take part."""
        called = time.time()
        self.http.post(f"/api/v1/jobs/{self.id}/pods/{ordinal}/kill",
                       json={"grace_seconds": grace}).raise_for_status()
        self.taken_part(ordinal, called)

    def taken_part(self, ordinal: int, after: float) -> None:
        wait(lambda: [j for j in self.reports("joined", after)
                      if j["pod"] == f"{self.id}-{ordinal}"], 300, f"pod {ordinal} to take part")

    def scale(self, replicas: int) -> None:
        self.http.patch(f"/api/v1/jobs/{self.id}", json={"replicas": replicas}
                        ).raise_for_status()

    def migrate(self, ordinal: int) -> None:
        called = time.time()
        self.http.post(f"/api/v1/jobs/{self.id}/pods/{ordinal}/migrate").raise_for_status()
        wait(lambda: self.reports("migrated", called), 300, f"pod {ordinal}'s migration")

    def outcome(self, run: str, data_dir: Path) -> Outcome:
        job = wait(lambda: (j := self.http.get(f"/api/v1/jobs/{self.id}").json())["status"] in (
            "succeeded", "failed", "cancelled") and j, 1800, "the job to end")
        if job["status"] != "succeeded":
            raise SystemExit(f"{run}: the job {job['status']}: {job.get('reason')}")
        seconds = time.monotonic() - self.created
        losses: dict[int, set[float]] = {}
        for e in events(self.http, self.id, "metric"):
            if e["data"].get("kind") == "metric":
                losses.setdefault(e["data"]["step"], set()).add(e["data"]["loss"])
        weights = next(data_dir.rglob(f"{self.id}/**/model.safetensors"))
        return Outcome(run, losses, load_file(weights), job["metrics"]["test_accuracy"],
                       seconds)


def kills(job: Job, steps: tuple[int, ...] = (8, 24, 40, 56, 72)) -> None:
    for step, ordinal in zip(steps, (1, 0, 1, 0, 1), strict=True):
        job.at_step(step)
        job.kill(ordinal)


def scales(job: Job, steps: tuple[int, ...] = (10, 35, 60)) -> None:
    for step, replicas in zip(steps, (3, 1, 2), strict=True):
        job.at_step(step)
        called = time.time()
        job.scale(replicas)
    job.taken_part(1, called)


def migrations(job: Job, steps: tuple[int, ...] = (10, 40)) -> None:
    for step, ordinal in zip(steps, (0, 1), strict=True):
        job.at_step(step)
        job.migrate(ordinal)


def sigterm(job: Job, step: int = 15) -> None:
    job.at_step(step)
    job.kill(1, grace=30)


def everything(job: Job) -> None:
    kills(job, (5, 15, 25, 35, 45))
    scales(job, (55, 65, 75))
    migrations(job, (85, 95))
    sigterm(job, 105)


RUNS: dict[str, Act] = {"kills": kills, "scale": scales, "migrate": migrations,
                        "sigterm": sigterm, "all": everything}


def compare(base: Outcome, other: Outcome) -> str:
    if sorted(other.losses) != sorted(base.losses):
        return f"| {other.run} | different steps ({len(other.losses)} vs {len(base.losses)}) |"
    loss = max(abs(value - ref) for step, values in other.losses.items()
               for value in values for ref in base.losses[step])
    spread = max(len(values) for values in other.losses.values())
    weight = max(float((other.weights[name] - tensor).abs().max())
                 for name, tensor in base.weights.items())
    return (f"| {other.run} | {loss:.3g} | {weight:.3g} | "
            f"{100 * (other.accuracy - base.accuracy):+.1f} | {other.seconds / base.seconds:.2f} "
            f"| {'one value' if spread == 1 else f'{spread} values'} |")


def run_mode(http: httpx.Client, data_dir: Path, mode: str, runs: list[str],
             samples: int) -> list[Outcome]:
    spec = {**DEMO_SPEC, "fault_tolerance": mode, "max_train_samples": samples,
            "max_replicas": 3, "epochs": 2}
    outcomes = []
    for name, act in [("undisturbed", None), *((run, RUNS[run]) for run in runs)]:
        job = Job(http, spec)
        try:
            if act is not None:
                act(job)
            outcomes.append(job.outcome(name, data_dir))
        finally:
            http.post(f"/api/v1/jobs/{job.id}/cancel")
        base = outcomes[0]
        print(f"  {mode}: {name}: {len(outcomes[-1].losses)} steps, test accuracy "
              f"{outcomes[-1].accuracy:.4f}, {outcomes[-1].seconds:.1f} s"
              + (f"; {compare(base, outcomes[-1])}" if act is not None else ""), flush=True)
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="live")
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--samples", type=int, default=DEMO_SPEC["max_train_samples"])
    parser.add_argument("--data-dir", type=Path, help="keep jobs, logs and database here")
    args = parser.parse_args()
    with serve(args.data_dir) as (http, data_dir):
        undisturbed: Outcome | None = None
        for mode in args.modes.split(","):
            outcomes = run_mode(http, data_dir, mode, args.runs.split(","), args.samples)
            rows = [compare(outcomes[0], other) for other in outcomes[1:]]
            if undisturbed is None:
                undisturbed = replace(outcomes[0], run=mode)
            else:
                rows.append(compare(undisturbed, replace(
                    outcomes[0], run=f"undisturbed, against {undisturbed.run}'s")))
            print(f"\n{mode}:\n| run | largest step-loss difference | largest weight "
                  "difference | test accuracy (points) | wall time / undisturbed | "
                  "pods' reports of a step |\n|---|---|---|---|---|---|")
            print("\n".join(rows))


if __name__ == "__main__":
    main()
