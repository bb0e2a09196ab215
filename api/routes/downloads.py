"""Downloads of models and checkpoints: with the admin token, or a signed link from
`POST .../download-link` (so the token never sits in a URL)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from upath import UPath

from api.auth import Expires, LinkRoute, Signature
from api.deps import SessionDep, SettingsDep
from api.errors import error_responses
from api.routes import API_PREFIX
from api.services import checkpoints, registry
from api.services.archive import iter_tar_gz
from api.services.artifacts import checkpoints_dir
from api.services.jobs import get_job

router = APIRouter(prefix=API_PREFIX, tags=["downloads"],
                   route_class=LinkRoute, responses=error_responses(401, 403, 404, 409, 422))

Format = Annotated[Literal["model", "adapter"], Query(
    description="`model` (the merged model), or `adapter`: a LoRA job's adapters alone")]


def _archive(path: Path | UPath, name: str, filename: str) -> StreamingResponse:
    return StreamingResponse(iter_tar_gz(path, name), media_type="application/gzip",
                             headers={"Content-Disposition": f'attachment; filename="{filename}"'})


@router.get("/models/{model_id}/download", response_class=StreamingResponse)
def download_model(model_id: str, session: SessionDep, settings: SettingsDep,
                   expires: Expires = None, signature: Signature = None,
                   format: Format = "model") -> StreamingResponse:
    """The model as a .tar.gz that `from_pretrained` loads once unpacked; `format=adapter`: a
    LoRA job's adapters alone, for `peft.PeftModel.from_pretrained(base, directory)`."""
    model = registry.get_model(session, model_id)
    path = registry.model_path(settings, model)
    if format == "adapter":
        path = registry.adapter_path(path, model)
        return _archive(path, f"{model.id}-adapter", f"{model.id}-adapter.tar.gz")
    return _archive(path, model.id, f"{model.id}.tar.gz")


@router.get("/jobs/{job_id}/checkpoints/{checkpoint_id}/download",
            response_class=StreamingResponse)
def download_checkpoint(job_id: str, checkpoint_id: str, session: SessionDep,
                        settings: SettingsDep, expires: Expires = None,
                        signature: Signature = None) -> StreamingResponse:
    get_job(session, job_id)
    path = checkpoints.readable(checkpoints_dir(settings, job_id), checkpoint_id)
    return _archive(path, checkpoint_id, f"{job_id}-{checkpoint_id}.tar.gz")
