"""The optimizer and its learning-rate schedule."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import _get_scalar_dtype

from trainer.contract.spec import JobSpec

FUSED_DEVICES = ("cuda", "cpu")
"""Where torch's AdamW has a fused implementation."""


def build_optimizer(model: nn.Module, spec: JobSpec) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only (not on biases and LayerNorm weights)."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (no_decay if parameter.ndim < 2 or "LayerNorm" in name else decay).append(parameter)
    # One fused kernel updates every parameter, on CUDA and on the CPU (on 2 cores, MiniLM's
    # step takes 0.03 s against the default's 0.15 s); elsewhere (MPS) the default.
    trained = decay + no_decay
    fused = (True if trained and all(p.device.type in FUSED_DEVICES for p in trained)
             else None)
    return torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=spec.learning_rate,
                             fused=fused)


def start_state(optimizer: torch.optim.Optimizer) -> None:
    """Give each parameter of an Adam or AdamW `optimizer` the state its first update would
    create (a step count of zero and zero moments, as torch makes them), now.

    A live pod that heals reads its source's moments into these tensors in place
    (trainer.fault_tolerance.heal): their memory is touched here, before the pod joins a
    quorum, not while it receives the heal in the step its peers wait for. Updates are what
    they would be: torch starts a parameter's state with the same zeros."""
    if not isinstance(optimizer, torch.optim.Adam):  # AdamW is one
        return
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            state = optimizer.state[parameter]
            if state:
                continue
            # As torch.optim.Adam._init_group makes it: on the parameter's device where fused or
            # capturable, else on the CPU.
            fused, capturable = bool(group["fused"]), bool(group["capturable"])
            state["step"] = torch.zeros((), dtype=_get_scalar_dtype(is_fused=fused),
                                        device=parameter.device if fused or capturable
                                        else "cpu")
            moments = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"]
                                                   else [])
            for name in moments:
                state[name] = torch.zeros_like(parameter, memory_format=torch.preserve_format)


class LinearSchedule:
    """Linear warm-up then linear decay, driven by the share of training samples consumed.

    Keyed to samples rather than steps, so a job whose participant count changes mid-epoch
    follows the same learning-rate curve per sample it would have followed at full size.
    """

    def __init__(self, peak: float, warmup_ratio: float, total_samples: int) -> None:
        self.peak, self.warmup_ratio, self.total_samples = peak, warmup_ratio, total_samples

    def lr_at(self, samples_done: int) -> float:
        progress = min(samples_done / self.total_samples, 1.0)
        if progress < self.warmup_ratio:
            return self.peak * progress / self.warmup_ratio
        return self.peak * (1.0 - progress) / max(1.0 - self.warmup_ratio, 1e-12)

    def state_dict(self) -> dict[str, float]:
        return {"peak": self.peak, "warmup_ratio": self.warmup_ratio,
                "total_samples": self.total_samples}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.peak, self.warmup_ratio = float(state["peak"]), float(state["warmup_ratio"])
        self.total_samples = int(state["total_samples"])


class OptimizerLoader:
    """Loads an optimizer's state: at once, or, for a live heal's whose per-parameter state is
    still arriving (a Future: trainer.fault_tolerance.heal), once it is needed (`arrived`)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._arriving: dict[str, Any] | None = None

    def load(self, state: dict[str, Any]) -> None:
        if isinstance(state["state"], Future):
            self._arriving = state
        else:
            self._arriving = None
            self.optimizer.load_state_dict(state)

    def arrived(self) -> None:
        """Load the state still arriving, if any: before the update. Without it the pod cannot
        update its weights: should it not arrive (its source died), the error ends the pod,
        which is recreated and heals again."""
        if self._arriving is None:
            return
        arriving, self._arriving = self._arriving, None
        try:
            moments = arriving["state"].result()
        except Exception as exc:
            raise RuntimeError(f"the optimizer's state of this pod's heal did not arrive "
                               f"({type(exc).__name__}: {exc}): the pod cannot update its "
                               f"weights, and ends to be recreated") from exc
        self.optimizer.load_state_dict({**arriving, "state": moments})
