"""What report ingestion reads and changes of a job and of a pod, the job's event quota included.

The report writer loads these views once per transaction, applies each batch's records to them,
and writes them back once. A batch that fails in a savepoint is undone in its views too
(`snapshot` / `restore`), so that the other batches of its group go on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from api.models import JobStatus
from trainer.contract.records import (
    Completed,
    Evaluation,
    Finishing,
    Metric,
    RecordData,
    Started,
    StepSkipped,
)
from trainer.contract.spec import MAX_INT

LIVE_METRICS = ("loss", "samples_per_second", "learning_rate", "participants")
LIFECYCLE_RESERVE = 16
"""Past its quota, a job's lifecycle events may still use 1/16 of it more: a quota must not hide
a job's completion or failure, nor make it hang."""


@dataclass
class JobView:
    """The columns of a job that ingestion reads and changes."""

    id: str
    status: JobStatus
    epochs: int
    replicas: int
    """Pods the job runs (replicas x stages for a pipeline)."""
    step: int
    epoch: int
    samples_seen: int
    total_samples: int | None
    metrics: dict[str, Any]
    completed_model_dir: str | None
    event_bytes: int
    """Bytes of events its reports stored; at or past the quota once it was reached."""
    quota: int
    """settings.max_job_event_bytes."""
    finish_after_epoch: int | None = None
    """The epoch after which its pods are to finish early (POST .../finish): as asked, then as
    they agreed (trainer.finish), which is where they were past the one asked."""
    agreed: bool = False
    """A pod reported the agreed finish: `finish_after_epoch` is to be written."""
    changed: bool = False
    started_running: bool = False
    """The first report arrived: starting -> running."""

    def apply(self, data: RecordData) -> None:
        match data:
            case Metric() if data.step >= self.step:
                self.step, self.epoch, self.samples_seen = data.step, data.epoch, data.samples_seen
                self.metrics = {**self.metrics, **{k: getattr(data, k) for k in LIVE_METRICS}}
            case Evaluation():
                prefix = "val" if data.split == "validation" else data.split
                self.metrics = {**self.metrics, f"{prefix}_accuracy": data.accuracy,
                                f"{prefix}_f1": data.f1, f"{prefix}_loss": data.loss}
            case Started():
                self.total_samples = min(data.samples.get("train", 0) * self.epochs, MAX_INT)
                if data.parameters is not None:  # none from a pipeline's stages
                    self.metrics = {**self.metrics, "parameters": data.parameters["total"],
                                    "trainable_parameters": data.parameters["trainable"]}
            case Completed() if data.model_dir:
                # The primary's export, or a live pod's that outlived it.
                self.completed_model_dir = data.model_dir
            case Finishing():
                self.finish_after_epoch = max(self.finish_after_epoch or 0, data.epoch)
                self.agreed = True
            case StepSkipped():  # every participant counts the job's skipped steps alike
                skipped = max(data.skipped, self.metrics.get("skipped_steps", 0))
                self.metrics = {**self.metrics, "skipped_steps": skipped}
            case _:
                return
        self.changed = True

    @property
    def over_quota(self) -> bool:
        return self.event_bytes >= self.quota

    def admit(self, size: int, lifecycle: bool) -> bool:
        """Count an event of `size` bytes against the quota; False: it is not to be stored.

        Below the quota everything is stored. A lifecycle event may go past it, into the
        reserve; other events never reach it, and a refused one marks the quota as reached:
        so `over_quota` turns true exactly once, when the job is to be told."""
        after = self.event_bytes + size
        fits = (after <= self.quota + self.quota // LIFECYCLE_RESERVE if lifecycle
                else after < self.quota)
        self.event_bytes = after if fits else max(self.event_bytes, self.quota)
        self.changed = True
        return fits

    def snapshot(self) -> JobView:
        return replace(self)

    def restore(self, snapshot: JobView) -> None:
        vars(self).update(vars(snapshot))


@dataclass
class PodView:
    id: int
    ordinal: int
    step: int

    def snapshot(self) -> PodView:
        return replace(self)

    def restore(self, snapshot: PodView) -> None:
        vars(self).update(vars(snapshot))
