"""The job's checkpoint policy: when to save, emergency saves after a failure, the final save a
live pod makes for a lost primary, and resume. The files are trainer.checkpoint's; which pod
writes which of them is the model part's (trainer.part)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upath import UPath

from trainer.checkpoint import CheckpointInfo, CheckpointWriter
from trainer.config import TrainConfig
from trainer.contract import artifact_store, records
from trainer.distributed import Group
from trainer.part import ModelPart
from trainer.recovery import Recovery
from trainer.report import Reporter
from trainer.sampler import GlobalSampler

logger = logging.getLogger(__name__)


@dataclass
class Save:
    """One checkpoint to write."""

    directory: Path | UPath
    step: int
    meta: dict[str, Any]
    keep: int
    """Complete checkpoints to keep (retention)."""
    emergency: bool
    """Saved by the survivors of a failure (reported as such)."""
    everyone: bool
    """Written at once by every participant (after a failure, before a stop), not in the
    background by the primary."""
    trainer_state: Callable[[], dict[str, Any]]
    done: Callable[[CheckpointInfo], None]
    """Reports the checkpoint once complete."""


class Checkpointer:
    """Saves the committed state when the policy says so and resumes from the newest."""

    writer: CheckpointWriter
    """Writes the primary's checkpoints in the background while training goes on."""

    def __init__(self, config: TrainConfig, group: Group, reporter: Reporter, part: ModelPart,
                 recovery: Recovery, trainer_state: Callable[[], dict[str, Any]]) -> None:
        self.config, self.group, self.reporter, self.part = config, group, reporter, part
        self.recovery, self.trainer_state = recovery, trainer_state
        self.writer = CheckpointWriter()

    def due(self, step: int) -> bool:
        """Whether the policy saves after committed step `step` (epoch ends aside)."""
        every = self.config.spec.checkpoint_every_steps
        return bool(every and step % every == 0)

    def newest_before_training(self) -> CheckpointInfo | None:
        return self.recovery.resume_before_training()

    def newest_at_first_step(self) -> CheckpointInfo | None:
        """Live mode decides once the first step's group is known."""
        return self.recovery.resume_at_first_step()

    def load(self, info: CheckpointInfo) -> dict[str, Any]:
        """Load the model's part of checkpoint `info`; its trainer state."""
        return self.part.load_checkpoint(info.path)

    def save(self, step: int, sampler: GlobalSampler, metrics: dict[str, Any], epoch_end: bool,
             emergency: bool = False, everyone: bool = False) -> None:
        """Checkpoint the committed state: by the primary in the background, or at once by every
        participant (`everyone`; always in an emergency)."""
        # The epoch of the last committed step, counted from 1: after an epoch's last step the
        # sampler is at the next one's start already (an emergency save may come before the
        # epoch end is done).
        epoch = sampler.epoch + (1 if sampler.cursor else 0)
        spec = self.config.spec
        meta = {"epoch": epoch, "cursor": sampler.cursor, "epoch_end": epoch_end,
                "emergency": emergency, "finetune": spec.finetune,
                # A LoRA checkpoint holds the trainable part: the rest is this base model.
                "base_model": spec.model,
                "metrics": {"val_accuracy": metrics.get("validation", {}).get("accuracy")}}

        def reported(info: CheckpointInfo) -> None:
            size = artifact_store.size(info.path)
            self.reporter.emit(records.CheckpointSaved(step=step, epoch=epoch, path=info.path.name,
                                                       size_bytes=size, epoch_end=epoch_end,
                                                       val_accuracy=info.val_accuracy,
                                                       emergency=emergency))
            self.reporter.flush()

        self.part.save_checkpoint(Save(self.config.runtime.checkpoint_dir, step, meta,
                                       spec.keep_checkpoints, emergency, everyone or emergency,
                                       self.trainer_state, reported), self.writer)

    def save_final(self, step: int, sampler: GlobalSampler, metrics: dict[str, Any]) -> None:
        """After the last step: the final checkpoint, where this pod must write the one the
        primary normally writes (it may have died)."""
        if self.recovery.writes_final_checkpoint(step, self.group.is_primary):
            self.save(step, sampler, metrics, epoch_end=True, emergency=True)

    def save_at_stop(self, step: int, sampler: GlobalSampler, metrics: dict[str, Any],
                     epoch_end: bool) -> None:
        """Before stopping (a SIGTERM here or at a peer): the state it stops at, unless the
        primary's copy is under way (`epoch_end`: the epoch end's). Where a failure would call
        for every survivor's copy (a static group), every participant writes it before its
        process exits: the next round may form before the primary's copy is complete (a round
        needs one pod), and must resume from here, not redo the steps since an older
        checkpoint."""
        everyone = self.recovery.saves_on_failure(self.group.participants)
        if everyone or not epoch_end:
            self.save(step, sampler, metrics, epoch_end=epoch_end, everyone=everyone)

    def save_after_failure(self, step: int, sampler: GlobalSampler,
                           metrics: dict[str, Any]) -> None:
        """After a failed collective: keep the last committed step so a restart loses none.

        The model and optimizer change only when a step commits, so they hold that step's
        state whichever collective failed; every survivor writes, since any may be the lowest.
        """
        if not self.recovery.saves_on_failure(self.group.participants) or step == 0:
            return
        try:
            self.save(step, sampler, metrics, epoch_end=False, emergency=True)
            logger.info("emergency checkpoint at step %d", step)
        except Exception:  # the failure being handled matters more; this one is logged
            logger.exception("emergency checkpoint at step %d failed", step)

    def wait(self) -> None:
        """Block until the checkpoint in flight (if any) is durable; raise its error."""
        self.writer.wait()
