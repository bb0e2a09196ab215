"""LoRA fine-tuning with peft: low-rank adapters on chosen modules, the classifier head trained
whole, the rest of the model frozen.

Only the trainable state moves: the optimizer covers it, the replicas all-reduce its gradients
(DDP skips frozen parameters), a checkpoint holds it with a reference to the base model, a
rejoining pod fetches just it, and the export merges the adapters into an ordinary model or
saves them alone.

With `quantization: "8bit"` the frozen base model's linear layers are held in int8
(bitsandbytes' LLM.int8()) on a CUDA device, a quarter of their float32 memory; the adapters
and the head train in float32. The export merges the adapters into the float32 base, an
ordinary model.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Collection, Mapping

import torch
from torch import nn

from trainer.contract.spec import JobSpec
from trainer.model import ModelError, load_model, model_labels

QUANTIZED_DEVICES = ("cuda",)
"""Device types an 8-bit base model trains on. (bitsandbytes also runs LLM.int8() on the
CPU, far slower than float32 there: the tests use it, the product does not; see
Runtime.quantize_on_cpu.)"""


class LoraError(ModelError):
    """The spec's LoRA settings do not fit the model (an unknown target module)."""


def module_names(model: nn.Module) -> set[str]:
    """The last part of every module's name: what `target_modules` may name."""
    return {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name}


def check_targets(model: nn.Module, targets: list[str]) -> None:
    """Every target must name some module of the model (peft refuses only when none does)."""
    known = {name for name, _ in model.named_modules() if name}
    unknown = [target for target in targets
               if not any(name == target or name.endswith(f".{target}") for name in known)]
    if unknown:
        raise LoraError(f"target_modules: {', '.join(map(repr, unknown))} not in the model "
                        f"(its modules include {', '.join(sorted(module_names(model))[:12])})")


def apply_lora(model: nn.Module, spec: JobSpec) -> nn.Module:
    """`model` with adapters on `spec.lora.target_modules`; only they and the head train."""
    from peft import LoraConfig, TaskType, get_peft_model

    settings = spec.lora
    check_targets(model, settings.target_modules)
    config = LoraConfig(task_type=TaskType.SEQ_CLS, r=settings.r, lora_alpha=settings.alpha,
                        lora_dropout=settings.dropout,
                        target_modules=list(settings.target_modules))
    try:
        adapted: nn.Module = get_peft_model(model, config)
    except ValueError as exc:  # a target of a type peft cannot adapt
        raise LoraError(f"target_modules: {exc}") from None
    return adapted


def check_quantization(spec: JobSpec, device: torch.device,
                       devices: Collection[str] = QUANTIZED_DEVICES) -> None:
    """An 8-bit base model needs bitsandbytes and a CUDA device (one of `devices`' types): say
    which one is missing."""
    if spec.quantization == "none":
        return
    if device.type not in devices:
        raise LoraError(f"quantization: an 8-bit base model needs CUDA and bitsandbytes, and "
                        f"this pod runs on {device.type}")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise LoraError("quantization: an 8-bit base model needs bitsandbytes "
                        "(pip install bitsandbytes)")


def prepare_quantized(model: nn.Module, spec: JobSpec) -> nn.Module:
    """An 8-bit model made ready for adapters: its remaining float weights in float32, its
    inputs' gradients on (what checkpointed layers need), checkpointing as the spec says."""
    from peft import prepare_model_for_kbit_training

    prepared: nn.Module = prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=spec.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False})
    return prepared


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's trainable entries (adapters and head), by their names in its state dict."""
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    return {name: value for name, value in model.state_dict().items() if name in trainable}


def load_trainable_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load exactly the trainable entries: a state missing one, or holding others, is refused."""
    expected = set(trainable_state(model))
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(f"not this model's trainable state: missing {missing[:3]}, "
                         f"unexpected {extra[:3]}")
    model.load_state_dict(dict(state), strict=False)


def merged(model: nn.Module, spec: JobSpec, name_or_path: str) -> nn.Module:
    """An ordinary float32 model with the adapters merged into its weights (`model` is left as
    is). An 8-bit model's adapters go into the float32 base loaded afresh, never into int8."""
    if spec.quantization == "none":
        return copy.deepcopy(model).merge_and_unload()  # type: ignore[operator]
    full = apply_lora(load_model(name_or_path, spec.seed, labels=model_labels(model)), spec)
    load_trainable_state(full, {name: value.float().cpu()
                                for name, value in trainable_state(model).items()})
    return full.merge_and_unload()  # type: ignore[operator]


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, all) parameter counts."""
    counts = [(p.numel(), p.requires_grad) for p in model.parameters()]
    return sum(n for n, grad in counts if grad), sum(n for n, _ in counts)
