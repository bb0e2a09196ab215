"""Steps whose loss or gradients are not finite: the job fails, or the step is skipped.

The spec's `nonfinite_loss` chooses. Every participant decides from the norm of the gradients
after their synchronisation, which all of them hold alike: one participant's NaN or infinity
spreads through the all-reduce to every participant's gradients (and a loss is not finite only
where the logits are not, whose gradients then are not either). So all of them fail, or all
skip the step, with no vote of their own; the group's own commit (torchft's `should_commit`) has
already decided that the step counts at all, and a step it refuses is redone, whatever it held.

Skipping commits the step without its update: the weights and the optimizer's state stay as
they were, while the data cursor, the step count and the learning-rate schedule move on. Redoing
the step instead would compute the same value again, forever (the same weights and samples, and
the same dropout: a step's seed is its data position); committing it consumes its samples once,
as the exactly-once invariant asks of a committed step (only an aborted step is redone).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal

from trainer.contract import records

logger = logging.getLogger(__name__)

NonFinite = Literal["nan", "inf", "-inf"]


class NonFiniteLoss(Exception):
    """A step's loss or gradients were not finite, and the spec says to fail."""


def non_finite(value: float) -> NonFinite | None:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return None


@dataclass(frozen=True)
class NonFiniteStep:
    """A step whose synchronised gradients were not finite."""

    step: int
    """The step, counted as committed steps are (the first is 1)."""
    loss: float | None
    """This participant's mean loss over its samples; none where it trained on none."""
    grad_norm: float

    @property
    def value(self) -> NonFinite:
        """What was not finite: this participant's loss, else the gradients' norm."""
        found = non_finite(self.loss) if self.loss is not None else None
        return found or non_finite(self.grad_norm) or "nan"

    def describe(self) -> str:
        if self.loss is None or math.isfinite(self.loss):
            loss = "" if self.loss is None else f" (loss {self.loss:.4f})"
            return f"the gradients became {self.value} at step {self.step}{loss}"
        return f"loss became {self.value} at step {self.step}"

    def record(self, epoch: int, skipped: int) -> records.StepSkipped:
        finite = self.loss if self.loss is not None and math.isfinite(self.loss) else None
        return records.StepSkipped(message=f"step {self.step} skipped: {self.describe()}",
                                   step=self.step, epoch=epoch, non_finite=self.value,
                                   loss=finite, skipped=skipped)


def check(step: int, loss: float | None, grad_norm: float,
          policy: Literal["fail", "skip"]) -> NonFiniteStep | None:
    """None where the step's synchronised gradients are finite; else the step to skip, or
    NonFiniteLoss where the policy is to fail."""
    if math.isfinite(grad_norm):
        return None
    found = NonFiniteStep(step, loss, grad_norm)
    if policy == "fail":
        raise NonFiniteLoss(f"{found.describe()}; the spec's nonfinite_loss \"skip\" would "
                            "skip such steps")
    logger.warning("step %d skipped: %s", step, found.describe())
    return found
