"""Stagings: the hub repositories (and jobs' tokenized splits) staged for jobs, with their
progress. A job that names a hub model or dataset starts them (api.services.preparation); an
import stages a repository ahead of the jobs that will name it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response, status
from pydantic import BaseModel, Field, model_validator

from api.asset_models import StagingPublic, StagingsPublic
from api.auth import AdminRoute
from api.deps import BackendDep, SessionDep, SettingsDep
from api.errors import error_responses
from api.routes import API_PREFIX
from api.services import staging as service
from trainer.contract.spec import MAX_INT
from trainer.contract.staged import DEFAULT_REVISION, REPO_ID, REVISION, Kind, staged_dir

router = APIRouter(prefix=API_PREFIX + "/stagings", tags=["stagings"],
                   route_class=AdminRoute, responses=error_responses(401, 403, 422))


@router.get("", response_model=StagingsPublic)
def list_stagings(session: SessionDep, offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
                  limit: Annotated[int, Query(ge=1, le=200)] = 50,
                  kind: Kind | None = None) -> StagingsPublic:
    """Newest first: each one's status, bytes done and in all, and while running its ETA; of
    one kind when given (`model`: the base models staged for jobs)."""
    return service.list_stagings(session, offset, limit, kind)


@router.get("/{staging_id}", response_model=StagingPublic, responses=error_responses(404))
def get_staging(staging_id: str, session: SessionDep) -> StagingPublic:
    return service.public(service.get_staging(session, staging_id))


class StagingCreate(BaseModel):
    """A hub repository to stage ahead of the jobs that will name it."""

    kind: Literal["model", "dataset"]
    repo_id: str = Field(pattern=REPO_ID.pattern, max_length=200,
                         examples=["google-bert/bert-base-uncased"])
    revision: str = Field(default=DEFAULT_REVISION, pattern=REVISION.pattern,
                          description="A branch, tag or commit; jobs read `main`'s.")

    @model_validator(mode="after")
    def _a_path_inside_the_inputs_dir(self) -> StagingCreate:
        staged_dir(Path(), self.kind, self.repo_id, self.revision)  # ValueError: a 422
        return self


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=StagingPublic,
             responses={200: {"model": StagingPublic, "description": "Staged already."}})
def import_repository(body: StagingCreate, response: Response, session: SessionDep,
                      settings: SettingsDep, backend: BackendDep) -> StagingPublic:
    """Start staging the repository (202, with its progress to follow at its Location); 200
    where it is staged already. A failed staging is tried again."""
    row, already = service.import_repository(session, settings, backend, body.kind,
                                             body.repo_id, body.revision)
    response.headers["Location"] = f"{API_PREFIX}/stagings/{row.id}"
    if already:
        response.status_code = status.HTTP_200_OK
    return service.public(row)


@router.delete("/{staging_id}", status_code=status.HTTP_204_NO_CONTENT,
               responses=error_responses(404, 409))
def delete_staging(staging_id: str, session: SessionDep, settings: SettingsDep) -> Response:
    """Remove what was staged (disk space back); 409 while it runs, or while a job not finished
    reads it."""
    service.delete_staging(session, settings, staging_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
