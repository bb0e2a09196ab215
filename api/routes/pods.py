"""Failure injection, migration and pod logs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, status

from api.auth import AdminRoute
from api.deps import BackendDep, EventsDep, SessionDep
from api.errors import error_responses
from api.models import Accepted, KillRequest, MigrateRequest
from api.routes import API_PREFIX
from api.services import jobs as service
from api.services import pod_migrations

router = APIRouter(prefix=API_PREFIX + "/jobs/{job_id}/pods", tags=["pods"],
                   route_class=AdminRoute,
                   responses=error_responses(401, 403, 404, 413, 422))


@router.post("/{ordinal}/kill", status_code=status.HTTP_202_ACCEPTED, response_model=Accepted,
             responses=error_responses(409, 503))
def kill_pod(job_id: str, ordinal: int, session: SessionDep, backend: BackendDep,
             events: EventsDep, request: Annotated[KillRequest | None, Body()] = None,
             ) -> Accepted:
    grace = (request or KillRequest()).grace_seconds
    service.kill_pod(session, backend, events, job_id, ordinal, grace)
    return Accepted(id=f"{job_id}-{ordinal}", status="killed",
                    detail=f"pod killed (grace {grace:g} s); its controller recreates it")


@router.post("/{ordinal}/migrate", status_code=status.HTTP_202_ACCEPTED, response_model=Accepted,
             responses=error_responses(409, 501, 503))
def migrate_pod(job_id: str, ordinal: int, session: SessionDep, backend: BackendDep,
                events: EventsDep, request: Annotated[MigrateRequest | None, Body()] = None,
                ) -> Accepted:
    """Move the pod (to `node`, or any other node; the local backend has one): make before
    break, the replacement heals from a peer and takes part before the old incarnation leaves
    gracefully. The `migrated` event says when it took part."""
    node = (request or MigrateRequest()).node
    pod_migrations.start(session, backend, events, job_id, ordinal, node)
    return Accepted(id=f"{job_id}-{ordinal}", status="migrating",
                    detail="the replacement starts; a `migrated` event follows once it takes "
                           "part")


@router.get("/{ordinal}/logs")
def pod_logs(job_id: str, ordinal: int, session: SessionDep, backend: BackendDep,
             lines: Annotated[int, Query(ge=1, le=5000)] = 200) -> dict[str, list[str]]:
    service.check_ordinal(service.get_job(session, job_id), ordinal)
    return {"lines": backend.tail_logs(job_id, ordinal, lines)}
