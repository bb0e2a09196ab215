"""The whole model on every pod: data parallelism, the gradients averaged during the backward."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn import functional
from upath import UPath

from trainer import checkpoint, lora
from trainer.config import TrainConfig
from trainer.data import on_device
from trainer.distributed import Group
from trainer.model import classify, resolve_model, unwrap

if TYPE_CHECKING:
    from trainer.checkpointer import Save


class WholeModel:
    """The whole model, wrapped by its group for an elastic batch (DDP in a static world of
    several pods); with LoRA, only the adapters and the head train, are checkpointed and are
    healed."""

    reports_samples = True

    def __init__(self, model: nn.Module, group: Group, config: TrainConfig) -> None:
        # A fixed global batch's shards go through the bare model and are summed by
        # trainer.shards: a DDP wrapper would only cost its construction (0.2 s of a live
        # pod's start, on MiniLM) and buckets as large as the gradients.
        self.module = model if config.spec.constant_batch else group.wrap(model)
        self.group, self.config = group, config
        # Walked once: a walk of the module tree each step costs milliseconds of host time.
        self.parameters = list(self.module.parameters())
        self.lora = config.spec.finetune == "lora"

    def parameter_counts(self) -> dict[str, int] | None:
        trainable, total = lora.trainable_parameters(unwrap(self.module))
        return {"trainable": trainable, "total": total}

    def forward_backward(self, batch: Mapping[str, torch.Tensor], weight: float,
                         scale: float) -> tuple[torch.Tensor | float, float]:
        loss_sum = weight * self._summed_loss(self.module, batch)
        (loss_sum * scale).backward()
        return loss_sum.detach(), weight * len(batch["labels"])

    def shard_backward(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        # The bare model: a wrapper's backward would synchronise this shard alone.
        loss = self._summed_loss(unwrap(self.module), batch)
        loss.backward()
        return loss.detach().to(torch.float64), len(batch["labels"])

    def _summed_loss(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """`model`'s cross-entropy on `batch`, summed over its samples (in float32)."""
        batch = on_device(batch, self.group.device.device)
        with self.group.device.autocast():
            logits = classify(model, batch)
        return functional.cross_entropy(logits.float(), batch["labels"], reduction="sum")

    def sync_and_clip(self, max_norm: float) -> float:
        # The backward synchronised the gradients already (DDP, or torchft's wrapper).
        return self.clip(max_norm)

    def clip(self, max_norm: float) -> float:
        grads = [p.grad for p in self.parameters if p.grad is not None]
        total = (torch.nn.utils.clip_grad_norm_(self.parameters, max_norm)
                 if max_norm > 0 else torch.nn.utils.get_total_norm(grads))
        return float(total.item())

    def replica_totals(self, stats: torch.Tensor) -> torch.Tensor:
        return stats

    def logits(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return classify(unwrap(self.module), batch)

    def model_state(self) -> dict[str, Any]:
        """The model's state that checkpoints and heals carry: LoRA's trainable part only (the
        frozen base is the pretrained model the spec names), else all of it."""
        model = unwrap(self.module)
        return lora.trainable_state(model) if self.lora else model.state_dict()

    def load_model_state(self, state: dict[str, Any]) -> None:
        model = unwrap(self.module)
        if self.lora:
            lora.load_trainable_state(model, state)
        else:
            model.load_state_dict(state)

    def live_state(self) -> dict[str, Any]:
        return self.model_state()

    def load_live_state(self, state: dict[str, Any]) -> None:
        self.load_model_state(state)

    def save_checkpoint(self, save: Save, writer: checkpoint.CheckpointWriter) -> None:
        """The primary saves in the background, from a snapshot; where every participant must
        (an emergency, a stop), each saves at once (the same content: the first one complete
        stays)."""
        if save.everyone:
            writer.wait()
            save.done(checkpoint.save_checkpoint(
                save.directory, save.step, self.model_state(), save.trainer_state(), save.meta,
                keep=save.keep, shared=True))
        elif self.group.is_primary:
            model_state = checkpoint.cpu_copy(self.model_state())
            trainer_state = checkpoint.cpu_copy(save.trainer_state())
            writer.submit(lambda: checkpoint.save_checkpoint(
                save.directory, save.step, model_state, trainer_state, save.meta,
                keep=save.keep), save.done)

    def load_checkpoint(self, path: Path | UPath) -> dict[str, Any]:
        model_state, trainer_state, _ = checkpoint.load_checkpoint(path)
        self.load_model_state(model_state)
        return trainer_state

    def export(self) -> tuple[nn.Module, nn.Module | None]:
        """The model as is; a LoRA model with its adapters merged (and the adapters alone)."""
        if not self.lora:
            return self.module, None
        spec = self.config.spec
        model = unwrap(self.module)
        base = resolve_model(spec.model, self.config.runtime.inputs_dir, spec.model_revision)
        return lora.merged(model, spec, base), model
