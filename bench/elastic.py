"""Membership changes on purpose against the unplanned one: live against restart, one run.

One job per mode (MiniLM, Rotten Tomatoes, 3 pods, local backend, the real control plane), and
in it, one after the other, each operation through the API:

    scale 3 -> 2 (graceful leave), SIGTERM to pod 1 (a kill with a grace), migrate pod 1,
    migrate pod 0, scale 2 -> 3, SIGKILL pod 1 (the unplanned baseline).

Per operation, from the committed steps of a pod it leaves alone (pod 0; pod 1 while pod 0
migrates): its largest gap between consecutive commits from the API call until the operation
is over (and it has committed 3 steps with the new membership after it), divided by its median
step interval over the 20 steps before the call; the committed steps computed again (a step
number it reports again after a restart from a checkpoint); and the time from the API call to the
new pod's first committed step (its `joined` event), and from the new pod's start (its process,
or the warm standby handed its identity: state.json's `started_at`) to that step. Goals, live
mode (issue 26): the gap over the median step with as many processes (below) <= 1.3 and 0
steps lost for every planned operation; a recreated or added pod taking part within 1.5 s of
its start, a migration's replacement within 3 s of the request.

The gap is also divided by the median step interval with as many trainer processes at work
as the operation had at most (3 for a scale-up, measured before the scale-down; 2 for a
migration, whose replacement takes over from the old process from one step to the next, and a
SIGTERM, whose replacement starts beside the leaving process and does the same): on a machine
with fewer cores than processes, three pods step slower than two for want of CPU, not for a
pause, and this ratio tells the two apart. Each operation starts when
the job's next periodic checkpoint is at least CLEAR_STEPS steps away: a checkpoint stalls a step
by itself (bench/trainer_overhead.py measures it), whether or not an operation runs.

With --rounds N, the operations run N times in a row in the same job, and the table gives each
figure's median over the rounds and its range: one round's gap is one sample of a noisy
machine's.

    PYTHONPATH=. .venv/bin/python -m bench.elastic [--modes live,restart] [--rounds 3]
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.control_plane import events, pod_state, serve, standby_ready, steps, wait

SETTLE_STEPS = 15
"""Steps the timed pod commits with the expected participants before the next operation
starts."""
AFTER_STEPS = 3
"""Steps the timed pod commits with the new membership after an operation ended that still
count as its window."""
SPEC: dict[str, Any] = {
    "model": "minilm", "dataset": "rotten_tomatoes", "replicas": 3, "max_replicas": 3,
    "epochs": 3, "batch_size": 8, "checkpoint_every_steps": 25, "max_eval_samples": 200}
CLEAR_STEPS = 12
"""Steps from an operation's start to the job's next periodic checkpoint, at least."""


@dataclass
class Result:
    operation: str
    gap_ratio: float
    contended_ratio: float
    """The gap over the median step with as many trainer processes as the operation had."""
    lost: int
    joined: float | None
    """Seconds from the API call to the new pod's first committed step; None: no new pod."""
    started: float | None
    """Seconds from the new pod's start to its first committed step; None: no new pod."""


class Run:
    """One job of one mode, and what its pods reported."""

    def __init__(self, http: httpx.Client, data_dir: Path, mode: str) -> None:
        self.http, self.data_dir, self.mode = http, data_dir, mode
        created = http.post("/api/v1/jobs", json={**SPEC, "fault_tolerance": mode})
        created.raise_for_status()
        self.id: str = created.json()["id"]
        self.medians: dict[int, float] = {}
        """The median step interval by the number of trainer processes at work."""
        self.per_epoch: int | None = None
        """Steps in an epoch (the global batch is fixed), once the job reports its samples."""

    def pod(self, ordinal: int) -> str:
        return f"{self.id}-{ordinal}"

    def clear(self, step: int) -> bool:
        """Whether the job's next periodic checkpoint and its epoch's end (an evaluation) are
        both at least CLEAR_STEPS steps after `step`: each stalls a step by itself."""
        every = SPEC["checkpoint_every_steps"]
        if self.per_epoch is None:  # known once the pods have read the data
            total = self.http.get(f"/api/v1/jobs/{self.id}").json()["progress"]["total_samples"]
            self.per_epoch = math.ceil((total or 0) / SPEC["epochs"]
                                       / (SPEC["replicas"] * SPEC["batch_size"])) or None
        per_epoch = self.per_epoch
        return (1 <= step % every <= every - CLEAR_STEPS
                and (per_epoch is None or 1 <= step % per_epoch <= per_epoch - CLEAR_STEPS))

    def survivor_steps(self, watch: int = 0) -> list[tuple[float, int, int]]:
        """(time, step, participants) of pod `watch`'s commits, oldest first."""
        return [(t, step, n) for t, pod, step, n in steps(self.http, self.id)
                if pod == self.pod(watch)]

    def reports(self, kind: str, after: float) -> list[dict[str, Any]]:
        return [e["data"] | {"time": e["time"]} for e in events(self.http, self.id, "job")
                if e["data"].get("type") == kind and e["time"] > after]

    def settle(self, participants: int, after: float = 0.0, watch: int = 0) -> None:
        """Wait until pod `watch` has committed SETTLE_STEPS steps in a row with
        `participants`, all after `after` and after a live job's standby was loaded."""
        if self.mode == "live":
            wait(lambda: standby_ready(self.data_dir, self.id), 600, "the standby")
            after = max(after, time.time())

        def settled() -> bool:
            recent = self.survivor_steps(watch)[-SETTLE_STEPS:]
            return len(recent) == SETTLE_STEPS and all(
                n == participants and t > after for t, _, n in recent)
        wait(settled, 600, f"{participants} pods to train together")

    def joined(self, ordinal: int, after: float) -> float:
        """When the pod's next incarnation took part in a committed step (trainer time)."""
        found = wait(lambda: [j for j in self.reports("joined", after)
                              if j["pod"] == self.pod(ordinal)], 300,
                     f"pod {ordinal} to take part")
        return float(found[0]["time"])

    def measure(self, operation: str, act: Callable[[], None], done: Callable[[float], float],
                new_pod: int | None, participants: int, processes: int,
                watch: int = 0) -> Result:
        """Run `act`, wait for `done(called_at)` (when the operation was over), then settle.
        `new_pod`: the ordinal of the pod it starts, if any; `processes`: the most trainer
        processes at work during it; `watch`: the pod whose commits are timed."""
        wait(lambda: self.clear(self.survivor_steps(watch)[-1][1]), 300,
             "a step clear of the next checkpoint and epoch end")
        before = self.survivor_steps(watch)[-21:]
        median = statistics.median(b[0] - a[0] for a, b in itertools.pairwise(before))
        self.medians.setdefault(before[-1][2], median)
        called = time.time()
        act()
        finished = done(called)
        # The incarnation that took part: state.json lists it once the operation is over.
        started = (None if new_pod is None else
                   float(pod_state(self.data_dir, self.id, new_pod)["started_at"]))
        self.settle(participants, after=finished, watch=watch)
        # From the last commit before the call on: a pause that starts with it counts.
        after = [s for s in self.survivor_steps(watch) if s[0] >= before[-1][0]]
        # Over once the timed pod has committed AFTER_STEPS steps with the new membership
        # since the operation ended (a restart round, where there is one, is inside).
        settled = [s for s in after if s[0] > finished and s[2] == participants]
        window = [s for s in after if s[0] <= settled[AFTER_STEPS - 1][0]]
        gap = max(b[0] - a[0] for a, b in itertools.pairwise(window))
        lost = sum(a[1] - b[1] + 1 for a, b in itertools.pairwise(after) if b[1] <= a[1])
        contended = self.medians[processes]
        result = Result(operation, gap / median, gap / contended, lost,
                        None if started is None else finished - called,
                        None if started is None else finished - started)
        print(f"  {self.mode}: {operation}: gap/median {result.gap_ratio:.2f} (gap "
              f"{gap:.2f} s, median {median:.3f} s; {result.contended_ratio:.2f} of the "
              f"median {contended:.3f} s with {processes} processes), lost {lost}"
              + (f", new pod taking part after {result.joined:.2f} s ({result.started:.2f} s "
                 f"after its start)" if result.started is not None else "")
              + self.heal_parts(called, finished), flush=True)
        return result

    def heal_parts(self, called: float, finished: float) -> str:
        """Where a new pod's time went, from its own `healed` event: the call to its heal's
        start (a process, or the standby, and a quorum), the heal's transfer, and the heal's
        end to the operation's end (its first step)."""
        healed = [h for h in self.reports("healed", called) if h["time"] <= finished]
        if not healed:
            return ""
        heal = healed[0]
        start = heal["time"] - heal["seconds"]
        return (f"; call to heal {start - called:.2f} s, heal {heal['seconds']:.2f} s "
                f"({heal['bytes'] / 1e6:.0f} MB), heal to step {finished - heal['time']:.2f} s")

    def patch(self, replicas: int) -> None:
        self.http.patch(f"/api/v1/jobs/{self.id}", json={"replicas": replicas}
                        ).raise_for_status()

    def post(self, path: str, body: dict[str, Any] | None = None) -> None:
        self.http.post(f"/api/v1/jobs/{self.id}/{path}", json=body or {}).raise_for_status()

    def left(self, ordinal: int, called: float) -> float:
        """When the pod was gone: it left (live) or its incarnation ended (restart)."""
        def gone() -> float | None:
            left = [e for e in self.reports("left", called) if e["pod"] == self.pod(ordinal)]
            if left:
                return float(left[0]["time"])
            pods = self.http.get(f"/api/v1/jobs/{self.id}").json()["pods"]
            return time.time() if all(p["ordinal"] != ordinal for p in pods) else None
        return float(wait(gone, 300, f"pod {ordinal} to leave"))


def operations(run: Run) -> list[Result]:
    """Each operation once, from 3 pods training together back to 3."""
    return [
        run.measure("scale 3 -> 2 (graceful leave)", lambda: run.patch(2),
                    lambda called: run.left(2, called), None, 2, 3),
        run.measure("SIGTERM to a pod",
                    lambda: run.post("pods/1/kill", {"grace_seconds": 30}),
                    lambda called: run.joined(1, called), 1, 2, 2),
        migrate(run, 1),
        migrate(run, 0),
        run.measure("scale 2 -> 3", lambda: run.patch(3),
                    lambda called: run.joined(2, called), 2, 3, 3),
        run.measure("SIGKILL (the unplanned baseline)",
                    lambda: run.post("pods/1/kill", {"grace_seconds": 0}),
                    lambda called: run.joined(1, called), 1, 3, 3),
    ]


def migrate(run: Run, ordinal: int) -> Result:
    """Migrate pod `ordinal` of two, timing the other one's commits."""
    return run.measure(f"migrate pod {ordinal}", lambda: run.post(f"pods/{ordinal}/migrate"),
                       lambda called: called + wait(
                           lambda: run.reports("migrated", called), 300, "the migration",
                       )[0]["seconds"], ordinal, 2, 2, watch=1 - ordinal)


def run_mode(http: httpx.Client, data_dir: Path, mode: str, rounds: int) -> list[list[Result]]:
    """`rounds` rounds of the operations in one job: per round, each operation's result."""
    run = Run(http, data_dir, mode)
    try:
        run.settle(3)
        return [operations(run) for _ in range(rounds)]
    finally:  # its pods outlive the API: they must not train on into the next measurement
        http.post(f"/api/v1/jobs/{run.id}/cancel")


def spread(values: list[float]) -> str:
    """The median of `values`, and their range where there are several."""
    median = f"{statistics.median(values):.2f}"
    return median if len(values) == 1 else f"{median} ({min(values):.2f}-{max(values):.2f})"


def report(results: dict[str, list[list[Result]]]) -> None:
    """Per operation and mode, the median over the rounds (and their range) of each ratio and
    of the new pod's time to take part (from the call, and from its start); the most steps lost
    in any round."""
    modes = list(results)
    rounds = len(next(iter(results.values())))
    if rounds > 1:
        print(f"\nmedians of {rounds} rounds (their range in brackets)")
    header = " | ".join(f"{mode}: gap / median step | {mode}: gap / median, as many processes "
                        f"| {mode}: lost | {mode}: new pod taking part (from its start)"
                        for mode in modes)
    print(f"\n| operation | {header} |")
    print("|---|" + "---|" * (4 * len(modes)))
    for index, operation in enumerate(r.operation for r in results[modes[0]][0]):
        cells = []
        for mode in modes:
            done = [round_[index] for round_ in results[mode]]
            joined = [r.joined for r in done if r.joined is not None]
            started = [r.started for r in done if r.started is not None]
            cells.append(f"{spread([r.gap_ratio for r in done])} | "
                         f"{spread([r.contended_ratio for r in done])} | "
                         f"{max(r.lost for r in done)} | "
                         + (f"{spread(joined)} s ({spread(started)} s)" if joined else "-"))
        print(f"| {operation} | {' | '.join(cells)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="live,restart")
    parser.add_argument("--rounds", type=int, default=1,
                        help="each operation this many times (one job per mode): the medians")
    parser.add_argument("--data-dir", type=Path, help="keep jobs, logs and database here")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    results: dict[str, list[list[Result]]] = {}
    with serve(args.data_dir) as (http, data_dir):
        for mode in args.modes.split(","):
            results[mode] = run_mode(http, data_dir, mode, args.rounds)
    report(results)


if __name__ == "__main__":
    main()
