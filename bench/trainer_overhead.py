"""Samples/s of the full trainer (reports + step checkpoints) against a bare PyTorch loop.

Both run in this process on the same model, batch size, tokenized data and sample order, in
alternating rounds so machine noise hits both alike. Prints a table and the ratio full/bare
(goal: >= 0.95).

    .venv/bin/python bench/trainer_overhead.py [--steps 100] [--rounds 2]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.nn import functional

from trainer.config import JobSpec, Runtime, TrainConfig
from trainer.distributed import Group
from trainer.model import choose_device, load_model, resolve_model
from trainer.report import HttpSink, JsonlSink, Reporter
from trainer.schedule import LinearSchedule, build_optimizer
from trainer.train import Trainer

SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def bare_loop(trainer: Trainer, steps: int) -> float:
    """The same work with nothing around it: forward, backward, clip, AdamW, schedule."""
    spec = trainer.config.spec
    model = load_model(resolve_model(spec.model, trainer.config.runtime.inputs_dir), spec.seed)
    optimizer = build_optimizer(model, spec)
    schedule = LinearSchedule(spec.learning_rate, spec.warmup_ratio,
                              spec.epochs * len(trainer.train_data))
    order = trainer.sampler.order(0)
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        indices = order[step * spec.batch_size:(step + 1) * spec.batch_size]
        batch = trainer.train_data.batch(indices)
        for group in optimizer.param_groups:
            group["lr"] = schedule.lr_at(step * spec.batch_size)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = functional.cross_entropy(logits, batch["labels"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
    return steps * spec.batch_size / (time.perf_counter() - start)


def full_trainer(config: TrainConfig, url: str, work: Path, steps: int) -> float:
    config.runtime.max_steps = steps
    reporter = Reporter("bench-0", sinks=[
        HttpSink(url, "token", "bench-0", "bench"), JsonlSink(work / "reports.jsonl", "bench-0",
                                                             "bench")])
    trainer = Trainer(config, Group(choose_device(), environ={}), reporter)
    start = time.perf_counter()
    trainer.fit()
    elapsed = time.perf_counter() - start
    reporter.close()
    return steps * config.spec.batch_size / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--checkpoint-every-steps", type=int, default=50)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{server.stdout.readline().strip()}/reports"
        with tempfile.TemporaryDirectory() as scratch:
            root = Path(scratch)
            spec = JobSpec(model="minilm", dataset="rotten_tomatoes", batch_size=args.batch_size,
                           checkpoint_every_steps=args.checkpoint_every_steps)
            # A probe trainer provides the tokenized data and sample order the bare loop uses.
            probe_config = TrainConfig(spec, Runtime(cache_dir=Path("runs/bench-cache"),
                                                     checkpoint_dir=root / "probe"))
            probe = Trainer(probe_config, Group(choose_device(), environ={}), Reporter("probe"))
            bare, full = [], []
            for round_ in range(args.rounds):
                bare.append(bare_loop(probe, args.steps))
                runtime = Runtime(cache_dir=Path("runs/bench-cache"),
                                  checkpoint_dir=root / f"ckpt-{round_}",
                                  model_dir=root / f"model-{round_}")
                full.append(full_trainer(TrainConfig(spec, runtime), url, root, args.steps))
                print(f"round {round_ + 1}: bare {bare[-1]:.1f} samples/s, "
                      f"full {full[-1]:.1f} samples/s", flush=True)
    finally:
        server.kill()
        server.wait()
    bare_median, full_median = statistics.median(bare), statistics.median(full)
    print()
    print(f"| loop | samples/s (median of {args.rounds}) |")
    print("|---|---|")
    print(f"| bare PyTorch | {bare_median:.1f} |")
    print(f"| full trainer (HTTP + JSONL reports, checkpoint every "
          f"{args.checkpoint_every_steps} steps) | {full_median:.1f} |")
    print(f"\nratio full/bare: {full_median / bare_median:.3f} (goal >= 0.95), "
          f"{args.steps} steps of batch {args.batch_size}, MiniLM-L6 on Rotten Tomatoes")


if __name__ == "__main__":
    main()
