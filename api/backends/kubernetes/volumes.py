"""Where a job's files lie, in its trainer pods and in the API.

A trainer pod sees its job's sub-directory of the checkpoints and models PVCs at /checkpoints
and /models (the export goes to /models/model: the trainer writes it next to its target and
renames it into place, which a mount point would refuse), the inputs PVC (read-only) at /inputs
and an emptyDir cache at /cache. The API mounts the two PVCs whole under its volumes dir and
links the job's directories there (see `volume_dirs`), so it reads what the pods wrote.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from api.backends.base import Launch
from trainer.contract.artifact_store import is_local

INPUTS_MOUNT = Path("/inputs")
CHECKPOINTS_MOUNT = Path("/checkpoints")
MODELS_MOUNT = Path("/models")
CACHE_MOUNT = Path("/cache")


def volume_dirs(volumes_dir: Path, job_id: str) -> tuple[Path, Path]:
    """The sub-directories of the checkpoints and models PVCs (mounted whole under
    `volumes_dir` in the API) that a job's pods mount with subPath = job id."""
    return volumes_dir / "checkpoints" / job_id, volumes_dir / "models" / job_id


def exported_model_dir(models_dir: Path) -> Path:
    """Where the export lies inside a job's models directory (MODEL_DIR in the pods)."""
    return models_dir / "model"


def in_store(launch: Launch) -> bool:
    """Whether the job's checkpoints and model go to an object store rather than volumes."""
    return not is_local(launch.checkpoint_dir)


def pod_launch(launch: Launch) -> Launch:
    """The launch as a trainer pod sees it: paths inside the container, not the API's (an
    object store's URLs are the same everywhere)."""
    launch = dataclasses.replace(launch, inputs_dir=INPUTS_MOUNT,
                                 cache_dir=CACHE_MOUNT / "tokens")
    if in_store(launch):
        return launch
    return dataclasses.replace(launch, checkpoint_dir=CHECKPOINTS_MOUNT,
                               model_dir=exported_model_dir(MODELS_MOUNT))
