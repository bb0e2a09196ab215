"""Accuracy, loss and F1 of the model over a split, sharded across a group's participants."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from trainer.data import TokenizedSplit
from trainer.distributed import Group

Forward = Callable[[Mapping[str, torch.Tensor]], torch.Tensor | None]
"""A batch's logits; None where another process computes them (a pipeline's earlier stages)."""


def model_forward(model: nn.Module) -> Forward:
    def forward(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        logits: torch.Tensor = model(input_ids=batch["input_ids"],
                                     attention_mask=batch["attention_mask"]).logits
        return logits
    return forward


@torch.no_grad()
def evaluate(model: nn.Module, data: TokenizedSplit, group: Group, batch_size: int,
             forward: Forward | None = None) -> dict[str, float]:
    """accuracy, loss, f1 (of the positive class) and samples; every participant gets the sums.

    Participants evaluate disjoint shards where the group allows it (a static world), else each
    evaluates the whole split (a live group: a peer may vanish mid-evaluation). `forward`
    computes the logits (by default `model`'s); where it returns None, this process adds
    nothing to the sums.
    """
    model.eval()
    forward = forward or model_forward(model)
    device = group.device
    rank, participants = (group.rank, group.participants) if group.shards_evaluation else (0, 1)
    shard = np.arange(rank, len(data), participants)
    # loss sum, correct, count, true positives, false positives, false negatives
    totals = torch.zeros(6, dtype=torch.float64)
    for start in range(0, len(shard), batch_size):
        batch = {k: v.to(device.device) for k, v in data.batch(shard[start:start + batch_size])
                 .items()}
        with device.autocast():
            output = forward(batch)
        if output is None:
            continue
        logits = output.float()
        labels, predicted = batch["labels"], logits.argmax(-1)
        totals += torch.tensor([
            functional.cross_entropy(logits, labels, reduction="sum").item(),
            (predicted == labels).sum().item(), len(labels),
            ((predicted == 1) & (labels == 1)).sum().item(),
            ((predicted == 1) & (labels == 0)).sum().item(),
            ((predicted == 0) & (labels == 1)).sum().item()], dtype=torch.float64)
    loss, correct, count, tp, fp, fn = group.all_reduce_sum(totals).tolist()
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0
    return {"accuracy": correct / max(count, 1), "loss": loss / max(count, 1), "f1": f1,
            "samples": int(count)}
