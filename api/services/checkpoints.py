"""Checkpoints of a job, read from its checkpoint directory (trainer.contract.checkpoints)."""

from __future__ import annotations

from pathlib import Path

from api.errors import NotFound
from api.models import CheckpointPublic
from api.services.archive import directory_size
from trainer.contract.checkpoints import NAME, CheckpointInfo, list_checkpoints


def _public(job_id: str, info: CheckpointInfo) -> CheckpointPublic:
    name = info.path.name
    return CheckpointPublic(
        id=name, step=info.step, epoch=info.meta.get("epoch"),
        epoch_end=bool(info.meta.get("epoch_end")), val_accuracy=info.val_accuracy,
        size_bytes=directory_size(info.path), saved_at=info.meta.get("saved_at"),
        links={"download": f"/api/v1/jobs/{job_id}/checkpoints/{name}/download",
               "download_link": f"/api/v1/jobs/{job_id}/checkpoints/{name}/download-link"})


def list_public(job_id: str, directory: Path) -> list[CheckpointPublic]:
    return [_public(job_id, info) for info in reversed(list_checkpoints(directory))]


def find(directory: Path, checkpoint_id: str) -> Path:
    """The complete checkpoint `checkpoint_id`; ids are matched, never joined blindly."""
    if not NAME.match(checkpoint_id):
        raise NotFound(f"checkpoint {checkpoint_id!r} not found")
    for info in list_checkpoints(directory):
        if info.path.name == checkpoint_id:
            return info.path
    raise NotFound(f"checkpoint {checkpoint_id!r} not found")
