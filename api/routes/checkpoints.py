"""A job's checkpoints and their download."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from api.deps import AdminDep, SessionDep, SettingsDep
from api.models import CheckpointPublic
from api.routes import API_PREFIX
from api.services import checkpoints as service
from api.services.archive import iter_tar_gz
from api.services.jobs import get_job, job_dir

router = APIRouter(prefix=API_PREFIX + "/jobs/{job_id}/checkpoints", tags=["checkpoints"],
                   dependencies=[AdminDep])


@router.get("", response_model=list[CheckpointPublic])
def list_checkpoints(job_id: str, session: SessionDep,
                     settings: SettingsDep) -> list[CheckpointPublic]:
    get_job(session, job_id)
    return service.list_public(job_id, job_dir(settings, job_id) / "checkpoints")


@router.get("/{checkpoint_id}/download", response_class=StreamingResponse)
def download_checkpoint(job_id: str, checkpoint_id: str, session: SessionDep,
                        settings: SettingsDep) -> StreamingResponse:
    get_job(session, job_id)
    path = service.find(job_dir(settings, job_id) / "checkpoints", checkpoint_id)
    name = f"{job_id}-{checkpoint_id}"
    disposition = f'attachment; filename="{name}.tar.gz"'
    return StreamingResponse(iter_tar_gz(path, checkpoint_id), media_type="application/gzip",
                             headers={"Content-Disposition": disposition})
