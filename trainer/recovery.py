"""The fault-tolerance rules the training loop follows, one class per mode.

The loop asks these at fixed points (before training, at the first step, on a failure, at the
end) instead of branching on the mode; a group says which rules it needs (`Group.recovery`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from upath import UPath

from trainer.contract.checkpoints import EXPORTED, MARKER, CheckpointInfo, checkpoint_name
from trainer.contract.checkpoints import latest_checkpoint as newest

logger = logging.getLogger(__name__)

TAKEOVER_SECONDS = 15.0
"""Live mode, at the end: how long other pods wait for the primary's final checkpoint and
export before writing them themselves (the primary may have died after the last step). Too
short only costs a duplicate write: replicas hold the same weights and the first copy wins."""


def appears(path: Path | UPath, timeout: float) -> bool:
    """Whether `path` exists within `timeout` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
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
        if is_primary or appears(self.checkpoint_dir / checkpoint_name(step) / MARKER,
                                 TAKEOVER_SECONDS):
            return False
        logger.info("the primary wrote no final checkpoint: writing it (step %d)", step)
        self.primary_lost = True
        return True

    def exports(self, is_primary: bool) -> bool:
        # Live replicas hold identical weights: whichever exports first, the model is one.
        return is_primary or self.primary_lost or not appears(self.model_dir / EXPORTED,
                                                               TAKEOVER_SECONDS)
