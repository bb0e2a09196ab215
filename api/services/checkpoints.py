"""Checkpoints of a job, read from its checkpoint directory or store prefix
(trainer.contract.checkpoints, trainer.contract.artifact_store)."""

from __future__ import annotations

from pathlib import Path

from upath import UPath

from api.errors import Conflict, NotFound
from api.models import CheckpointPublic, Job
from api.services.archive import refuse_links
from trainer.contract import artifact_store
from trainer.contract.checkpoints import (
    NAME,
    CheckpointInfo,
    apply_retention,
    list_checkpoints,
    remove_checkpoint,
)


def _public(job_id: str, info: CheckpointInfo) -> CheckpointPublic:
    name = info.path.name
    return CheckpointPublic(
        id=name, step=info.step, epoch=info.meta.get("epoch"),
        epoch_end=bool(info.meta.get("epoch_end")), val_accuracy=info.val_accuracy,
        size_bytes=artifact_store.size(info.path), saved_at=info.meta.get("saved_at"),
        links={"download": f"/api/v1/jobs/{job_id}/checkpoints/{name}/download",
               "download_link": f"/api/v1/jobs/{job_id}/checkpoints/{name}/download-link"})


def list_public(job_id: str, directory: Path | UPath) -> list[CheckpointPublic]:
    return [_public(job_id, info) for info in reversed(list_checkpoints(directory))]


def find(directory: Path | UPath, checkpoint_id: str) -> Path | UPath:
    """The complete checkpoint `checkpoint_id`; ids are matched, never joined blindly."""
    if not NAME.match(checkpoint_id):
        raise NotFound(f"checkpoint {checkpoint_id!r} not found")
    for info in list_checkpoints(directory):
        if info.path.name == checkpoint_id:
            return info.path
    raise NotFound(f"checkpoint {checkpoint_id!r} not found")


def readable(directory: Path | UPath, checkpoint_id: str) -> Path | UPath:
    """The complete checkpoint `checkpoint_id`, for a download: 409 where it holds a link."""
    path = find(directory, checkpoint_id)
    refuse_links(path, f"checkpoint {checkpoint_id}")
    return path


def delete(job: Job, directory: Path | UPath, checkpoint_id: str) -> None:
    """Delete one checkpoint of `job`; never the newest while the job may resume from it."""
    path = find(directory, checkpoint_id)
    if not job.status.finished and list_checkpoints(directory)[-1].path == path:
        raise Conflict(f"checkpoint {checkpoint_id} is the newest of job {job.id}, which is "
                       f"{job.status.value}: a restart resumes from it")
    remove_checkpoint(path)


def prune(directory: Path | UPath) -> list[str]:
    """Delete every checkpoint but the final (newest) and the best (highest validation
    accuracy, the newer of equals); the names deleted."""
    return [path.name for path in apply_retention(directory, keep=1)]
