"""Checkpoint writes to each artifact store against the local filesystem: write time, and the
stall they cause the training loop.

MiniLM-L6 (the offline default) with AdamW state after a step: the trainer's own checkpoint of
it (`trainer.checkpoint.save_checkpoint`: model, optimizer state, marker) to
- a local directory (the baseline),
- Azure Blob through adlfs, against a real Azurite on 127.0.0.1,
- S3 through obstore, against moto's real S3 server on 127.0.0.1
(both servers from tests/stores; `make test-setup` installs them).
Per store:
- write time: the median of --writes synchronous writes, as a ratio to the local one;
- training stall: a loop of --steps training steps (batch 16 x 64 tokens) that checkpoints every
  --every steps the trainer's way (a CPU snapshot in the loop, the write in the background,
  CheckpointWriter), against the same loop without checkpoints, interleaved over --rounds: the
  extra seconds per checkpoint, and the part of it the loop spent blocked (snapshot, and waiting
  for the previous write).

    PYTHONPATH=. .venv/bin/python -m bench.stores [--writes 3] [--steps 30] [--every 10]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from upath import UPath

from tests.stores import SERVERS, StoreServer
from trainer.checkpoint import CheckpointWriter, cpu_copy, save_checkpoint
from trainer.contract.artifact_store import location, size
from trainer.model import load_model, offline_model_dir


def training(seed: int = 0) -> tuple[Any, torch.optim.Optimizer, Callable[[], None]]:
    torch.manual_seed(seed)
    model = load_model(str(offline_model_dir()), seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(1000, 20000, (16, 64))
    labels = torch.randint(0, 2, (16,))

    def step() -> None:
        optimizer.zero_grad()
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()

    step()  # AdamW's state exists from here on
    return model, optimizer, step


def write_seconds(directory: Path | UPath, model: Any, optimizer: Any, writes: int,
                  ) -> tuple[float, int]:
    """Median seconds of a synchronous checkpoint write; the checkpoint's bytes."""
    times = []
    state, trainer_state = cpu_copy(model.state_dict()), {"optimizer": optimizer.state_dict()}
    for step in range(1, writes + 1):
        started = time.perf_counter()
        info = save_checkpoint(directory, step, state, trainer_state, {}, keep=1)
        times.append(time.perf_counter() - started)
    return statistics.median(times), size(info.path)


def loop(directory: Path | UPath | None, model: Any, optimizer: Any, step: Callable[[], None],
         steps: int, every: int) -> tuple[float, float, int]:
    """(loop seconds, seconds blocked in checkpointing, checkpoints) of `steps` steps."""
    writer, blocked, saved = CheckpointWriter(), 0.0, 0
    started = time.perf_counter()
    for number in range(1, steps + 1):
        step()
        if directory is not None and number % every == 0:
            before = time.perf_counter()
            state = cpu_copy(model.state_dict())
            trainer_state = cpu_copy({"optimizer": optimizer.state_dict()})
            writer.submit(functools.partial(save_checkpoint, directory, number, state,
                                            trainer_state, {}, keep=1), lambda _: None)
            blocked += time.perf_counter() - before
            saved += 1
    writer.wait()  # the last write counts too: training would go on meanwhile
    return time.perf_counter() - started, blocked, saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the second core uploads, as in a pod beside its peers

    servers: list[StoreServer] = []
    try:
        for kind in SERVERS.values():
            binary = kind.installed()
            if binary is None:
                raise SystemExit(f"{kind.missing}: the bench uses the tests' servers")
            servers.append(kind(binary).start())
        kinds = {server.kind: server.store() for server in servers}
        for store in kinds.values():
            os.environ.update(store.env)
        model, optimizer, step = training()
        with tempfile.TemporaryDirectory(prefix="bench-stores-") as scratch:
            stores: dict[str, Path | UPath] = {
                "local": Path(scratch) / "checkpoints",
                **{kind: location(store.new_location("bench") + "/checkpoints")
                   for kind, store in kinds.items()}}
            print(f"MiniLM-L6 + AdamW checkpoint, {args.writes} writes per store; loop of "
                  f"{args.steps} steps, a checkpoint every {args.every}; {args.rounds} rounds")
            written = {name: write_seconds(where, model, optimizer, args.writes)
                       for name, where in stores.items()}
            runs: dict[str, list[tuple[float, float, int]]] = {n: [] for n in ("none", *stores)}
            for _ in range(args.rounds):
                for name in ("none", *stores):
                    runs[name].append(loop(stores.get(name), model, optimizer, step,
                                           args.steps, args.every))
        bare = statistics.median(seconds for seconds, _, _ in runs["none"])
        print(f"loop without checkpoints: {bare:.2f} s ({args.steps / bare:.2f} steps/s)")
        print(f"{'store':<7} {'bytes':>12} {'write s':>8} {'ratio':>6} {'stall s/ckpt':>13} "
              f"{'ratio':>6} {'blocked s/ckpt':>15}")
        stalls = {}
        for name in stores:
            seconds = statistics.median(s for s, _, _ in runs[name])
            saved = runs[name][0][2]
            stalls[name] = max(0.0, seconds - bare) / saved
            blocked = statistics.median(b for _, b, _ in runs[name]) / saved
            checkpoint_bytes, base = written[name][1], written["local"][0]
            print(f"{name:<7} {checkpoint_bytes:>12,} {written[name][0]:>8.2f} "
                  f"{written[name][0] / base:>6.2f} {stalls[name]:>13.3f} "
                  f"{stalls[name] / max(stalls['local'], 1e-3):>6.2f} {blocked:>15.3f}")
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    main()
