"""LoRA against full fine-tuning: samples/s, checkpoint and heal bytes, rejoin time, accuracy.

Both jobs are the product's own: the real control plane with the local backend, live fault
tolerance, MiniLM-L6 on the whole Rotten Tomatoes train split, 2 pods, one epoch, the same seed,
each at its default learning rate and checkpoint interval. Per job:
- samples/s over the committed steps from --warmup steps after the warm standby is loaded (its
  loading costs the pods CPU) until the kill;
- the median size of its checkpoints (trainable weights, their optimizer state, the trainer's);
- a SIGKILL of pod 1 through the API at --kill-at of the epoch: the bytes pod 1 healed from
  pod 0 and its rejoin time (recreated pod's start -> its first committed step);
- test accuracy on the whole test split at the end.
Prints LoRA/full ratios. Goals: samples/s >= 1.3, checkpoint bytes <= 0.05, heal bytes <= 0.05,
accuracy within 2 points.

    PYTHONPATH=. .venv/bin/python -m bench.lora [--kill-at 0.5] [--warmup 5]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import httpx

from bench.control_plane import events, pod_state, serve, standby_ready, wait
from bench.recovery import kill

FINISHED = ("succeeded", "failed", "cancelled")


def committed(http: httpx.Client, job_id: str, pod: str) -> list[tuple[float, int]]:
    """(trainer time, samples seen) of every step `pod` committed, oldest first."""
    return sorted((e["time"], e["data"]["samples_seen"]) for e in events(http, job_id, "metric")
                  if e["data"].get("kind") == "metric" and e["data"]["pod"] == pod)


def job_reports(http: httpx.Client, job_id: str, kind: str) -> list[dict[str, Any]]:
    return [e["data"] | {"time": e["time"]} for e in events(http, job_id, "job")
            if e["data"].get("type") == kind]


def run(http: httpx.Client, data_dir: Path, finetune: str, args: argparse.Namespace,
        ) -> dict[str, float]:
    spec = {"model": "minilm", "dataset": "rotten_tomatoes", "replicas": 2, "epochs": 1,
            "fault_tolerance": "live", "finetune": finetune, "seed": args.seed}
    job_id = http.post("/api/v1/jobs", json=spec).json()["id"]
    survivor = f"{job_id}-0"

    def job() -> dict[str, Any]:
        body: dict[str, Any] = http.get(f"/api/v1/jobs/{job_id}").json()
        return body

    def fraction() -> float:
        progress = job()["progress"]
        return float(progress["samples_seen"] / (progress["total_samples"] or 1))

    try:
        wait(lambda: standby_ready(data_dir, job_id), 600, "the warm standby to load")
        ready_at = wait(lambda: [t for t, _ in committed(http, job_id, survivor)][-1:], 60,
                        "a step after the standby loaded")[0]
        wait(lambda: fraction() >= args.kill_at, 3600, f"{args.kill_at:.0%} of the epoch")
        steps = [(t, n) for t, n in committed(http, job_id, survivor) if t >= ready_at]
        (first_time, first_seen), (last_time, last_seen) = steps[args.warmup], steps[-1]
        rate = (last_seen - first_seen) / (last_time - first_time)

        killed_at, restarts = kill(http, data_dir, job_id, 1)
        started = wait(lambda: (pod := pod_state(data_dir, job_id, 1))["restarts"] > restarts
                       and pod["started_at"], 120, "pod 1 to be recreated")
        healed = wait(lambda: [r for r in job_reports(http, job_id, "healed")
                               if r["target"] == f"{job_id}-1" and r["time"] > killed_at],
                      300, "pod 1 to heal")[0]
        rejoined = wait(lambda: [t for t, _ in committed(http, job_id, f"{job_id}-1")
                                 if t > started][:1], 300, "pod 1's first step back")[0]
        print(f"  {finetune}: {rate:.1f} samples/s; pod 1 healed {healed['bytes']:,} bytes in "
              f"{healed['seconds']:.2f} s and took part {rejoined - started:.2f} s after its "
              "start", flush=True)

        final = wait(lambda: (body := job())["status"] in FINISHED and body, 3600,
                     "the job to end")
        if final["status"] != "succeeded":
            raise SystemExit(f"{finetune}: the job ended {final['status']}: {final['reason']}")
        checkpoints = http.get(f"/api/v1/jobs/{job_id}/checkpoints").json()
        sizes = [c["size_bytes"] for c in checkpoints]
        result = {"samples_per_second": rate, "checkpoint_bytes": statistics.median(sizes),
                  "heal_bytes": float(healed["bytes"]), "heal_seconds": healed["seconds"],
                  "rejoin_seconds": rejoined - started,
                  "accuracy": final["metrics"]["test_accuracy"],
                  "trainable": final["metrics"].get("trainable_parameters") or 0,
                  "parameters": final["metrics"].get("parameters") or 0}
        print(f"  {finetune}: {result}", flush=True)
        return result
    finally:  # its pods outlive the API
        if job()["status"] not in FINISHED:
            http.post(f"/api/v1/jobs/{job_id}/cancel")


def report(full: dict[str, float], lora: dict[str, float]) -> None:
    rows = [("samples/s", "samples_per_second", "{:.1f}", ">= 1.3"),
            ("checkpoint bytes (median)", "checkpoint_bytes", "{:,.0f}", "<= 0.05"),
            ("healed bytes", "heal_bytes", "{:,.0f}", "<= 0.05"),
            ("heal transfer seconds", "heal_seconds", "{:.2f}", "-"),
            ("rejoin seconds", "rejoin_seconds", "{:.2f}", "-")]
    print("\n| figure | full fine-tuning | LoRA | LoRA / full | goal |")
    print("|---|---|---|---|---|")
    for name, key, shape, goal in rows:
        ratio = lora[key] / full[key] if full[key] else float("nan")
        print(f"| {name} | {shape.format(full[key])} | {shape.format(lora[key])} | "
              f"{ratio:.3f} | {goal} |")
    gap = 100 * (lora["accuracy"] - full["accuracy"])
    print(f"| test accuracy | {100 * full['accuracy']:.2f}% | {100 * lora['accuracy']:.2f}% | "
          f"{gap:+.2f} points | within 2 points |")
    print(f"| trainable parameters | {full['trainable']:,.0f} | {lora['trainable']:,.0f} | "
          f"{lora['trainable'] / (full['trainable'] or 1):.4f} | - |")
    print("\nMiniLM-L6, Rotten Tomatoes (whole train split, one epoch, whole test split), "
          "2 pods, live mode, pod 1 SIGKILLed once")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill-at", type=float, default=0.5,
                        help="fraction of the epoch at which pod 1 is killed")
    parser.add_argument("--warmup", type=int, default=5,
                        help="steps after the standby loaded left out of the throughput")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--data-dir", type=Path, help="keep jobs, logs and database here")
    args = parser.parse_args()
    if not 0 < args.kill_at < 1:
        parser.error("--kill-at must be between 0 and 1")
    with serve(args.data_dir) as (http, data_dir):
        full = run(http, data_dir, "full", args)
        lora = run(http, data_dir, "lora", args)
    report(full, lora)


if __name__ == "__main__":
    main()
