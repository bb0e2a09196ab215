"""Samples/s of the full trainer (reports + step checkpoints) against a bare PyTorch loop.

Both run in this process on the same model, batch size, tokenized data and sample order, in
alternating rounds so machine noise hits both alike. Prints a table and the ratio full/bare
(goal: >= 0.95). On a CUDA device both run in bf16 autocast (the trainer's mixed precision) and
the bench prints each loop's model FLOPs utilisation against the GPU's dense bf16 peak.

    .venv/bin/python bench/trainer_overhead.py [--steps 100] [--rounds 2]
    python bench/trainer_overhead.py --bert-base --batch-size 64 --steps 300 --rounds 3  # GPU

`--bert-base`: BERT-base's shape (12 layers, hidden 768, 110M parameters), randomly initialised
(nothing comes from the hub) with MiniLM's uncased vocabulary, which is BERT's (30,522 tokens),
trained on synthetic reviews long enough that every sequence fills `--max-length`.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional

from trainer.config import JobSpec, Runtime, TrainConfig
from trainer.data import on_device
from trainer.distributed import Group
from trainer.model import (
    DeviceChoice,
    choose_device,
    classify,
    load_model,
    offline_model_dir,
    resolve_model,
)
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


# Dense bf16 peak of the GPUs the device machines have (NVIDIA's data sheets, SXM parts).
BF16_PEAK_FLOPS = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}


def bare_loop(trainer: Trainer, steps: int, device: DeviceChoice, warmup: int) -> float:
    """The same work with nothing around it: forward (the trainer's, which leaves out a batch's
    mask where no row is padded), backward, clip, AdamW, schedule; timed after `warmup` steps."""
    spec = trainer.config.spec
    model = load_model(resolve_model(spec.model, trainer.config.runtime.inputs_dir), spec.seed)
    model.to(device.device)
    if spec.torch_compile:
        model.compile()
    optimizer = build_optimizer(model, spec)
    schedule = LinearSchedule(spec.learning_rate, spec.warmup_ratio,
                              spec.epochs * len(trainer.train_data))
    order = trainer.sampler.order(0)
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        if step == warmup:
            start = time.perf_counter()  # the previous step's loss.item() waited for the device
        indices = order[step * spec.batch_size:(step + 1) * spec.batch_size]
        batch = on_device(trainer.train_data.batch(indices), device.device)
        for group in optimizer.param_groups:
            group["lr"] = schedule.lr_at(step * spec.batch_size)
        with device.autocast():
            logits = classify(model, batch)
        loss = functional.cross_entropy(logits.float(), batch["labels"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
    return (steps - warmup) * spec.batch_size / (time.perf_counter() - start)


def full_trainer(config: TrainConfig, url: str, reports: Path, steps: int, warmup: int) -> float:
    """Samples/s of `Trainer.fit`; with a warm-up, between the metric records of the step
    `warmup` and of the last step (the trainer's own timestamps)."""
    config.runtime.max_steps = steps
    reporter = Reporter("bench-0", sinks=[
        HttpSink(url, "token", "bench-0", "bench"), JsonlSink(reports, "bench-0", "bench")])
    trainer = Trainer(config, Group(choose_device(), environ={}), reporter)
    start = time.perf_counter()
    trainer.fit()
    elapsed = time.perf_counter() - start
    reporter.close()
    if not warmup:
        return steps * config.spec.batch_size / elapsed
    times = {record["data"]["step"]: record["time"]
             for record in map(json.loads, reports.read_text().splitlines())
             if record["kind"] == "metric"}
    return (steps - warmup) * config.spec.batch_size / (times[steps] - times[warmup])


def prepare_bert_base(root: Path, max_length: int) -> tuple[Path, Path]:
    """A BERT-base-shaped classifier directory and a CSV of reviews that fill `max_length`."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    model_dir, data = root / "bert-base", root / "reviews.csv"
    if not (model_dir / "model.safetensors").is_file():
        torch.manual_seed(0)
        BertForSequenceClassification(BertConfig()).save_pretrained(model_dir)
    if not (model_dir / "tokenizer.json").is_file():
        AutoTokenizer.from_pretrained(offline_model_dir()).save_pretrained(model_dir)
    if not data.is_file():
        words = ["good", "bad", "film", "plot", "actor", "scene", "boring", "great", "music",
                 "story", "slow", "funny", "dark", "ending", "cast", "script", "visual"]
        picker = random.Random(0)
        lines = ["text,label"] + [
            f"{' '.join(picker.choices(words, k=max_length + 20))},{row % 2}"
            for row in range(80_000)]
        data.write_text("\n".join(lines) + "\n")
    return model_dir, data


def flops_per_sample(model_dir: str, tokens: int) -> float:
    """Training FLOPs of one sequence: 6 x non-embedding parameters x tokens, plus attention's
    12 x layers x hidden x tokens^2 (the PaLM paper's accounting, forward and backward)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    hidden, layers = config.hidden_size, config.num_hidden_layers
    per_layer = 4 * hidden * hidden + 2 * hidden * config.intermediate_size
    return 6 * layers * per_layer * tokens + 12 * layers * hidden * tokens * tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--checkpoint-every-steps", type=int, default=50)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--warmup-steps", type=int, default=0,
                        help="steps left out of the timing (compilation, the first kernels)")
    parser.add_argument("--torch-compile", action="store_true",
                        help="both loops compile the model (the spec's torch_compile)")
    parser.add_argument("--bert-base", action="store_true",
                        help="BERT-base's shape on synthetic full-length reviews (see above)")
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
            model, dataset = "minilm", "rotten_tomatoes"
            if args.bert_base:
                model_dir, data = prepare_bert_base(Path("runs/bench-bert-base"), args.max_length)
                model, dataset = str(model_dir.resolve()), str(data.resolve())
            # One pod: its global batch is its batch (one shard a step), as the bare loop's.
            spec = JobSpec(model=model, dataset=dataset, batch_size=args.batch_size, replicas=1,
                           max_length=args.max_length, torch_compile=args.torch_compile,
                           checkpoint_every_steps=args.checkpoint_every_steps)
            # A probe trainer provides the tokenized data and sample order the bare loop uses.
            probe_config = TrainConfig(spec, Runtime(cache_dir=Path("runs/bench-cache"),
                                                     checkpoint_dir=root / "probe"))
            device = choose_device()
            probe = Trainer(probe_config, Group(device, environ={}), Reporter("probe"))
            bare, full = [], []
            for round_ in range(args.rounds):
                bare.append(bare_loop(probe, args.steps, device, args.warmup_steps))
                runtime = Runtime(cache_dir=Path("runs/bench-cache"),
                                  checkpoint_dir=root / f"ckpt-{round_}",
                                  model_dir=root / f"model-{round_}")
                full.append(full_trainer(TrainConfig(spec, runtime), url,
                                         root / f"reports-{round_}.jsonl", args.steps,
                                         args.warmup_steps))
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
    described = ("BERT-base shape on synthetic reviews" if args.bert_base
                 else "MiniLM-L6 on Rotten Tomatoes")
    print(f"\nratio full/bare: {full_median / bare_median:.3f} (goal >= 0.95), "
          f"{args.steps} steps of batch {args.batch_size}, {described}, on {device.device}")
    if device.device.type == "cuda":
        name = torch.cuda.get_device_name(device.device)
        peak = next((flops for part, flops in BF16_PEAK_FLOPS.items() if part in name), None)
        # Each batch is padded to its longest text: the bench's batches' mean width.
        order = probe.sampler.order(0)[:args.steps * args.batch_size]
        lengths = np.diff(probe.train_data.offsets)[order]
        tokens = float(lengths.reshape(args.steps, args.batch_size).max(axis=1).mean())
        per_sample = flops_per_sample(resolve_model(spec.model, Path()), round(tokens))
        for loop, rate in (("bare", bare_median), ("full", full_median)):
            achieved = rate * per_sample
            share = f", MFU {achieved / peak:.1%} of {peak / 1e12:.0f} TFLOP/s" if peak else ""
            print(f"{loop}: {achieved / 1e12:.1f} TFLOP/s at sequence {tokens:.0f}{share} ({name})")


if __name__ == "__main__":
    main()
