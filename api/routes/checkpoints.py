"""A job's checkpoints, and signed links to download one."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from api.auth import AdminRoute
from api.deps import LinkSignerDep, SessionDep, SettingsDep
from api.errors import error_responses
from api.models import CheckpointPublic, DownloadLink
from api.routes import API_PREFIX
from api.services import checkpoints as service
from api.services.artifacts import checkpoints_dir
from api.services.jobs import get_job
from api.services.links import signed_link

router = APIRouter(prefix=API_PREFIX + "/jobs/{job_id}/checkpoints", tags=["checkpoints"],
                   route_class=AdminRoute,
                   responses=error_responses(401, 403, 404, 422))


@router.get("", response_model=list[CheckpointPublic], responses=error_responses(409))
def list_checkpoints(job_id: str, session: SessionDep,
                     settings: SettingsDep) -> list[CheckpointPublic]:
    get_job(session, job_id)
    return service.list_public(job_id, checkpoints_dir(settings, job_id))


@router.post("/{checkpoint_id}/download-link", response_model=DownloadLink,
             responses=error_responses(409, 413))
def checkpoint_link(job_id: str, checkpoint_id: str, request: Request, session: SessionDep,
                    settings: SettingsDep, signer: LinkSignerDep) -> DownloadLink:
    """A URL that downloads the checkpoint without a token, for a few minutes."""
    get_job(session, job_id)
    service.readable(checkpoints_dir(settings, job_id), checkpoint_id)
    return signed_link(signer, request.app.url_path_for(
        "download_checkpoint", job_id=job_id, checkpoint_id=checkpoint_id))


@router.delete("/{checkpoint_id}", status_code=status.HTTP_204_NO_CONTENT,
               responses=error_responses(409))
def delete_checkpoint(job_id: str, checkpoint_id: str, session: SessionDep,
                      settings: SettingsDep) -> Response:
    """Delete a checkpoint; 409 for the newest while the job runs (a restart resumes from it)."""
    job = get_job(session, job_id)
    service.delete(job, checkpoints_dir(settings, job_id), checkpoint_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
