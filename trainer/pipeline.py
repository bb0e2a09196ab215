"""Pipeline parallelism: a BERT-family sequence classifier cut into stages across pods.

Stage 0 holds the embeddings and the first encoder layers, the last stage the remaining layers,
the pooler and the classifier (and computes the loss); the layers are divided evenly, later
stages taking the remainder (stage 0 also runs the embeddings). Between stages travel the hidden
states and the 2-D attention mask, forward; gradients of the hidden states, backward. Each stage
builds the attention mask its layers need from the 2-D one, as the whole model does.

A step runs `microbatches` equal microbatches through torch.distributed.pipelining's schedule
(GPipe or 1F1B). Every microbatch has the same shape (the stages allocate their buffers once):
inputs are padded to `max_length` and a replica's share of a step is padded with zero-weight
rows to a fixed number of rows. The loss is a weighted sum, so the gradients equal the whole
model's on the same samples however the rows are cut.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional
from upath import UPath

from trainer import checkpoint
from trainer.distributed import Group
from trainer.model import ModelError

if TYPE_CHECKING:
    from trainer.checkpointer import Save

SCHEDULES = ("1f1b", "gpipe")


class PipelineError(ModelError):
    """A model or a spec that pipeline parallelism cannot run; the message says why."""


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The encoder layers of a BERT-architecture sequence classifier."""
    base = getattr(model, "bert", None)
    layers = getattr(getattr(base, "encoder", None), "layer", None)
    if base is None or not isinstance(layers, nn.ModuleList) or not hasattr(model, "classifier"):
        raise PipelineError(
            f"pipeline parallelism cuts BERT-architecture models (embeddings, encoder layers, "
            f"pooler, classifier); {type(model).__name__} is not one")
    return layers


def stage_layers(layers: int, stages: int) -> list[range]:
    """The encoder layers of each stage: `layers // stages` each, the last `layers % stages`
    stages one more."""
    if not 2 <= stages <= layers:
        raise PipelineError(f"pipeline_stages must be between 2 and the model's {layers} "
                            f"encoder layers, not {stages}")
    base, extra = divmod(layers, stages)
    sizes = [base + (1 if index >= stages - extra else 0) for index in range(stages)]
    starts = [sum(sizes[:index]) for index in range(stages)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


class Stage(nn.Module):
    """One stage of a cut BERT sequence classifier; it shares its parameters with the model it
    was cut from (so their names are the whole model's, see `parameter_names`)."""

    def __init__(self, model: nn.Module, index: int, stages: int) -> None:
        super().__init__()
        layers = encoder_layers(model)
        self.index, self.stages = index, stages
        self.layer_range = stage_layers(len(layers), stages)[index]
        whole: Any = model
        self.config = whole.config
        self.embeddings: nn.Module | None = whole.bert.embeddings if self.is_first else None
        self.layers = nn.ModuleList(layers[i] for i in self.layer_range)
        self.pooler: nn.Module | None = whole.bert.pooler if self.is_last else None
        self.dropout: nn.Module | None = whole.dropout if self.is_last else None
        self.classifier: nn.Module | None = whole.classifier if self.is_last else None
        if self.is_last and self.pooler is None:
            raise PipelineError("the model has no pooler: its classifier reads the pooled output")

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.stages - 1

    def forward(self, first: torch.Tensor, attention_mask: torch.Tensor
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Stage 0 takes (input_ids, attention_mask), the others (hidden states, attention
        mask); the last returns the logits, the others (hidden states, attention mask)."""
        from transformers.masking_utils import create_bidirectional_mask

        hidden = self.embeddings(input_ids=first) if self.embeddings is not None else first
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden,
                                         attention_mask=attention_mask)
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=mask)
            if isinstance(hidden, tuple):  # older transformers return (hidden, attentions...)
                hidden = hidden[0]
        if self.classifier is None:
            return hidden, attention_mask
        assert self.pooler is not None and self.dropout is not None
        return self.classifier(self.dropout(self.pooler(hidden)))


def parameter_names(model: nn.Module, stage: Stage) -> dict[str, nn.Parameter]:
    """The stage's parameters by their names in the whole model (checkpoints and exports)."""
    owned = {id(p) for p in stage.parameters()}
    return {name: p for name, p in model.named_parameters() if id(p) in owned}


def weighted_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The loss of one microbatch: `target` holds (label, weight) rows; weight 0 is padding,
    and the weights carry the step's scaling (see `targets`)."""
    labels, weights = target[:, 0].long(), target[:, 1]
    losses = functional.cross_entropy(logits.float(), labels, reduction="none")
    return (losses * weights).sum()


def targets(labels: torch.Tensor, weight: float, rows: int) -> torch.Tensor:
    """(label, weight) rows for `labels`, padded to `rows` with weight-0 rows."""
    target = torch.zeros((rows, 2), dtype=torch.float32)
    target[:len(labels), 0] = labels.float()
    target[:len(labels), 1] = weight
    return target


def pad_rows(tensor: torch.Tensor, rows: int, value: int = 0) -> torch.Tensor:
    """`tensor` with rows of `value` appended up to `rows`."""
    missing = rows - tensor.shape[0]
    if missing <= 0:
        return tensor
    padding = torch.full((missing, *tensor.shape[1:]), value, dtype=tensor.dtype)
    return torch.cat([tensor, padding])


def pad_columns(tensor: torch.Tensor, width: int, value: int = 0) -> torch.Tensor:
    """`tensor` (rows x columns) padded with `value` to `width` columns."""
    return functional.pad(tensor, (0, width - tensor.shape[1]), value=value)


def build_schedule(stage_module: Stage, device: torch.device, group: Any, schedule: str,
                   microbatches: int, stage_ranks: list[int] | None = None) -> Any:
    """torch.distributed.pipelining's schedule for this pod's stage over `group` (the pods of
    one pipeline replica); `stage_ranks`: each stage's rank in `group` (by default, its
    index)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    if schedule not in SCHEDULES:
        raise PipelineError(f"schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}")
    stage = PipelineStage(stage_module, stage_module.index, stage_module.stages, device,
                          group=group)
    if stage_ranks is not None:  # single-stage schedules keep the stage's own mapping
        stage.stage_index_to_group_rank = dict(enumerate(stage_ranks))
    kind = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    # Every stage names the loss (a schedule without one runs no backward); the last computes
    # it. It carries its own scaling (the weights): the schedule must not average it again.
    return kind(stage, microbatches, loss_fn=weighted_loss, scale_grads=False)


def run_step(schedule: Any, stage_module: Stage, input_ids: torch.Tensor,
             attention_mask: torch.Tensor, target: torch.Tensor) -> float | None:
    """One step's forward and backward through the pipeline; the last stage returns the summed
    loss of its microbatches, the others None."""
    if stage_module.is_first:
        schedule.step(input_ids, attention_mask)
        return None
    if stage_module.is_last:
        losses: list[torch.Tensor] = []
        schedule.step(target=target, losses=losses)
        return float(sum(loss.detach() for loss in losses))
    schedule.step()
    return None


def check_microbatches(batch_size: int, microbatches: int) -> None:
    if batch_size % microbatches:
        raise PipelineError(f"microbatches ({microbatches}) must divide batch_size "
                            f"({batch_size})")


class Pipelined:
    """What a pipeline needs of its group: this pod's stage, the group of its replica's stages
    (`pipeline_group`, where stage s has rank `stage_ranks[s]`) and a way to average a stage's
    gradients over the replicas."""

    stage: int
    stages: int
    pipeline_group: Any
    stage_ranks: list[int]

    def average_over_replicas(self, flat: torch.Tensor) -> None:
        """Average `flat` (this stage's gradients) in place over the step's replicas."""
        raise NotImplementedError


class PipelineModel:
    """This pod's stage of the model as the training loop's part (trainer.part), and a training
    step through its pipeline: the schedule runs forward and backward, then the stage's
    gradients are averaged over the replicas and clipped by the norm of the whole model's."""

    WIDTH_STEP = 8
    """Inputs are padded to a multiple of this many tokens: each width has its own schedule
    (the stages size their buffers once), so there are few."""

    def __init__(self, model: nn.Module, group: Group, schedule: str,
                 microbatches: int, rows: int, max_length: int,
                 fresh_model: Callable[[], nn.Module] | None = None) -> None:
        """`fresh_model` builds the whole model that the export loads the stages' weights
        into."""
        if not isinstance(group, Pipelined):
            raise TypeError(f"a pipeline needs a pipeline's group, not a {type(group).__name__}")
        check_microbatches(rows, microbatches)
        stage = Stage(model, group.stage, group.stages)
        whole = {id(value): name for name, value in model.state_dict(keep_vars=True).items()}
        self.names = {local: whole[id(value)]
                      for local, value in stage.state_dict(keep_vars=True).items()}
        """The stage's state names -> the whole model's (checkpoints, export)."""
        self.stage = stage.to(group.device.device)
        self.module: nn.Module = self.stage
        self.fresh_model = fresh_model
        self.group, self.schedule_name, self.microbatches = group, schedule, microbatches
        # Inputs are never padded past what the model embeds.
        self.rows = rows
        self.max_length = min(max_length, int(stage.config.max_position_embeddings))
        self._schedules: dict[int, Any] = {}

    @property
    def reports_samples(self) -> bool:
        """A replica's stages train on the same samples: its last stage reports them."""
        return self.stage.is_last

    def parameter_counts(self) -> dict[str, int] | None:
        return None  # a stage's counts are not the model's

    @property
    def shard(self) -> str:
        """This stage's name in a checkpoint."""
        return f"stage-{self.stage.index}"

    @property
    def shards(self) -> list[str]:
        return [f"stage-{index}" for index in range(self.stage.stages)]

    def model_state(self) -> dict[str, torch.Tensor]:
        """The stage's state under the whole model's names."""
        return {self.names[local]: value for local, value in self.stage.state_dict().items()}

    def load_model_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load the stage's part of `state` (the whole model's names; other stages' entries,
        if any, are left alone)."""
        missing = [whole for whole in self.names.values() if whole not in state]
        if missing:
            raise ValueError(f"{self.shard}: the state lacks {missing[:3]}")
        self.stage.load_state_dict({local: state[whole] for local, whole in self.names.items()})

    def live_state(self) -> dict[str, Any]:
        # Under the stage's own names: a peer's same stage loads it.
        return self.stage.state_dict()

    def load_live_state(self, state: dict[str, Any]) -> None:
        self.stage.load_state_dict(state)

    def save_checkpoint(self, save: Save, writer: checkpoint.CheckpointWriter) -> None:
        """At once: replica 0's stages each write their shard, then the primary completes the
        checkpoint once all have (every pod passes the barrier). No survivor of a failure can
        write a lost stage's shard: pipelines save no emergency checkpoints. A replica that
        healed in this step counts as rank 0 without being replica 0: it writes nothing (its
        shards would race replica 0's completion of the same staging directory)."""
        if self.group.rank == 0 and not self.group.healing:
            checkpoint.save_shard(save.directory, save.step, self.shard, self.model_state(),
                                  save.trainer_state())
        self.group.barrier()
        if self.group.is_primary:
            save.done(checkpoint.complete_shards(save.directory, save.step, self.shards,
                                                 save.meta, keep=save.keep))

    def load_checkpoint(self, path: Path | UPath) -> dict[str, Any]:
        model_state, trainer_state = checkpoint.load_shard(path, self.shard)
        self.load_model_state(model_state)
        return trainer_state

    def export(self) -> tuple[nn.Module, nn.Module | None] | None:
        """The whole model, assembled from the stages on the primary (None on the others)."""
        state = self.gather_state()
        if state is None:
            return None
        if self.fresh_model is None:
            raise ValueError("this pipeline was built without a model to export into")
        whole = self.fresh_model()
        whole.load_state_dict(state)
        return whole, None

    def gather_state(self) -> dict[str, torch.Tensor] | None:
        """The whole model's state, assembled from the first replica's stages (rank 0) on its
        stage 0 (the primary); None elsewhere. Every pod of that replica must call it; the others
        need not."""
        if self.group.rank != 0:
            return None
        parts: list[Any] | None = [None] * self.stage.stages if self.stage.is_first else None
        dist.gather_object(checkpoint.cpu_copy(self.model_state()), parts,
                           group=self.group.pipeline_group, group_dst=self.group.stage_ranks[0])
        if parts is None:
            return None
        return {name: value for part in parts for name, value in part.items()}

    def width(self, needed: int) -> int:
        return min(self.max_length, -(-needed // self.WIDTH_STEP) * self.WIDTH_STEP)

    def forward_backward(self, batch: Mapping[str, torch.Tensor], weight: float,
                         scale: float) -> tuple[float, float]:
        """Run the step's microbatches (every sample's loss scaled by `weight` x `scale`): the
        last stage holds the loss and counts the samples, the others count none."""
        step_weight = weight * scale
        with self.group.device.autocast():
            loss = self._run_step(batch, step_weight)
        loss_sum = loss / step_weight if loss is not None and step_weight else 0.0
        counted = weight * len(batch["labels"]) if self.stage.is_last else 0.0
        return weight * loss_sum, counted

    def _run_step(self, batch: Mapping[str, torch.Tensor], weight: float) -> float | None:
        width = self.width(batch["input_ids"].shape[1])
        input_ids = pad_rows(pad_columns(batch["input_ids"], width), self.rows)
        mask = pad_rows(pad_columns(batch["attention_mask"], width), self.rows)
        device = self.group.device.device
        target = targets(batch["labels"], weight, self.rows).to(device)
        schedule = self._schedules.get(width)
        if schedule is None:
            schedule = self._schedules[width] = build_schedule(
                self.stage, device, self.group.pipeline_group, self.schedule_name,
                self.microbatches, self.group.stage_ranks)
        return run_step(schedule, self.stage, input_ids.to(device), mask.to(device), target)

    @torch.no_grad()
    def logits(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        """Forward only, stage to stage: the last stage returns the logits, the others None.
        Every stage of a replica loads the same batch, so each knows the shapes it receives.
        A batch left without its mask (no row padded) attends to every position."""
        stage, group, ranks = self.stage, self.group.pipeline_group, self.group.stage_ranks
        device = self.group.device.device
        input_ids = batch["input_ids"].to(device)
        mask = (batch["attention_mask"].to(device) if "attention_mask" in batch
                else torch.ones_like(input_ids))
        if stage.is_first:
            first = input_ids
        else:
            first = torch.empty((*input_ids.shape, stage.config.hidden_size), device=device)
            dist.recv(first, group=group, group_src=ranks[stage.index - 1])
        output = stage(first, mask)
        if isinstance(output, torch.Tensor):
            return output
        dist.send(output[0].float().contiguous(), group=group, group_dst=ranks[stage.index + 1])
        return None

    def shard_backward(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """One shard through the replica's pipeline (a collective of its stages only): the
        last stage holds its loss and counts its samples."""
        with self.group.device.autocast():
            loss = self._run_step(batch, 1.0)
        last = self.stage.is_last
        return (torch.tensor(loss if loss is not None else 0.0, dtype=torch.float64,
                             device=self.group.device.device),
                len(batch["labels"]) if last else 0)

    def sync_and_clip(self, max_norm: float) -> float:
        """Average the gradients over the stage's replicas; clip by the whole model's norm and
        return it (the same on every stage of every replica)."""
        grads = [p.grad for p in self.stage.parameters() if p.grad is not None]
        if grads:
            flat = torch.cat([g.flatten() for g in grads])
            self.group.average_over_replicas(flat)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        return self.clip(max_norm)

    def clip(self, max_norm: float) -> float:
        """Clip by the whole model's norm: the stages' squares summed over the pipeline."""
        grads = [p.grad for p in self.stage.parameters() if p.grad is not None]
        squares = torch.stack([g.float().pow(2).sum() for g in grads]).sum() if grads else (
            torch.zeros((), device=self.group.device.device))
        dist.all_reduce(squares, group=self.group.pipeline_group)
        norm = squares.sqrt()
        if max_norm > 0:
            coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            for g in grads:
                g.mul_(coefficient.to(g.dtype))
        return float(norm.item())

    def replica_totals(self, stats: torch.Tensor) -> torch.Tensor:
        """The last stage's (loss, samples), summed over the step's replicas already, for every
        stage of the replica (the others hold zeros)."""
        dist.all_reduce(stats, group=self.group.pipeline_group)
        return stats
