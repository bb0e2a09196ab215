"""Data parallelism against a two-stage pipeline: samples/s and parameter + optimizer bytes per pod.

Every configuration is the real trainer (`python -m trainer`) in two processes of one static
world (one thread each, gloo over loopback) on MiniLM-L6 and Rotten Tomatoes with the same
global batch and sample order: data parallelism is two pods of `--batch-size` samples each, a
pipeline is one replica of two stages taking both pods' samples in `M` microbatches. Throughput
is measured from the committed steps' report times after `--warmup` steps (model loading and
the pipeline's first schedules left out), in alternating rounds so machine noise hits every
configuration alike. Prints a table and the pipeline/data-parallel ratios (goal at M = 8:
>= 0.75), then each pod's parameter + AdamW bytes against the whole model's (goal: <= 0.55).

    .venv/bin/python bench/parallelism.py [--steps 40] [--warmup 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from trainer.contract.credentials import SECRET_ENV
from trainer.contract.runtime import SPEC_ENV
from trainer.model import load_model, resolve_model
from trainer.pipeline import Stage

CACHE = Path("runs/bench-cache")
STAGES = 2
TIMEOUT = 900


@dataclass(frozen=True)
class Setup:
    name: str
    spec: dict[str, Any]
    reporting_pod: int
    """The pod whose reports carry the committed steps (a pipeline's last stage)."""


def setups(batch_size: int) -> list[Setup]:
    """Data parallelism and the four pipelines, all consuming 2 x batch_size samples a step."""
    pipelines = [Setup(f"pipeline {schedule}, M = {microbatches}",
                       {"parallelism": "pipeline", "pipeline_stages": STAGES, "replicas": 1,
                        "batch_size": 2 * batch_size, "schedule": schedule,
                        "microbatches": microbatches}, reporting_pod=STAGES - 1)
                 for schedule in ("gpipe", "1f1b") for microbatches in (4, 8)]
    return [Setup("data parallel, 2 pods", {"replicas": 2, "batch_size": batch_size}, 0),
            *pipelines]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(setup: Setup, steps: int, warmup: int, work: Path) -> float:
    """Samples/s of the committed steps after `warmup`, from the reporting pod's metric times."""
    spec = {"model": "minilm", "dataset": "rotten_tomatoes", "fault_tolerance": "restart",
            "checkpoint_every_steps": 0, **setup.spec}
    port = free_port()
    workers = []
    for pod in range(2):
        env = {**os.environ, SPEC_ENV: json.dumps(spec), "OMP_NUM_THREADS": "1",
               "WORLD_SIZE": "2", "RANK": str(pod), "LOCAL_RANK": "0",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "POD_ADDRESS": "127.0.0.1",
               SECRET_ENV: "bench", "JOB_ID": "bench", "POD_NAME": f"bench-{pod}",
               "MAX_STEPS": str(steps),
               "METRICS_FILE": str(work / f"metrics-{pod}.jsonl"),
               "CHECKPOINT_DIR": str(work / "checkpoints"), "MODEL_DIR": str(work / "model"),
               "TRAINER_CACHE_DIR": str(CACHE)}
        log = (work / f"pod-{pod}.log").open("w")
        workers.append(subprocess.Popen([sys.executable, "-m", "trainer"], env=env,
                                        stdout=log, stderr=subprocess.STDOUT))
    try:
        for pod, worker in enumerate(workers):
            if worker.wait(timeout=TIMEOUT) != 0:
                raise SystemExit(f"{setup.name}: pod {pod} exited {worker.returncode}:\n"
                                 + (work / f"pod-{pod}.log").read_text()[-3000:])
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    lines = (work / f"metrics-{setup.reporting_pod}.jsonl").read_text().splitlines()
    metrics = [record for record in map(json.loads, lines) if record["kind"] == "metric"]
    first, last = metrics[warmup - 1], metrics[-1]
    assert last["data"]["step"] == steps, f"{setup.name}: ended at step {last['data']['step']}"
    samples = last["data"]["samples_seen"] - first["data"]["samples_seen"]
    return float(samples / (last["time"] - first["time"]))


def state_bytes(module: nn.Module) -> int:
    """Parameters plus AdamW's two moments per trainable parameter (all float32 here)."""
    parameters = list(module.parameters())
    weights = sum(p.numel() * p.element_size() for p in parameters)
    return weights + sum(2 * p.numel() * p.element_size() for p in parameters if p.requires_grad)


def bytes_per_pod(model: nn.Module) -> list[float]:
    whole = state_bytes(model)
    return [state_bytes(Stage(model, index, STAGES)) / whole for index in range(STAGES)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16,
                        help="samples per data-parallel pod per step (the pipeline takes twice)")
    args = parser.parse_args()
    if not 1 <= args.warmup < args.steps:
        parser.error("--warmup must be at least 1 and less than --steps")
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for index, setup in enumerate(setups(args.batch_size)):
                work = Path(scratch) / f"{round_}-{index}"
                work.mkdir()
                rate = run(setup, args.steps, args.warmup, work)
                results.setdefault(setup.name, []).append(rate)
                print(f"round {round_ + 1}: {setup.name}: {rate:.1f} samples/s", flush=True)
    medians = {name: statistics.median(rates) for name, rates in results.items()}
    baseline = medians["data parallel, 2 pods"]
    print(f"\n| configuration | samples/s (median of {args.rounds}) | ratio to data parallel |")
    print("|---|---|---|")
    for name, rate in medians.items():
        print(f"| {name} | {rate:.1f} | {rate / baseline:.2f} |")
    print(f"\nglobal batch {2 * args.batch_size}, steps {args.warmup + 1}-{args.steps} of each "
          "run, MiniLM-L6 on Rotten Tomatoes, 2 processes of one thread")

    print("\n| model | pod | parameter + AdamW bytes / whole model's |")
    print("|---|---|---|")
    minilm = load_model(resolve_model("minilm", Path("data/inputs")), seed=0)
    from transformers import BertConfig, BertForSequenceClassification

    # BERT-base's shape (bert-base-uncased), randomly initialised: the sizes need no weights.
    base = BertForSequenceClassification(BertConfig())  # two labels
    for name, model in (("MiniLM-L6", minilm), ("BERT-base", base)):
        shares = bytes_per_pod(model)
        for index, share in enumerate(shares):
            print(f"| {name} | stage {index} | {share:.3f} |")
        encoder: Any = model.base_model
        embeddings = state_bytes(encoder.embeddings) / state_bytes(model)
        print(f"| {name} | (its embeddings alone) | {embeddings:.3f} |")


if __name__ == "__main__":
    main()
