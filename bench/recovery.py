"""Recovery after killed pods: live (torchft) against restart (torchrun elastic), one run.

Both modes run the same jobs on the same machine through the real control plane and the local
backend; every kill is a real SIGKILL through `POST .../pods/{ordinal}/kill`.

1. Kills: pod 1 of 3 is killed every --every seconds, --kills times. Per kill: the survivors'
   pause (kill -> pod 0's first step committed after the group noticed the loss; a step still
   in flight with the dead pod's gradients does not count), the committed steps computed again
   (pod 0's last step committed before that moment minus the one committed then, plus one), and the
   rejoin time (recreated pod's start -> its first committed step; live pods start as the
   job's warm standby where one is loaded). Goals: live pause <= 1.0 s, live/restart pause
   ratio <= 0.15, 0 steps lost, live rejoin <= 5 s (median).
2. Chaos: the demo job (MiniLM, Rotten Tomatoes, 2,000 samples, 2 pods) once undisturbed and
   once with a pod killed every --chaos-every seconds until it ends, same seed. Goal: the chaos
   run succeeds with test accuracy within 1 point of the undisturbed one; its time overhead is
   reported as a ratio.

    PYTHONPATH=. .venv/bin/python -m bench.recovery [--kills 5] [--every 20] [--modes live,restart]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from api.demo import DEMO_SPEC
from bench.control_plane import serve, steps, wait


def job_state(data_dir: Path, job_id: str) -> dict[str, Any]:
    """The job's state.json, as its local supervisor wrote it."""
    state: dict[str, Any] = json.loads((data_dir / "jobs" / job_id / "state.json").read_text())
    return state


def pod_state(data_dir: Path, job_id: str, ordinal: int) -> dict[str, Any]:
    pod: dict[str, Any] = job_state(data_dir, job_id)["pods"][ordinal]
    return pod


def kill(http: httpx.Client, data_dir: Path, job_id: str, ordinal: int) -> tuple[float, int]:
    """SIGKILL a pod through the API; (when the supervisor sent the signal, restarts before)."""
    before = pod_state(data_dir, job_id, ordinal)
    http.post(f"/api/v1/jobs/{job_id}/pods/{ordinal}/kill", json={"grace_seconds": 0})
    signalled = wait(lambda: pod_state(data_dir, job_id, ordinal)["signalled_at"], 30,
                     "the kill")
    return signalled, before["restarts"]


def recovery(committed: list[tuple[float, str, int, int]], pod: str, killed_at: float,
             ) -> tuple[float, int]:
    """(time, step) of the survivor's first commit computed after the group noticed the kill.

    A step in flight may still commit just after the kill, with the dead pod's gradients: that
    is not recovery. Recovery is the first commit with another participant count (live: the
    survivors alone) or after a stall of over three usual step intervals (a restart).
    """
    times = [(t, step, n) for t, p, step, n in committed if p == pod]
    before = [(t, n) for t, _, n in times if t < killed_at][-11:]
    usual = statistics.median(b - a for (a, _), (b, _) in itertools.pairwise(before))
    for (previous, _, _), (t, step, participants) in itertools.pairwise(times):
        if t > killed_at and (participants != before[-1][1] or t - previous > 3 * usual):
            return t, step
    raise SystemExit("no recovery seen after the kill")


def run_kills(http: httpx.Client, data_dir: Path, spec: dict[str, Any],
              args: argparse.Namespace) -> list[dict[str, float]]:
    job_id = http.post("/api/v1/jobs", json=spec).json()["id"]
    victim, survivor = f"{job_id}-1", f"{job_id}-0"
    wait(lambda: http.get(f"/api/v1/jobs/{job_id}").json()["progress"]["step"] >= 3, 600,
         "training to start")
    kills: list[dict[str, float]] = []
    try:
        for _ in range(args.kills):
            time.sleep(args.every)
            if http.get(f"/api/v1/jobs/{job_id}").json()["status"] not in ("running", "degraded"):
                break
            standby = job_state(data_dir, job_id).get("standby") or {}
            killed_at, restarts = kill(http, data_dir, job_id, 1)
            started = wait(lambda r=restarts: (pod := pod_state(data_dir, job_id, 1))[
                "restarts"] > r and pod["started_at"], 120, "pod 1 to be recreated")
            warm = standby.get("ready") and pod_state(data_dir, job_id, 1)["pid"] == standby["pid"]
            wait(lambda s=started: any(pod == victim and t > s
                                       for t, pod, _, _ in steps(http, job_id)), 300,
                 "the recreated pod's first step")
            wait(lambda s=started: any(pod == survivor and t > s
                                       for t, pod, _, _ in steps(http, job_id)), 300,
                 "a survivor's step after the rejoin")
            committed = steps(http, job_id)
            recovered_at, first_step = recovery(committed, survivor, killed_at)
            last_before = max(step for t, pod, step, _ in committed
                              if t < recovered_at and pod == survivor)
            rejoined = min(t for t, pod, _, _ in committed if t > started and pod == victim)
            kills.append({"pause": recovered_at - killed_at,
                          "lost": max(0, last_before - first_step + 1),
                          "rejoin": rejoined - started})
            print(f"  {spec['fault_tolerance']}: kill {len(kills)}: pause "
                  f"{kills[-1]['pause']:.2f} s, lost {kills[-1]['lost']}, rejoin "
                  f"{kills[-1]['rejoin']:.2f} s"
                  + (" (the warm standby)" if warm else " (a new process)"), flush=True)
    finally:  # its pods outlive the API
        http.post(f"/api/v1/jobs/{job_id}/cancel")
    return kills


def run_demo(http: httpx.Client, data_dir: Path, mode: str, kill_every: float | None,
             ) -> dict[str, Any]:
    """The demo job to its end, killing pods 1, 0, 1, ... every `kill_every` seconds."""
    started = time.monotonic()
    job_id = http.post("/api/v1/jobs", json={**DEMO_SPEC, "fault_tolerance": mode}).json()["id"]
    victims, next_kill, kills = itertools.cycle([1, 0]), None, 0
    while (job := http.get(f"/api/v1/jobs/{job_id}").json())["status"] not in (
            "succeeded", "failed", "cancelled"):
        if kill_every and job["status"] in ("running", "degraded"):
            next_kill = next_kill or time.monotonic() + kill_every
            if time.monotonic() >= next_kill:
                response = http.post(f"/api/v1/jobs/{job_id}/pods/{next(victims)}/kill",
                                     json={"grace_seconds": 0})
                kills += response.status_code == 202
                next_kill = time.monotonic() + kill_every
        time.sleep(0.2)
    result = {"status": job["status"], "reason": job["reason"], "kills": kills,
              "seconds": time.monotonic() - started,
              "accuracy": job["metrics"].get("test_accuracy")}
    print(f"  {mode} demo, {'chaos' if kill_every else 'undisturbed'}: {result}", flush=True)
    return result


def report_kills(results: dict[str, list[dict[str, float]]]) -> None:
    print("\n| mode | kills | survivors' pause (median) | steps lost per kill (max) "
          "| rejoin (median) |")
    print("|---|---|---|---|---|")
    for mode, kills in results.items():
        print(f"| {mode} | {len(kills)} | {statistics.median(k['pause'] for k in kills):.2f} s | "
              f"{max(k['lost'] for k in kills)} | "
              f"{statistics.median(k['rejoin'] for k in kills):.2f} s |")
    if {"live", "restart"} <= set(results):
        ratio = (statistics.median(k["pause"] for k in results["live"])
                 / statistics.median(k["pause"] for k in results["restart"]))
        print(f"\nlive/restart pause ratio: {ratio:.3f} (goal <= 0.15)")


def report_chaos(results: dict[str, tuple[dict[str, Any], dict[str, Any]]]) -> None:
    print("\n| mode | run | kills | status | test accuracy | wall time |")
    print("|---|---|---|---|---|---|")
    for mode, runs in results.items():
        for name, run in zip(("undisturbed", "chaos"), runs, strict=True):
            accuracy = f"{100 * run['accuracy']:.2f}%" if run["accuracy"] is not None else "-"
            print(f"| {mode} | {name} | {run['kills']} | {run['status']} | {accuracy} | "
                  f"{run['seconds']:.0f} s |")
    for mode, (calm, chaos) in results.items():
        if calm["accuracy"] is None or chaos["accuracy"] is None:
            print(f"\n{mode}: a run did not finish")
            continue
        gap = 100 * abs(chaos["accuracy"] - calm["accuracy"])
        print(f"\n{mode}: accuracy gap {gap:.2f} points (goal <= 1), time overhead ratio "
              f"chaos/undisturbed {chaos['seconds'] / calm['seconds']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--every", type=float, default=20)
    parser.add_argument("--chaos-every", type=float, default=20)
    parser.add_argument("--modes", default="live,restart")
    parser.add_argument("--parts", default="kills,chaos")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--data-dir", type=Path, help="keep jobs, logs and database here")
    args = parser.parse_args()
    modes, parts = args.modes.split(","), args.parts.split(",")
    spec = {"model": args.model, "dataset": "rotten_tomatoes", "replicas": 3,
            "epochs": 1, "batch_size": 8, "checkpoint_every_steps": 20}
    kill_results: dict[str, list[dict[str, float]]] = {}
    chaos_results: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    with serve(args.data_dir) as (http, data_dir):
        for mode in modes if "kills" in parts else []:
            kill_results[mode] = run_kills(http, data_dir, {**spec, "fault_tolerance": mode}, args)
        for mode in modes if "chaos" in parts else []:
            chaos_results[mode] = (run_demo(http, data_dir, mode, None),
                                   run_demo(http, data_dir, mode, args.chaos_every))
    if kill_results:
        report_kills(kill_results)
    if chaos_results:
        report_chaos(chaos_results)


if __name__ == "__main__":
    main()
