"""The fault-tolerance rules the training loop follows, one class per mode.

The loop asks these at fixed points (before training, at the first step, on a failure, at the
end) instead of branching on the mode; a group says which rules it needs (`Group.recovery`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from upath import UPath

from trainer.contract.checkpoints import EXPORTED, CheckpointInfo, checkpoint_at
from trainer.contract.checkpoints import latest_checkpoint as newest
from trainer.export import exported_metrics

logger = logging.getLogger(__name__)

TAKEOVER_SECONDS = 15.0
"""Live mode, at the end: how long other pods wait for the primary's final checkpoint and
export before writing them themselves (the primary may have died after the last step). Too
short only costs a duplicate write: replicas hold the same weights and the first copy wins."""


def appears(found: Callable[[], bool], timeout: float) -> bool:
    """Whether `found()` becomes true within `timeout` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while not found():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


class Recovery:
    """A static world (restart mode, or one process): a failure restarts every participant from
    the newest complete checkpoint, and only the primary writes shared state."""

    shared_writes = False
    """Several pods may write the same checkpoint or export (identical content) at once."""

    def __init__(self, checkpoint_dir: Path | UPath, model_dir: Path | UPath) -> None:
        self.checkpoint_dir, self.model_dir = checkpoint_dir, model_dir

    def resume_before_training(self) -> CheckpointInfo | None:
        return newest(self.checkpoint_dir)

    def resume_at_first_step(self) -> CheckpointInfo | None:
        """Decided once the first step's group is known (live mode)."""
        return None

    def saves_on_failure(self, participants: int) -> bool:
        """Whether a failed collective calls for an emergency checkpoint of the last committed
        step: every survivor restarts from it, so none is lost."""
        return participants > 1

    def writes_final_checkpoint(self, step: int, is_primary: bool) -> bool:
        """Whether this pod must write the final checkpoint the primary normally writes."""
        return False

    def exports(self, is_primary: bool) -> bool:
        return is_primary

    def exported(self, step: int) -> dict[str, Any] | None:
        """The metrics of the export, if an earlier run of the job made it from `step`'s
        state: a restart after the export then reports it instead of evaluating on test and
        exporting again. Every participant finds the same: none of this run exports before
        all have evaluated (a collective)."""
        return exported_metrics(self.model_dir, step)


class LiveRecovery(Recovery):
    """A live group: survivors train on, a pod that joins heals from a live peer, and when the
    primary dies near the end another pod writes what it would have."""

    shared_writes = True

    def __init__(self, checkpoint_dir: Path | UPath, model_dir: Path | UPath) -> None:
        super().__init__(checkpoint_dir, model_dir)
        self.primary_lost = False

    def resume_before_training(self) -> CheckpointInfo | None:
        return None  # a recreated pod heals from a peer ahead instead: see the first step

    def resume_at_first_step(self) -> CheckpointInfo | None:
        # A fresh group (every pod died, or the last ones left) resumes from the newest; the
        # step decides, since only its quorum tells whether a live peer is ahead.
        return newest(self.checkpoint_dir)

    def saves_on_failure(self, participants: int) -> bool:
        return False  # the survivors keep the state in memory

    def writes_final_checkpoint(self, step: int, is_primary: bool) -> bool:
        # The final state lives only in memory until the primary's checkpoint is written; a pod
        # recreated later must resume from it, not retrain from an older one.
        if is_primary or appears(lambda: checkpoint_at(self.checkpoint_dir, step) is not None,
                                 TAKEOVER_SECONDS):
            return False
        logger.info("the primary wrote no final checkpoint: writing it (step %d)", step)
        self.primary_lost = True
        return True

    def exports(self, is_primary: bool) -> bool:
        # Live replicas hold identical weights: whichever exports first, the model is one.
        return is_primary or self.primary_lost or not appears(
            (self.model_dir / EXPORTED).exists, TAKEOVER_SECONDS)

    def exported(self, step: int) -> dict[str, Any] | None:
        # Live pods end at different times: one that found the export would skip an
        # evaluation its pipeline stages share. The takeover rules above settle the export.
        return None
