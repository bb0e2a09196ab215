"""What a pod loads before it knows which pod it is: tokenizer, tokenized data, seeded model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from trainer import allocator, lora
from trainer.config import TrainConfig
from trainer.contract.spec import JobSpec
from trainer.contract.staged import HUB_DIR, TOKENS_DIR, read_staged, staged, tokens_key
from trainer.data import (
    TokenizedSplit,
    label_names,
    load_source,
    load_tokens,
    make_splits,
    on_device,
    tokenize,
)
from trainer.model import DeviceChoice, classify, load_model, load_tokenizer, resolve_model


@dataclass
class Prepared:
    """What a pod loads before it needs to know which pod it is: a warm standby
    (trainer.standby) holds it ready, so the pod it becomes starts with a heal."""

    key: str
    """The spec and input directories it was loaded for."""
    tokenizer: Any
    train: TokenizedSplit
    validation: TokenizedSplit
    test: TokenizedSplit
    model: nn.Module
    """Freshly initialised (seeded), on its device, not wrapped yet; one output per label of
    the dataset (`model_labels`)."""

    def fits(self, config: TrainConfig, device: torch.device) -> bool:
        return self.key == _prepared_key(config) and next(self.model.parameters()).device == device


def _prepared_key(config: TrainConfig) -> str:
    runtime = config.runtime
    return f"{config.spec.model_dump_json()} {runtime.inputs_dir} {runtime.cache_dir}"


def prepare(config: TrainConfig, device: torch.device) -> Prepared:
    """The tokenizer, the tokenized splits and the seeded model of the job's spec."""
    spec, runtime = config.spec, config.runtime
    quantized = lora.QUANTIZED_DEVICES
    lora.check_quantization(spec, device, (*quantized, "cpu") if runtime.quantize_on_cpu
                            else quantized)
    name_or_path = resolve_model(spec.model, runtime.inputs_dir, spec.model_revision)
    tokenizer = load_tokenizer(name_or_path)
    train, validation, test = staged_splits(spec, runtime.inputs_dir, tokenizer) or (
        tokenized_splits(spec, runtime.inputs_dir, runtime.cache_dir, tokenizer))
    model = adapt(load_model(name_or_path, spec.seed, spec.quantization, device,
                             label_names(spec, runtime.inputs_dir)), spec)
    if spec.quantization == "none":  # a quantized model was loaded onto the device
        model = model.to(device)
    return Prepared(_prepared_key(config), tokenizer, train, validation, test, model)


Splits = tuple[TokenizedSplit, TokenizedSplit, TokenizedSplit]


def staged_splits(spec: JobSpec, inputs: Path, tokenizer: Any) -> Splits | None:
    """The splits the control plane tokenized for the spec (trainer.contract.staged), read
    without the dataset; None where it did not."""
    found = staged(inputs, "tokens", tokens_key(spec, inputs))
    if found is None:
        return None
    files = read_staged(found)["files"]
    folder = inputs / HUB_DIR / TOKENS_DIR
    return (load_tokens(folder / files["train"], tokenizer),
            load_tokens(folder / files["validation"], tokenizer),
            load_tokens(folder / files["test"], tokenizer))


def tokenized_splits(spec: JobSpec, inputs: Path, cache: Path, tokenizer: Any) -> Splits:
    """The dataset read, split and tokenized (or read from this pod's cache)."""
    splits = make_splits(load_source(spec, inputs, cache), spec)
    return (tokenize(splits.train, tokenizer, spec.max_length, cache),
            tokenize(splits.validation, tokenizer, spec.max_length, cache),
            tokenize(splits.test, tokenizer, spec.max_length, cache))


def adapt(model: nn.Module, spec: JobSpec) -> nn.Module:
    """The model as the spec trains it: with LoRA adapters, with gradient checkpointing,
    compiled (in place: its parameters' names, so checkpoints and heals, stay as they are)."""
    if spec.quantization != "none":
        model = lora.prepare_quantized(model, spec)  # checkpointing too, where asked
    elif spec.gradient_checkpointing:
        # Non-reentrant: the frozen inputs of a LoRA model need no requires_grad to recompute.
        model.gradient_checkpointing_enable(  # type: ignore[operator]
            gradient_checkpointing_kwargs={"use_reentrant": False})
    if spec.finetune == "lora":
        model = lora.apply_lora(model, spec)
    if spec.torch_compile:
        model.compile()
    return model


def prepared_for(config: TrainConfig, device: torch.device,
                 prepared: Prepared | None = None) -> Prepared:
    """What a standby loaded (`prepared`) where it fits the pod's job and device; else loaded
    now."""
    if prepared is not None and prepared.fits(config, device):
        return prepared
    return prepare(config, device)


FIRST_STEP_HEAP = 5
"""What a pod's first update and exact reduce allocate, in bytes of its trainable parameters
(on a CPU): the optimizer's two moments (twice), and the float64 sums of its shards' gradients
with the flat buffer they are reduced in (trainer.shards; up to twice each, less the rows of the
input embedding no step reads). With MiniLM, a pod that healed in a scale-up faulted in about
2,000 pages in that step after this reservation, its optimizer's state made ahead
(trainer.schedule.start_state); 97,000 with neither."""


def warm_up(prepared: Prepared, spec: JobSpec, device: DeviceChoice) -> None:
    """One forward and backward of a shard of the training data through the model, thrown
    away: the weights, the random state and the model's mode are left as they were.

    A process's first step is slower than the next ones (kernels, buffers and threads set up
    on first use: 0.06-0.1 s of MiniLM's 0.45 s shard on 2 CPU cores; a GPU's lazily loaded
    kernels and cuBLAS handles too). A standby pays it while it waits, not the step it heals
    into, which its peers wait for. A pipeline job's pods train a stage each: the whole model's
    activations are not theirs to hold.

    On a CPU, the memory of that first step's update and exact reduce is touched and freed too
    (trainer.allocator.reserve): its page faults are the standby's, while it waits."""
    if spec.parallelism == "pipeline" or len(prepared.train) == 0:
        return
    rows = np.arange(min(spec.batch_size, len(prepared.train)))
    batch = on_device(prepared.train.batch(rows), device.device)
    model, training = prepared.model, prepared.model.training
    cuda = [device.device] if device.device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        model.train()
        try:
            with device.autocast():
                logits = classify(model, batch)
            functional.cross_entropy(logits.float(), batch["labels"]).backward()
        finally:
            model.zero_grad(set_to_none=True)
            model.train(training)
    if device.device.type == "cpu":
        trainable = sum(p.numel() * p.element_size() for p in model.parameters()
                        if p.requires_grad)
        allocator.reserve(FIRST_STEP_HEAP * trainable)
