"""Stagings: the hub repositories staged for jobs, with their progress (read only: a job that
names a hub model or dataset starts them, api.services.preparation)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.asset_models import StagingPublic, StagingsPublic
from api.auth import AdminRoute
from api.deps import SessionDep
from api.errors import error_responses
from api.routes import API_PREFIX
from api.services import staging as service
from trainer.contract.spec import MAX_INT

router = APIRouter(prefix=API_PREFIX + "/stagings", tags=["stagings"],
                   route_class=AdminRoute, responses=error_responses(401, 403, 422))


@router.get("", response_model=StagingsPublic)
def list_stagings(session: SessionDep, offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
                  limit: Annotated[int, Query(ge=1, le=200)] = 50) -> StagingsPublic:
    """Newest first: each one's status, bytes done and in all, and while running its ETA."""
    return service.list_stagings(session, offset, limit)


@router.get("/{staging_id}", response_model=StagingPublic, responses=error_responses(404))
def get_staging(staging_id: str, session: SessionDep) -> StagingPublic:
    return service.public(service.get_staging(session, staging_id))
