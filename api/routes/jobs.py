"""Jobs: create, list, read, scale, cancel, finish early, delete, and their event history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from api.auth import AdminRoute
from api.deps import (
    BackendDep,
    EventsDep,
    LinkSignerDep,
    ReportTokensDep,
    SessionDep,
    SettingsDep,
)
from api.errors import error_responses
from api.models import (
    Accepted,
    EventsPublic,
    FinishRequest,
    JobCreate,
    JobPublic,
    JobsPublic,
    JobStatus,
    JobUpdate,
    SeriesPublic,
    StreamLink,
)
from api.routes import API_PREFIX
from api.services import jobs as service
from api.services import series
from api.services.links import stream_link
from trainer.contract.spec import MAX_INT

router = APIRouter(prefix=API_PREFIX + "/jobs", tags=["jobs"],
                   route_class=AdminRoute, responses=error_responses(401, 403, 413, 422))


@router.post("", status_code=status.HTTP_201_CREATED, response_model=JobPublic,
             responses=error_responses(503))
def create_job(spec: JobCreate, response: Response, session: SessionDep, settings: SettingsDep,
               backend: BackendDep, events: EventsDep) -> JobPublic:
    job = service.create_job(session, settings, backend, events, spec)
    response.headers["Location"] = f"{API_PREFIX}/jobs/{job.id}"
    return service.to_public(session, job)


@router.get("", response_model=JobsPublic)
def list_jobs(session: SessionDep, offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
              limit: Annotated[int, Query(ge=1, le=200)] = 50,
              status: JobStatus | None = None) -> JobsPublic:
    return service.list_jobs(session, offset, limit, status)


@router.get("/{job_id}", response_model=JobPublic, responses=error_responses(404))
def get_job(job_id: str, session: SessionDep) -> JobPublic:
    return service.to_public(session, service.get_job(session, job_id))


@router.patch("/{job_id}", response_model=JobPublic, responses=error_responses(404, 409, 503))
def update_job(job_id: str, update: JobUpdate, session: SessionDep, backend: BackendDep,
               events: EventsDep) -> JobPublic:
    """Scale a starting, running or degraded job to `replicas` pods (1 to its
    `max_replicas`): its spec says so at once and its pods follow; the highest ordinals leave
    gracefully, new ones heal from a peer."""
    return service.to_public(session, service.scale_job(session, backend, events, job_id, update))


@router.post("/{job_id}/cancel", status_code=status.HTTP_202_ACCEPTED, response_model=Accepted,
             responses=error_responses(404, 409))
def cancel_job(job_id: str, session: SessionDep, backend: BackendDep,
               events: EventsDep) -> Accepted:
    """Stop the job: its workload is deleted, its checkpoints are kept."""
    job, detail = service.cancel_job(session, backend, events, job_id)
    return Accepted(id=job.id, status=job.status.value, detail=detail)


@router.post("/{job_id}/finish", status_code=status.HTTP_202_ACCEPTED, response_model=Accepted,
             responses=error_responses(404, 409))
def finish_job(job_id: str, session: SessionDep, events: EventsDep,
               request: FinishRequest | None = None) -> Accepted:
    """Finish the job early, after epoch `after_epoch` (none: the epoch under way): its pods
    agree on the epoch through their steps (a later one where they are past it), then evaluate
    on test, export the model and succeed, as at the end of a whole run. The learning-rate
    schedule stays the whole run's: the model is the one a whole run holds after that epoch. A
    live job on an elastic batch cannot agree on it (409)."""
    job, detail = service.finish_job(session, events, job_id, request or FinishRequest())
    return Accepted(id=job.id, status=job.status.value, detail=detail)


@router.delete("/{job_id}", status_code=status.HTTP_204_NO_CONTENT,
               responses=error_responses(404, 409))
def delete_job(job_id: str, session: SessionDep, settings: SettingsDep,
               tokens: ReportTokensDep, delete_artifacts: bool = False) -> Response:
    """Remove an ended job's record (409 while it runs: cancel it first). Its checkpoints, logs
    and model stay unless `delete_artifacts` is true."""
    service.delete_job(session, settings, job_id, delete_artifacts)
    tokens.forget(job_id)  # its pods, if any were left, get 403
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{job_id}/events", response_model=EventsPublic, responses=error_responses(404))
def list_events(job_id: str, session: SessionDep,
                after: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
                limit: Annotated[int, Query(ge=1, le=1000)] = 200,
                type: Annotated[list[str] | None, Query()] = None,
                before: Annotated[int | None, Query(ge=1, le=MAX_INT)] = None,
                points: bool = True, newest: bool = False) -> EventsPublic:
    """The job's events after id `after` (and before id `before`, if given), oldest first: at
    most `limit` of them and 1 MiB of their data (but always one); follow `next_after` for the
    rest. `newest=true` takes the newest of them instead (still listed oldest first); follow
    `next_before` for older ones. `points=false` leaves out the metric points (`/series` serves
    them)."""
    return service.list_events(session, job_id, after, limit, type, before, points, newest)


@router.get("/{job_id}/series", response_model=SeriesPublic, responses=error_responses(404))
def get_series(job_id: str, session: SessionDep,
               points: Annotated[int, Query(ge=10, le=10_000)] = 1000) -> SeriesPublic:
    """The job's chart series up to `last_id`, at most about `points` steps (extremes kept)
    whatever its history's length; the dashboard then reads the other events up to `last_id`
    and streams from it."""
    return series.job_series(session, job_id, points)


@router.post("/{job_id}/stream-link", response_model=StreamLink, responses=error_responses(404))
def create_stream_link(job_id: str, request: Request, session: SessionDep,
                       settings: SettingsDep, signer: LinkSignerDep) -> StreamLink:
    """A URL that opens the job's event stream without a token (an EventSource sends no
    headers), for `stream_link_seconds`; an open stream is never cut, a reconnect takes a new
    link."""
    job = service.get_job(session, job_id)
    return stream_link(signer, request.app.url_path_for("stream", job_id=job.id), settings)
