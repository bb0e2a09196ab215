"""Finishing a job early, after an epoch the control plane names (`POST /jobs/{id}/finish`).

Each pod learns the epoch from the control plane's replies to its reports, each at its own
moment, so no pod acts on what it alone heard. Every step carries two votes through the sums
its participants already make (a fixed global batch's gradients, the step's statistics): how
many participants were asked, and the epoch they were asked for, summed. A committed step whose
sum is not zero settles it alike for all of them: the job ends after that epoch, or after the
current one where the step is past it. The schedule is not stretched or shortened: a job
finished after epoch N holds the weights that a whole run holds at the end of epoch N.

A live group on an elastic batch (`elastic_batch: true`) sums no statistics (its pods report
their own): it cannot agree, and the control plane refuses such a request.
"""

from __future__ import annotations

import logging

import torch

from trainer.contract import records
from trainer.report import Reporter

logger = logging.getLogger(__name__)


class Finish:
    """A job's early finish: this pod's vote, and the epoch the participants agreed on."""

    def __init__(self, reporter: Reporter, epochs: int, agrees: bool) -> None:
        """`agrees`: whether the group sums every participant's votes (see above)."""
        self.reporter, self.epochs, self.agrees = reporter, epochs, agrees
        self.epoch: int | None = None
        """The last epoch (from 1) the job trains, as its participants agreed; None: all."""

    @property
    def last_epoch(self) -> int:
        """The epoch (from 1) after which the job ends."""
        return min(self.epoch or self.epochs, self.epochs)

    def votes(self) -> torch.Tensor:
        """This pod's votes for the step: (1, the epoch) where it was asked, else zeros."""
        asked = self.reporter.finish_after_epoch if self.agrees else None
        return torch.tensor([1.0, float(asked)] if asked and self.epoch is None else [0.0, 0.0],
                            dtype=torch.float64)

    def settle(self, votes: torch.Tensor, epoch: int, step: int) -> None:
        """The committed step's votes, summed over its participants; `epoch`: the step's (from
        0). Every participant of the step settles alike."""
        asked, total = (float(v) for v in votes.tolist())
        if self.epoch is not None or asked < 1:
            return
        self.epoch = max(round(total / asked), epoch + 1)
        logger.info("the job finishes after epoch %d of %d (asked at step %d)", self.epoch,
                    self.epochs, step)
        self.reporter.emit(records.Finishing(
            message=f"finishing after epoch {self.epoch} of {self.epochs}, as asked",
            epoch=self.epoch, step=step))
