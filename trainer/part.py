"""What the training loop needs of the model this pod trains, whatever part of it the pod holds:
the whole model (trainer.whole) or one stage of a pipeline (trainer.pipeline); and which one a
pod trains."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from upath import UPath

from trainer.model import load_model, model_labels, resolve_model
from trainer.pipeline import Pipelined, PipelineModel
from trainer.whole import WholeModel

if TYPE_CHECKING:
    from trainer.checkpoint import CheckpointWriter
    from trainer.checkpointer import Save
    from trainer.config import TrainConfig
    from trainer.distributed import Group


class ModelPart(Protocol):
    """This pod's part of the model, and how a step, an evaluation, a checkpoint, a heal and
    the export go through it."""

    module: nn.Module
    """What this pod trains: the whole model (wrapped for data parallelism) or its stage."""

    @property
    def reports_samples(self) -> bool:
        """Whether this pod reports the ids of the samples it trained on."""

    def parameter_counts(self) -> dict[str, int] | None:
        """The model's trainable and total parameter counts; None where the pod cannot tell."""

    def forward_backward(self, batch: Mapping[str, torch.Tensor], weight: float,
                         scale: float) -> tuple[torch.Tensor | float, float]:
        """Forward and backward of this pod's share of a step: (the loss summed over the
        share's samples, the samples counted), both times `weight` (0: a share that only joins
        the collectives); the gradients are those of that loss times `scale`. The loss may be
        a tensor still on the device: reading it waits for the step."""

    def sync_and_clip(self, max_norm: float) -> float:
        """Synchronise the gradients over the step's participants, clip them by the whole
        model's norm (none where `max_norm` is 0) and return the norm before clipping."""

    def shard_backward(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """Forward and backward of one shard of a fixed global batch (trainer.shards) through
        this pod's part alone, with no collective over the participants: (its loss summed over
        its samples, a float64 tensor on the device, and its samples; both 0 on a pipeline
        stage that does not hold the loss). Its gradients are left in the parameters'
        `.grad`."""

    def clip(self, max_norm: float) -> float:
        """Clip the gradients, the step's already, by the whole model's norm (none where
        `max_norm` is 0); the norm before clipping."""

    def replica_totals(self, stats: torch.Tensor) -> torch.Tensor:
        """The step's (loss, samples) as this pod reports them, from what its sums hold: the
        same, or (a pipeline's stages) the stage that holds the loss's."""

    def logits(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        """Evaluation's forward: the logits, or None where another pod computes them."""

    def live_state(self) -> dict[str, Any]:
        """The model's part of what a pod that (re)joins a live group fetches from a peer."""

    def load_live_state(self, state: dict[str, Any]) -> None: ...

    def save_checkpoint(self, save: Save, writer: CheckpointWriter) -> None:
        """Write this pod's part of checkpoint `save` (in the background through `writer`
        where it can) and report it by `save.done` where the checkpoint is complete."""

    def load_checkpoint(self, path: Path | UPath) -> dict[str, Any]:
        """Load this pod's part of the model from a complete checkpoint; its trainer state."""

    def export(self) -> tuple[nn.Module, nn.Module | None] | None:
        """The whole model to export and, for LoRA, the adapters alone; None on a pod that
        exports nothing. Every pod calls it (a pipeline assembles the model collectively)."""


def build_part(model: nn.Module, group: Group, config: TrainConfig) -> ModelPart:
    """The part of `model` this pod trains: its pipeline stage in a pipeline's group (the rest
    is dropped: other pods hold it), else the whole model."""
    if not isinstance(group, Pipelined):
        return WholeModel(model, group, config)
    spec, inputs_dir, labels = config.spec, config.runtime.inputs_dir, model_labels(model)
    return PipelineModel(model, group, spec.schedule, spec.microbatches, spec.batch_size,
                         spec.max_length,
                         lambda: load_model(resolve_model(spec.model, inputs_dir,
                                                          spec.model_revision),
                                            spec.seed, labels=labels))
