"""torchrun's static world cut into pipelines (trainer.pipeline), and its recovery rules."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.distributed import Group
from trainer.model import DeviceChoice
from trainer.pipeline import Pipelined, PipelineError
from trainer.recovery import Recovery


class PipelineRecovery(Recovery):
    """Restart mode for pipelines: a checkpoint needs every stage's shard, so a failure
    restarts the world from the newest complete one (no survivor can write the dead stage's)."""

    def saves_on_failure(self, participants: int) -> bool:
        return False


class PipelineGroup(Group, Pipelined):
    """torchrun's static world cut into pipelines: the pod with ordinal o is stage `o % stages`
    of pipeline replica `o // stages`, whatever rank the rendezvous gave it (so a restarted pod
    keeps its stage, and the API shows each pod's). To the training loop each replica is one
    participant (`rank` is the replica): a replica's stages train on the same samples."""

    recovery = PipelineRecovery

    def __init__(self, device: DeviceChoice, stages: int,
                 environ: Mapping[str, str] = os.environ, address: str = "",
                 ordinal: int | None = None, peer_secret: str = "") -> None:
        super().__init__(device, environ, address, peer_secret)
        world = self.world_size
        if world % stages or world < stages:
            raise PipelineError(f"a world of {world} pods does not make pipelines of "
                                f"{stages} stages")
        self.stages, self.replicas = stages, world // stages
        ordinals: list[Any] = [None] * world
        dist.all_gather_object(ordinals, self._rank if ordinal is None else ordinal)
        if sorted(ordinals) != list(range(world)):
            raise PipelineError(f"the pods' ordinals {sorted(ordinals)} are not 0..{world - 1}")
        position = ordinals[self._rank]
        self.stage, self.replica = position % stages, position // stages
        rank_of = {o: g for g, o in enumerate(ordinals)}
        pipelines = [[rank_of[r * stages + s] for s in range(stages)]
                     for r in range(self.replicas)]
        # Every rank creates every group, in the same order (torch.distributed's rule).
        self.pipeline_group = [dist.new_group(ranks) for ranks in pipelines][self.replica]
        self.stage_group = [dist.new_group([pipeline[s] for pipeline in pipelines])
                            for s in range(stages)][self.stage]
        # A group ranks its members by global rank, not by stage.
        mine = pipelines[self.replica]
        self.stage_ranks = [sorted(mine).index(g) for g in mine]
        """The rank in `pipeline_group` of each stage."""

    @property
    def rank(self) -> int:
        return self.replica

    @property
    def participants(self) -> int:
        return self.replicas

    @property
    def is_primary(self) -> bool:
        # The pod the whole model is gathered on (stage 0 of replica 0: `gather_state`), which
        # exports it: a restart's rendezvous may give global rank 0 to any pod.
        return self.replica == 0 and self.stage == 0

    def wrap(self, model: nn.Module) -> nn.Module:
        return model  # gradients are averaged over a stage's replicas by PipelineModel

    def average_over_replicas(self, flat: torch.Tensor) -> None:
        self.sum_exactly(flat)
        if self.replicas > 1:
            flat /= self.replicas

    @property
    def alone(self) -> bool:
        return self.replicas == 1  # the stage's sums are over its replicas

    def sum_exactly(self, values: torch.Tensor) -> torch.Tensor:
        if self.replicas > 1:
            dist.all_reduce(values, op=dist.ReduceOp.SUM, group=self.stage_group)
        return values
