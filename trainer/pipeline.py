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

from typing import Any

import torch
from torch import nn
from torch.nn import functional

SCHEDULES = ("1f1b", "gpipe")


class PipelineError(ValueError):
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
                   microbatches: int) -> Any:
    """torch.distributed.pipelining's schedule for this pod's stage over `group` (the pods of
    one pipeline replica, ranked by stage)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    if schedule not in SCHEDULES:
        raise PipelineError(f"schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}")
    stage = PipelineStage(stage_module, stage_module.index, stage_module.stages, device,
                          group=group)
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

