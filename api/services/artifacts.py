"""Where a job's files are, as the API reads and deletes them: its directory (the local
backend's launch, state and logs), its checkpoints and model (in that directory, on the
Kubernetes volumes it links to, or under its prefix in an object store).

A job's pods write its checkpoints and model, and may plant links there. The store layer
(trainer.contract.artifact_store) follows no link at or below the paths it is given; the paths here
are real up to where the pods' part begins: the data dir resolved once, and the Kubernetes backend's
own links (from the job's directory to its sub-directories of the volumes) followed one hop,
never a link that leads anywhere else.
"""

from __future__ import annotations

import logging
from pathlib import Path

from upath import UPath

from api.settings import Settings
from trainer.contract.artifact_store import location, remove

logger = logging.getLogger(__name__)

CHECKPOINTS, MODEL = "checkpoints", "model"
"""The job's artifacts, by their names in its directory (or its prefix in the store)."""


def job_dir(settings: Settings, job_id: str) -> Path:
    """The job's local directory (the local backend's launch, state and logs)."""
    return settings.jobs_dir / job_id


def artifacts_dir(settings: Settings, job_id: str) -> Path | UPath:
    """Where the job's checkpoints and model are: its directory, its prefix in the store, or
    its own container (`artifacts_per_job`: `<container>-<job id>`)."""
    if settings.artifacts_per_job and settings.artifacts_url:
        return location(f"{settings.artifacts_url.rstrip('/')}-{job_id}")
    return settings.artifacts / job_id


def checkpoints_dir(settings: Settings, job_id: str) -> Path | UPath:
    return _volume(settings, artifacts_dir(settings, job_id) / CHECKPOINTS)


def model_dir(settings: Settings, job_id: str) -> Path | UPath:
    return _volume(settings, artifacts_dir(settings, job_id) / MODEL)


def _volume(settings: Settings, path: Path | UPath) -> Path | UPath:
    """`path`, or the job's volume sub-directory that the Kubernetes backend linked there (an
    absolute link into the volumes dir: one hop, and the store layer follows no link after
    it). Any other link is the pods' doing, returned as it is: the store layer refuses it."""
    if not isinstance(path, Path) or not path.is_symlink():
        return path
    target = path.readlink()
    if (target.is_absolute() and ".." not in target.parts
            and target.is_relative_to(settings.resolved_volumes_dir)):
        return target
    logger.warning("%s is a link to %s, which the API does not follow", path, target)
    return path


def in_data_dir(settings: Settings, relative: str) -> Path | None:
    """A path relative to the data dir (a registered model's), joined and not resolved; None
    for one that leads elsewhere."""
    path = Path(relative)
    if not path.parts or path.is_absolute() or ".." in path.parts:
        return None
    return settings.data_dir.resolve() / path


def delete_files(settings: Settings, job_id: str, model_paths: list[str]) -> None:
    """Delete the job's directory and the volume sub-directories it links to, its prefix in
    the artifacts store, and its registered models (`model_paths`) inside the data dir; a link
    is deleted, never followed (save the backend's own, to the volumes)."""
    if settings.artifacts_url:
        remove(artifacts_dir(settings, job_id))
    directory = job_dir(settings, job_id)
    volumes = [path for name in (CHECKPOINTS, MODEL)
               if isinstance(path := _volume(settings, directory / name), Path)
               and path.parent != directory]
    registered = [model for relative in model_paths
                  if (model := in_data_dir(settings, relative)) is not None]
    for target in [*registered, *volumes, directory]:
        if target != settings.data_dir.resolve():
            remove(target)
