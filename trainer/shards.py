"""A step of a fixed global batch, computed the same whoever takes part.

The step's window (trainer.sampler) is cut into shards of `batch_size`; the step's participants
(pods, or a pipeline's replicas) compute them between them, each shard's forward and backward
through this pod's part alone (the bare model, or the replica's pipeline; no wrapper's
collective: participants may compute different numbers of shards), its dropout drawn from
(seed, epoch, cursor, shard) alone. Each shard's float32 gradients are added into a float64 sum,
the participants' sums are added together in float64 with the step's loss (one all-reduce), and
the total is divided by the window and rounded to float32 once. The partial sums of a few
float32 values are exact in float64 (short of a 2^29 spread between one weight's shard
gradients), so the result does not depend on how the shards were split, in what order they
were added, or how many participants there were: a step computes the same gradients, hence
the same weights, whatever was killed, scaled or migrated.

The same exactness lets a step that failed be redone without computing again what this pod
already computed: where its group redoes an aborted step in the same process with the same
weights (a live pod whose peer died mid-step), the shards' sum of the failed attempt is kept, and
the redo adds only the shards it was not holding. A SIGKILL then costs the survivors the dead
pod's shards, not a whole step.

The input embedding's gradient is zero, exactly, in every row of a token none of the step's
samples holds: its sums and the all-reduce carry only the rows of the step's tokens (every pod
has the data, so all agree on them without a word), about half of MiniLM's parameters fewer.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from trainer.contract.spec import JobSpec
from trainer.data import TokenizedSplit
from trainer.distributed import Group
from trainer.model import unwrap
from trainer.part import ModelPart
from trainer.sampler import Assignment

logger = logging.getLogger(__name__)


def seed_shard(seed: int, assignment: Assignment, shard: int) -> None:
    """Dropout for shard `shard` of the step at `assignment`'s cursor, whoever computes it (an
    elastic batch's participant `r` computes its shard `r`): a step redone after a failure or
    a resume draws what it drew the first time."""
    key = (seed, assignment.epoch, assignment.cursor, shard)
    torch.manual_seed(int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=7).digest(),
                                     "little"))


@dataclass
class Attempt:
    """This pod's part of a step that may yet fail: what a redo of the same step can keep."""

    step: tuple[int, int]
    """The step's (epoch, cursor): the weights are those of its start until it commits."""
    shards: frozenset[int]
    sums: list[torch.Tensor]
    loss: torch.Tensor
    counted: int


def input_embedding(model: nn.Module, parameters: list[nn.Parameter]) -> int | None:
    """Which of `parameters` is `model`'s input embedding matrix, where a gradient reaches only
    the rows of the tokens read (an `nn.Embedding` lookup, not tied to an output layer)."""
    get_input = getattr(model, "get_input_embeddings", None)
    get_output = getattr(model, "get_output_embeddings", None)
    embedding = get_input() if callable(get_input) else None
    output = get_output() if callable(get_output) else None
    if (not isinstance(embedding, nn.Embedding) or embedding.max_norm is not None
            or getattr(output, "weight", None) is embedding.weight):
        return None
    return next((i for i, p in enumerate(parameters) if p is embedding.weight), None)


class ShardSums:
    """The gradients of the shards this pod computes in a step, summed in float64 (a pipeline
    stage's: the sums are over the stage's replicas)."""

    def __init__(self, part: ModelPart, group: Group) -> None:
        self.part, self.group = part, group
        self.parameters: list[nn.Parameter] = [p for p in unwrap(part.module).parameters()
                                               if p.requires_grad]
        self._sums: list[torch.Tensor] | None = None
        """Per parameter: the shards' gradients summed in float64, or a lone shard's mean."""
        self._loss: torch.Tensor | None = None
        """The shards' loss, summed on the device (read once, in `reduce`)."""
        self._counted = 0
        self._embedding = input_embedding(unwrap(part.module), self.parameters)
        """Which parameter is the input embedding, summed over the step's tokens' rows only."""
        self._rows: torch.Tensor | None = None
        """This step's tokens: the rows of the embedding's sums (None: every row)."""
        self._attempt: Attempt | None = None
        """The last step's shards, kept until it commits (where the group redoes steps)."""
        self.kept_shards = 0
        """Shards the last step took from its failed attempt instead of computing them."""

    def step(self, assignment: Assignment, data: TokenizedSplit, idle: bool,
             spec: JobSpec, votes: torch.Tensor | None = None) -> tuple[float, float, float]:
        """This pod's shards of the step (none while idle) summed with the other participants'
        (see `reduce`). A step of one shard (a one-pod job's, an epoch's short last step) has
        no sum to make exact: its mean is taken in float32, as plain training does."""
        lone = assignment.window <= spec.batch_size
        shards = () if idle else assignment.shards
        self._rows = (torch.from_numpy(data.tokens(assignment.window_ids).astype(np.int64)).to(
                          self.parameters[self._embedding].device)
                      if self._embedding is not None and assignment.window_ids is not None
                      and not lone else None)
        kept = self._keep(assignment, shards, lone)
        for shard, indices in shards:
            if shard not in kept:
                seed_shard(spec.seed, assignment, shard)
                self.add(data.batch(indices), assignment.window if lone else None)
        if self.group.redoes_steps and not lone and self._sums is not None:
            assert self._loss is not None
            self._attempt = Attempt((assignment.epoch, assignment.cursor),
                                    frozenset(shard for shard, _ in shards), self._sums,
                                    self._loss, self._counted)
        return self.reduce(assignment.window, spec.max_grad_norm, lone, votes)

    def _keep(self, assignment: Assignment, shards: tuple[tuple[int, object], ...],
              lone: bool) -> frozenset[int]:
        """Start from the failed attempt of this same step where it holds only shards this
        pod computes now (they are added exactly, in any order); the shards it holds."""
        attempt, self._attempt = self._attempt, None
        self.kept_shards = 0
        mine = {shard for shard, _ in shards}
        if (attempt is None or lone or attempt.step != (assignment.epoch, assignment.cursor)
                or not attempt.shards <= mine):
            return frozenset()
        self._sums, self._loss, self._counted = attempt.sums, attempt.loss, attempt.counted
        self.kept_shards = len(attempt.shards)
        logger.info("step at epoch %d, cursor %d redone: %d of its shards kept from the failed "
                    "attempt, %d computed", assignment.epoch + 1, assignment.cursor,
                    len(attempt.shards), len(mine) - len(attempt.shards))
        return attempt.shards

    def _shapes(self) -> list[torch.Size]:
        """Each parameter's sum's shape: the embedding's has the step's tokens' rows only."""
        shapes = [p.shape for p in self.parameters]
        if self._rows is not None and self._embedding is not None:
            shapes[self._embedding] = torch.Size([len(self._rows),
                                                  *shapes[self._embedding][1:]])
        return shapes

    def settled(self) -> None:
        """The step committed, or the weights changed (a heal, a resume): nothing to keep."""
        self._attempt = None

    def add(self, batch: Mapping[str, torch.Tensor], lone_window: int | None = None) -> None:
        """Forward and backward of one shard; its gradients and loss added to the step's (the
        step's mean at once where it is the step's one shard of `lone_window` samples)."""
        loss, counted = self.part.shard_backward(batch)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.parameters]
        if self._rows is not None and self._embedding is not None:
            grads[self._embedding] = grads[self._embedding].index_select(0, self._rows)
        if lone_window is not None:
            self._sums = [g.div_(lone_window) for g in grads]
        elif self._sums is None:
            self._sums = [g.to(torch.float64) for g in grads]
        else:
            for total, g in zip(self._sums, grads, strict=True):
                total.add_(g)
        for p in self.parameters:
            p.grad = None
        self._loss = loss if self._loss is None else self._loss + loss
        self._counted += counted

    def reduce(self, window: int, max_norm: float, lone: bool = False,
               votes: torch.Tensor | None = None) -> tuple[float, float, float]:
        """Sum every participant's shards (a pod that computed none adds zeros; a process that
        is the whole group has nothing to add), set each parameter's gradient to the step's
        mean, clip by the whole model's norm; (the step's loss summed over its samples, its
        samples, the gradients' norm before clipping). `votes` (float64) are summed over every
        pod of the step alike, in place (trainer.finish)."""
        shapes = self._shapes()
        sums = self._sums or [torch.zeros(shape, dtype=p.dtype if lone else torch.float64,
                                          device=p.device)
                              for p, shape in zip(self.parameters, shapes, strict=True)]
        device = sums[0].device
        stats = torch.cat([torch.stack([
            self._loss if self._loss is not None else torch.zeros((), dtype=torch.float64,
                                                                  device=device),
            torch.tensor(float(self._counted), dtype=torch.float64, device=device)]),
            torch.empty(0, dtype=torch.float64, device=device) if votes is None
            else votes.to(device)])
        self._sums, self._loss, self._counted = None, None, 0
        if not self.group.alone:  # one collective for all: float64 sums stay exact
            total = torch.cat([*(s.reshape(-1).to(torch.float64) for s in sums), stats])
            self.group.sum_exactly(total)
            sums = [part.view(shape) for part, shape in zip(
                total[:-len(stats)].split([shape.numel() for shape in shapes]), shapes,
                strict=True)]
            stats = total[-len(stats):]
        for index, (p, total) in enumerate(zip(self.parameters, sums, strict=True)):
            grad = (total if lone else total / max(window, 1)).to(p.dtype)
            if index == self._embedding and self._rows is not None:
                grad = torch.zeros_like(p).index_copy_(0, self._rows, grad)
            p.grad = grad
        norm = self.part.clip(max_norm)
        totals = self.part.replica_totals(stats)
        if votes is not None:
            votes.copy_(totals[2:])
        loss, counted = totals[:2].tolist()
        return loss, counted, norm
