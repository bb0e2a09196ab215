"""What a checkpoint or a heal carries besides the model and optimizer: the RNG states; and
the weights' checksum that shows replicas agree."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch
from torch import nn

from trainer.model import unwrap


def weights_checksum(model: nn.Module) -> str:
    """Digest of every parameter and buffer: equal across replicas that hold equal weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(unwrap(model).state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    kind, keys, position, has_gauss, gauss = np.random.get_state(legacy=True)
    state["numpy"] = (kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), position,
                      has_gauss, gauss)
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, position, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
