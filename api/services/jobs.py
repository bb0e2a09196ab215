"""Job lifecycle: create and launch, read, scale, cancel, delete, kill a pod, list events (a
pod's migration is api/services/pod_migrations.py's)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, func, select

from api.auth import hash_token
from api.backends.base import (
    Backend,
    BackendError,
    Launch,
    PlacementError,
    Resources,
    Unsupported,
    WorkloadConflict,
    WorkloadNotFound,
)
from api.errors import BackendUnavailable, Conflict, InvalidSpec, NotFound, NotSupported
from api.models import (
    ACTIVE_STATUSES,
    Event,
    EventPublic,
    EventsPublic,
    FinishRequest,
    Incarnation,
    Job,
    JobCreate,
    JobPublic,
    JobsPublic,
    JobStatus,
    JobUpdate,
    Migration,
    Model,
    Pod,
    PodPublic,
    Progress,
    utc_now,
)
from api.services import preparation
from api.services.artifacts import checkpoints_dir, delete_files, model_dir
from api.services.events import EventLog, event_page, new_event
from api.services.job_credentials import CredentialError, grant
from api.services.job_inputs import check_quantization, validate_sources
from api.settings import Settings
from trainer.contract.spec import JobSpec

logger = logging.getLogger(__name__)

REMOVED = "Removed"
"""The phase of a pod row whose ordinal was scaled away and whose process has ended."""
T = TypeVar("T")


def _launch(settings: Settings, job: Job, spec: JobSpec, token: str) -> Launch:
    resources = Resources(**spec.resources.model_dump()) if spec.resources else None
    # A live pipeline needs another replica to heal from: one alone restarts as a whole.
    mode = ("restart" if spec.parallelism == "pipeline" and spec.replicas == 1
            else spec.fault_tolerance)
    return Launch(job_id=job.id, pods=spec.pods, fault_tolerance=mode,
                  spec=job.spec, resources=resources,
                  report_url=f"{settings.base_url}/api/v1/jobs/{job.id}/reports",
                  report_token=token, peer_secret=secrets.token_urlsafe(32),
                  checkpoint_dir=checkpoints_dir(settings, job.id),
                  model_dir=model_dir(settings, job.id), inputs_dir=settings.resolved_inputs_dir,
                  cache_dir=settings.cache_dir,
                  store_env=grant(settings, job.id) if settings.artifacts_per_job else {})


def create_job(session: Session, settings: Settings, backend: Backend, events: EventLog,
               spec: JobCreate) -> Job:
    """Create the job and launch it, or leave it `preparing` while the hub repositories it
    names are staged (api.services.preparation; the reconciler launches it then)."""
    validate_sources(spec, settings.resolved_inputs_dir)
    check_quantization(spec, backend.name)
    job = Job(id=f"job-{secrets.token_hex(4)}", name=spec.name, spec=spec,
              report_token_hash=hash_token(secrets.token_urlsafe(32)))  # replaced at launch
    with events.append(session) as created:
        session.add(job)
        session.flush()  # the job's row first: its pods and events refer to it
        session.add_all([Pod(job_id=job.id, ordinal=ordinal, name=f"{job.id}-{ordinal}")
                         for ordinal in range(spec.pods)])
        created.add(new_event(job.id, "job", status="pending", message="job created",
                              spec=spec.model_dump(mode="json")))
    if preparation.prepared(session, settings, backend, events, job, retry=True):
        launch_job(session, settings, backend, events, job)
    return job


def launch_job(session: Session, settings: Settings, backend: Backend, events: EventLog,
               job: Job) -> None:
    """Launch a pending or prepared job's workload, with a report token of its own."""
    spec = job.spec
    token = secrets.token_urlsafe(32)
    job.report_token_hash = hash_token(token)
    try:
        launch = _launch(settings, job, spec, token)
        backend.launch(launch)
    except Exception as exc:
        # Whatever failed, the job must not stay pending: it ends here, with the reason.
        known = isinstance(exc, BackendError | OSError | CredentialError)
        reason = f"launch failed: {exc}" if known else "launch failed: internal error"
        job.status, job.reason, job.finished_at = JobStatus.failed, reason, utc_now()
        with events.append(session) as failed:
            failed.add(new_event(job.id, "job", status="failed", message=reason))
        if not known:
            raise
        raise BackendUnavailable(f"job {job.id} could not be launched: {exc}") from None
    job.status, job.started_at = JobStatus.starting, utc_now()
    launched = [new_event(job.id, "job", status="starting",
                          message=f"{backend.name} backend launched {spec.pods} pods")]
    if launch.fault_tolerance != spec.fault_tolerance:
        launched.append(new_event(
            job.id, "job", type="restart_mode", fault_tolerance=launch.fault_tolerance,
            message="one pipeline replica has no live peer to heal from: it restarts from "
                    "the newest checkpoint on a failure (live needs replicas >= 2)"))
    with events.append(session) as appending:
        appending.add(*launched)
    logger.info("job %s launched on %s with %d pods", job.id, backend.name, spec.pods)


def get_job(session: Session, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def pods_of(session: Session, job_id: str) -> list[Pod]:
    return pods_by_job(session, [job_id])[job_id]


def pods_by_job(session: Session, job_ids: list[str]) -> dict[str, list[Pod]]:
    """The pods of several jobs (a page of jobs) in one query, each job's by ordinal."""
    found: dict[str, list[Pod]] = {job_id: [] for job_id in job_ids}
    query = select(Pod).where(col(Pod.job_id).in_(job_ids)).order_by(col(Pod.ordinal))
    for pod in session.exec(query):
        found[pod.job_id].append(pod)
    return found


def current_pods(job: Job, pods: list[Pod]) -> list[Pod]:
    """Of the job's pods, its ordinals and those scaled away that have not ended yet."""
    return [pod for pod in pods if pod.ordinal < job.spec.pods or pod.phase != REMOVED]


def to_public(session: Session, job: Job, pods: list[Pod] | None = None) -> JobPublic:
    """The job as the API shows it; `pods`, when given, are all of its pods (else read)."""
    epochs = min(job.finish_after_epoch or job.spec.epochs, job.spec.epochs)
    total = job.total_samples * epochs // job.spec.epochs if job.total_samples else None
    remaining = (total - job.samples_seen) if total else None
    throughput = job.metrics.get("samples_per_second")
    eta = None
    if remaining is not None and throughput and not job.status.finished:
        eta = round(max(remaining, 0) / throughput, 1)
    base, stages = f"/api/v1/jobs/{job.id}", job.spec.stages
    links = {"self": base, "events": f"{base}/events", "stream": f"{base}/stream",
             "stream_link": f"{base}/stream-link", "checkpoints": f"{base}/checkpoints",
             "cancel": f"{base}/cancel", "kill": f"{base}/pods/{{ordinal}}/kill",
             "migrate": f"{base}/pods/{{ordinal}}/migrate"}
    if job.model_id:
        links["model"] = f"/api/v1/models/{job.model_id}"
    return JobPublic(
        id=job.id, name=job.name, status=job.status, reason=job.reason,
        spec=job.spec.model_dump(mode="json"),
        pods=[PodPublic.model_validate(p).model_copy(update={
                  "replica": p.ordinal // stages, "stage": p.ordinal % stages})
              for p in current_pods(job, pods_of(session, job.id) if pods is None else pods)],
        progress=Progress(epoch=job.epoch, epochs=epochs, step=job.step,
                          samples_seen=job.samples_seen, total_samples=total,
                          eta_seconds=eta),
        metrics=job.metrics, created_at=job.created_at, started_at=job.started_at,
        finished_at=job.finished_at, model_id=job.model_id, links=links)


def list_jobs(session: Session, offset: int, limit: int,
              status: JobStatus | None = None) -> JobsPublic:
    query = select(Job)
    count_query = select(func.count()).select_from(Job)
    if status is not None:
        query = query.where(Job.status == status)
        count_query = count_query.where(Job.status == status)
    jobs = list(session.exec(query.order_by(col(Job.created_at).desc()).offset(offset)
                             .limit(limit)))
    pods = pods_by_job(session, [job.id for job in jobs])
    return JobsPublic(data=[to_public(session, job, pods[job.id]) for job in jobs],
                      count=session.exec(count_query).one(), offset=offset, limit=limit)


def still_active(session: Session, job_id: str) -> bool:
    """Whether the job is still unfinished in the database (a guard for EventLog.append)."""
    status = session.exec(select(Job.status).where(Job.id == job_id)).first()
    return status is not None and not JobStatus(status).finished


def cancel_job(session: Session, backend: Backend, events: EventLog,
               job_id: str) -> tuple[Job, str]:
    """Mark the job cancelled, then delete its workload (its checkpoints stay); the job and a
    word on its workload.

    The job is cancelled first: a reconciler pass that sees the pods end during the deletion
    then leaves the job alone instead of calling it failed. A deletion that fails is retried by
    the reconciler, which removes every workload of a finished job.
    """
    job = get_job(session, job_id)
    if job.status.finished:
        raise Conflict(f"job {job_id} already {job.status.value}")
    job.status, job.finished_at, job.reason = JobStatus.cancelled, utc_now(), "cancelled by user"
    event = new_event(job.id, "job", status="cancelled",
                      message="cancelled: the workload is deleted, checkpoints are kept")
    with events.append(session, guard=lambda: still_active(session, job_id)) as cancelled:
        cancelled.add(event)
    if not cancelled.committed:
        session.refresh(job)
        raise Conflict(f"job {job_id} {job.status.value} before it could be cancelled")
    try:
        backend.delete(job_id)  # seconds, on Kubernetes: outside the event lock
    except BackendError as exc:
        logger.warning("job %s: cancelled, but its workload is not deleted yet: %s", job_id, exc)
        return job, f"cancelled; deleting the workload failed ({exc}) and is retried"
    return job, "workload deleted; checkpoints are kept"


def finish_job(session: Session, events: EventLog, job_id: str,
               request: FinishRequest) -> tuple[Job, str]:
    """Ask the job's pods to finish after `request.after_epoch` (else the epoch under way): they
    agree through their steps on the epoch, this one or the one under way where they are past
    it (trainer.finish), then evaluate, export and succeed. Asking again for the same epoch
    changes nothing; another is a conflict."""
    job = get_job(session, job_id)
    if job.status.finished:
        raise Conflict(f"job {job_id} already {job.status.value}")
    spec = job.spec
    if spec.fault_tolerance == "live" and not spec.constant_batch:
        raise Conflict("a live job on an elastic batch (elastic_batch: true) cannot finish "
                       "early: its pods sum no statistics of their steps to agree on when")
    epoch = request.after_epoch or max(job.epoch, 1)
    if epoch > spec.epochs:
        raise InvalidSpec("after_epoch", f"must be at most the job's epochs ({spec.epochs})")
    if job.finish_after_epoch is not None:
        if request.after_epoch in (None, job.finish_after_epoch):
            return job, f"finishing after epoch {job.finish_after_epoch} of {spec.epochs}"
        raise Conflict(f"job {job_id} already finishes after epoch {job.finish_after_epoch}")
    job.finish_after_epoch = epoch
    session.add(job)
    message = (f"asked to finish after epoch {epoch} of {spec.epochs} (or the epoch under way "
               "when its pods agree, if later)")
    with events.append(session, guard=lambda: still_active(session, job_id)) as asked:
        asked.add(new_event(job_id, "job", type="finish_requested", epoch=epoch, by="admin",
                            message=message))
    if not asked.committed:
        session.refresh(job)
        raise Conflict(f"job {job_id} {job.status.value} before it could be asked to finish")
    logger.info("job %s asked to finish after epoch %d", job_id, epoch)
    return job, message


def delete_job(session: Session, settings: Settings, job_id: str, artifacts: bool) -> None:
    """Remove an ended job's record; with `artifacts`, its checkpoints, logs and model too."""
    job = get_job(session, job_id)
    if not job.status.finished:
        raise Conflict(f"job {job_id} is {job.status.value}: cancel it first")
    models = list(session.exec(select(Model).where(Model.job_id == job_id)))
    for table in (Event, Pod, Incarnation, Migration):
        session.exec(delete(table).where(col(table.job_id) == job_id))
    if artifacts:
        for model in models:
            session.delete(model)
    session.delete(job)
    try:
        session.commit()
    except IntegrityError:
        # A database created before models outlived their jobs keeps a foreign key on them.
        session.rollback()
        raise Conflict(f"job {job_id}'s model is registered in a database that ties it to the "
                       "job: delete with delete_artifacts=true to remove both") from None
    if artifacts:
        delete_files(settings, job_id, [model.path for model in models])
    logger.info("job %s deleted%s", job_id, " with its artifacts" if artifacts else "")


def check_ordinal(job: Job, ordinal: int) -> None:
    if ordinal < 0 or ordinal >= job.spec.pods:
        raise NotFound(f"job {job.id} has no pod {ordinal} (ordinals 0.."
                       f"{job.spec.pods - 1})")


def _active(job: Job, action: str) -> None:
    if job.status not in ACTIVE_STATUSES:
        raise Conflict(f"job {job.id} is {job.status.value}, not running: {action}")


def call_backend(action: str, call: Callable[[], T]) -> T:
    """Run a backend request, its errors as the API's."""
    try:
        return call()
    except WorkloadNotFound as exc:
        raise Conflict(f"no running workload to {action}: {exc}") from None
    except WorkloadConflict as exc:
        raise Conflict(str(exc)) from None
    except PlacementError as exc:
        raise InvalidSpec("node", str(exc)) from None
    except Unsupported as exc:
        raise NotSupported(str(exc)) from None
    except BackendError as exc:
        raise BackendUnavailable(str(exc)) from None


def kill_pod(session: Session, backend: Backend, events: EventLog, job_id: str, ordinal: int,
             grace_seconds: float) -> None:
    job = get_job(session, job_id)
    check_ordinal(job, ordinal)
    _active(job, "nothing to kill")
    call_backend("kill", lambda: backend.kill_pod(job_id, ordinal, grace_seconds))
    with events.append(session) as killed:
        killed.add(new_event(
            job_id, "pod", action="kill", ordinal=ordinal, name=f"{job_id}-{ordinal}",
            grace_seconds=grace_seconds, by="admin",
            message=f"pod {job_id}-{ordinal} killed on request (grace {grace_seconds:g} s)"))


def scale_job(session: Session, backend: Backend, events: EventLog, job_id: str,
              update: JobUpdate) -> Job:
    """Run `update.replicas` pods: the spec says so at once, the pods follow."""
    job = get_job(session, job_id)
    if job.spec.parallelism == "pipeline":
        raise InvalidSpec("replicas", "a pipeline job cannot be scaled yet")
    limit = job.spec.max_replicas
    if update.replicas > limit:
        raise InvalidSpec("replicas", f"must be at most the job's max_replicas ({limit})")
    _active(job, "it cannot be scaled")
    before = job.spec.replicas
    if update.replicas == before:
        return job
    call_backend("scale", lambda: backend.scale(job_id, update.replicas))
    job.spec = job.spec.model_copy(update={"replicas": update.replicas})
    rows = {pod.ordinal: pod for pod in pods_of(session, job_id)}
    for ordinal in range(before, update.replicas):
        pod = rows.get(ordinal) or Pod(job_id=job_id, ordinal=ordinal, name=f"{job_id}-{ordinal}")
        pod.phase, pod.exit_code = "Pending", None
        session.add(pod)
    session.add(job)
    direction = "up" if update.replicas > before else "down"
    message = f"scaled {direction} from {before} to {update.replicas} pods"
    shards = job.spec.shards
    if job.spec.constant_batch and update.replicas > shards:
        message += (f"; a step has {shards} shards, so {update.replicas - shards} of them wait "
                    "as warm spares (a larger global_batch_size at submission lets more pods "
                    "share a step)")
    with events.append(session, guard=lambda: still_active(session, job_id)) as scaled:
        scaled.add(new_event(
            job_id, "job", type="scaled", **{"from": before, "to": update.replicas},
            by="admin", message=message))
    logger.info("job %s scaled from %d to %d pods", job_id, before, update.replicas)
    return job


def list_events(session: Session, job_id: str, after: int, limit: int,
                types: list[str] | None, before: int | None = None,
                points: bool = True, newest: bool = False) -> EventsPublic:
    get_job(session, job_id)
    page, edge = event_page(session, job_id, after, limit, types, before=before, points=points,
                            newest=newest)
    data = [EventPublic.model_validate(e) for e in page]
    if newest:
        return EventsPublic(data=data, next_after=None, next_before=edge)
    return EventsPublic(data=data, next_after=edge)
