"""Jobs: create, list, read, cancel, and their event history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from api.deps import AdminDep, BackendDep, BrokerDep, SessionDep, SettingsDep
from api.models import MAX_INT, Accepted, EventsPublic, JobCreate, JobPublic, JobsPublic, JobStatus
from api.routes import API_PREFIX
from api.services import jobs as service

router = APIRouter(prefix=API_PREFIX + "/jobs", tags=["jobs"],
                   dependencies=[AdminDep])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=JobPublic)
def create_job(spec: JobCreate, response: Response, session: SessionDep, settings: SettingsDep,
               backend: BackendDep) -> JobPublic:
    job = service.create_job(session, settings, backend, spec)
    response.headers["Location"] = f"/api/v1/jobs/{job.id}"
    return service.to_public(session, job)


@router.get("", response_model=JobsPublic)
def list_jobs(session: SessionDep, offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
              limit: Annotated[int, Query(ge=1, le=200)] = 50,
              status: JobStatus | None = None) -> JobsPublic:
    return service.list_jobs(session, offset, limit, status)


@router.get("/{job_id}", response_model=JobPublic)
def get_job(job_id: str, session: SessionDep) -> JobPublic:
    return service.to_public(session, service.get_job(session, job_id))


@router.delete("/{job_id}", status_code=status.HTTP_202_ACCEPTED, response_model=Accepted)
def cancel_job(job_id: str, session: SessionDep, backend: BackendDep,
               broker: BrokerDep) -> Accepted:
    job = service.delete_workload(session, backend, job_id)  # seconds: outside the lock
    with broker.ordering:
        event = service.mark_cancelled(session, job)
        broker.publish(job.id, [service.event_item(event)])
    return Accepted(id=job.id, status=job.status.value,
                    detail="workload deleted; checkpoints are kept")


@router.get("/{job_id}/events", response_model=EventsPublic)
def list_events(job_id: str, session: SessionDep,
                after: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
                limit: Annotated[int, Query(ge=1, le=1000)] = 200,
                type: Annotated[list[str] | None, Query()] = None) -> EventsPublic:
    return service.list_events(session, job_id, after, limit, type)
