"""Accuracy, loss and F1 of the model over a split, sharded across a group's participants."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from trainer.data import TokenizedSplit, on_device
from trainer.distributed import Group
from trainer.model import classify

Forward = Callable[[Mapping[str, torch.Tensor]], torch.Tensor | None]
"""A batch's logits; None where another process computes them (a pipeline's earlier stages)."""


@torch.no_grad()
def evaluate(model: nn.Module, data: TokenizedSplit, group: Group, batch_size: int,
             forward: Forward | None = None, classes: int = 2) -> dict[str, float]:
    """accuracy, loss, f1 and samples; every participant gets the sums. f1 is the positive
    class's with two labels, else the mean over the labels (macro F1).

    Participants evaluate disjoint shards where the group allows it (a static world), else each
    evaluates the whole split (a live group: a peer may vanish mid-evaluation). `forward`
    computes the logits (by default `model`'s); where it returns None, this process adds
    nothing to the sums.
    """
    model.eval()
    forward = forward or functools.partial(classify, model)
    device = group.device
    rank, participants = (group.rank, group.participants) if group.shards_evaluation else (0, 1)
    shard = np.arange(rank, len(data), participants)
    # loss sum, correct, count, then per label: true positives, false positives, false negatives
    totals = torch.zeros(3 + 3 * classes, dtype=torch.float64)
    labels_range = torch.arange(classes, device=device.device)
    for start in range(0, len(shard), batch_size):
        batch = on_device(data.batch(shard[start:start + batch_size]), device.device)
        with device.autocast():
            output = forward(batch)
        if output is None:
            continue
        logits = output.float()
        labels, predicted = batch["labels"], logits.argmax(-1)
        hit, said = labels[:, None] == labels_range, predicted[:, None] == labels_range
        totals += torch.cat([torch.tensor([
            functional.cross_entropy(logits, labels, reduction="sum").item(),
            (predicted == labels).sum().item(), len(labels)], dtype=torch.float64),
            torch.stack([(said & hit).sum(0), (said & ~hit).sum(0), (~said & hit).sum(0)], 1)
            .flatten().double().cpu()])
    summed = group.all_reduce_sum(totals).tolist()
    loss, correct, count = summed[:3]
    scores = [2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0
              for tp, fp, fn in zip(summed[3::3], summed[4::3], summed[5::3], strict=True)]
    f1 = scores[1] if classes == 2 else sum(scores) / classes
    return {"accuracy": correct / max(count, 1), "loss": loss / max(count, 1), "f1": f1,
            "samples": int(count)}
