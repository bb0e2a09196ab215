"""A step of a fixed global batch, computed the same whoever takes part.

The step's window (trainer.sampler) is cut into shards of `batch_size`; the step's participants
compute them between them, each shard's forward and backward on the bare model (no wrapper's
collective: participants may compute different numbers of shards), its dropout drawn from
(seed, epoch, cursor, shard) alone. Each shard's float32 gradients are added into a float64 sum,
the participants' sums are added together in float64 with the step's loss (one all-reduce), and
the total is divided by the window and rounded to float32 once. The partial sums of a few
float32 values are exact in float64 (short of a 2^29 spread between one weight's shard
gradients), so the result does not depend on how the shards were split, in what order they
were added, or how many participants there were: a step computes the same gradients, hence
the same weights, whatever was killed, scaled or migrated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional

from trainer.contract.spec import JobSpec
from trainer.data import TokenizedSplit
from trainer.distributed import Group
from trainer.sampler import Assignment


def seed_shard(seed: int, assignment: Assignment, shard: int) -> None:
    """Dropout for shard `shard` of the step at `assignment`'s cursor, whoever computes it (an
    elastic batch's participant `r` computes its shard `r`): a step redone after a failure or
    a resume draws what it drew the first time."""
    key = (seed, assignment.epoch, assignment.cursor, shard)
    torch.manual_seed(int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=7).digest(),
                                     "little"))


class ShardSums:
    """The gradients of the shards this pod computes in a step, summed in float64."""

    def __init__(self, model: nn.Module, group: Group) -> None:
        self.model, self.group = model, group
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.size = sum(p.numel() for p in self.parameters)
        self._sum: torch.Tensor | None = None
        self._loss, self._counted = 0.0, 0.0

    def step(self, assignment: Assignment, data: TokenizedSplit, idle: bool,
             spec: JobSpec) -> tuple[float, float, float]:
        """This pod's shards of the step (none while idle) summed with the other participants'
        (see `reduce`)."""
        for shard, indices in () if idle else assignment.shards:
            seed_shard(spec.seed, assignment, shard)
            self.add(data.batch(indices))
        return self.reduce(assignment.window, spec.max_grad_norm)

    def add(self, batch: Mapping[str, torch.Tensor]) -> None:
        """Forward and backward of one shard; its gradients and loss added to the step's."""
        device = self.group.device.device
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with self.group.device.autocast():
            logits = self.model(input_ids=batch["input_ids"],
                                attention_mask=batch["attention_mask"]).logits
        loss = functional.cross_entropy(logits.float(), batch["labels"], reduction="sum")
        loss.backward()
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.parameters]).to(torch.float64)
        self._sum = flat if self._sum is None else self._sum.add_(flat)
        for p in self.parameters:
            p.grad = None
        self._loss += float(loss)
        self._counted += len(batch["labels"])

    def reduce(self, window: int, max_norm: float) -> tuple[float, float, float]:
        """Sum every participant's shards (a pod that computed none adds zeros), set each
        parameter's gradient to the step's mean, clip; (the step's loss summed over its
        samples, its samples, the gradients' norm before clipping)."""
        device = self.group.device.device
        total = torch.cat([
            self._sum if self._sum is not None else torch.zeros(self.size, dtype=torch.float64,
                                                                device=device),
            torch.tensor([self._loss, self._counted], dtype=torch.float64, device=device)])
        self._sum, self._loss, self._counted = None, 0.0, 0.0
        self.group.sum_exactly(total)
        mean = total[:self.size] / max(window, 1)
        offset = 0
        for p in self.parameters:
            p.grad = mean[offset:offset + p.numel()].view_as(p).to(p.dtype)
            offset += p.numel()
        norm = (torch.nn.utils.clip_grad_norm_(self.parameters, max_norm) if max_norm > 0
                else torch.nn.utils.get_total_norm([mean]))
        loss, counted = total[self.size:].tolist()
        return loss, counted, float(norm.item())
