"""Job lifecycle: create and launch, read, cancel, kill a pod, list events."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, func, select

from api.backends.base import Backend, BackendError, Launch, Resources, WorkloadNotFound
from api.errors import BackendUnavailable, Conflict, InvalidSpec, NotFound
from api.models import (
    ACTIVE_STATUSES,
    Event,
    EventPublic,
    EventsPublic,
    Job,
    JobCreate,
    JobPublic,
    JobsPublic,
    JobStatus,
    Pod,
    PodPublic,
    Progress,
    utc_now,
)
from api.settings import Settings

logger = logging.getLogger(__name__)

DATASET_ALIASES = ("rotten_tomatoes", "imdb", "sst2", "yelp_polarity")
MODEL_ALIASES = ("minilm",)
LOCAL_DATA_SUFFIXES = (".csv", ".jsonl", ".parquet")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def add_event(session: Session, job_id: str, type_: str, **data: Any) -> Event:
    event = Event(job_id=job_id, type=type_, time=time.time(), data=data)
    session.add(event)
    return event


def event_item(event: Event) -> dict[str, Any]:
    """The broker/SSE form of a stored event."""
    return {"id": event.id, "type": event.type, "time": event.time, "data": event.data}


def _inside_inputs(field: str, value: str, inputs: Path) -> Path | None:
    """The local path `value` names under the inputs dir, None if nothing is there."""
    if Path(value).is_absolute():
        raise InvalidSpec(field, "give a path relative to the inputs dir, not an absolute path")
    # Lexical check: ".." cannot climb out; symlinks the operator put in the inputs dir may.
    candidate = Path(os.path.normpath(inputs / value))
    if not candidate.is_relative_to(inputs):
        raise InvalidSpec(field, "path escapes the inputs dir")
    return candidate if candidate.exists() else None


def validate_sources(spec: JobCreate, inputs: Path) -> None:
    """Local path under the inputs dir first, then aliases, then hub ids (models only)."""
    if spec.parallelism == "pipeline":
        raise InvalidSpec("parallelism", "'pipeline' is not available yet; use 'data'")
    if spec.finetune == "lora":
        raise InvalidSpec("finetune", "'lora' is not available yet; use 'full'")
    model = _inside_inputs("model", spec.model, inputs)
    if model is not None and not (model / "config.json").is_file():
        raise InvalidSpec("model", f"'{spec.model}' under the inputs dir has no config.json")
    if model is None and spec.model not in MODEL_ALIASES and (
            not HUB_ID.match(spec.model) or ".." in spec.model):
        raise InvalidSpec("model", f"'{spec.model}' is neither a model directory under the "
                                   "inputs dir, nor 'minilm', nor a Hugging Face hub id")
    dataset = _inside_inputs("dataset", spec.dataset, inputs)
    if dataset is not None:
        if not dataset.is_file() or dataset.suffix.lower() not in LOCAL_DATA_SUFFIXES:
            raise InvalidSpec("dataset", f"'{spec.dataset}' must be a "
                                         f"{'/'.join(LOCAL_DATA_SUFFIXES)} file")
    elif spec.dataset not in DATASET_ALIASES:
        raise InvalidSpec("dataset", f"unknown dataset '{spec.dataset}': use one of "
                                     f"{', '.join(DATASET_ALIASES)} or a file under the inputs dir")


def job_dir(settings: Settings, job_id: str) -> Path:
    return settings.jobs_dir / job_id


def create_job(session: Session, settings: Settings, backend: Backend, spec: JobCreate) -> Job:
    validate_sources(spec, settings.resolved_inputs_dir)
    token = secrets.token_urlsafe(32)
    # `resources` is stored only when given, and never reaches the trainer (not a trainer field).
    stored = spec.model_dump(exclude={"resources"} if spec.resources is None else None)
    job = Job(id=f"job-{secrets.token_hex(4)}", name=spec.name, spec=stored,
              report_token_hash=hash_token(token))
    session.add(job)
    session.flush()  # the job row first: pods and events refer to it
    for ordinal in range(spec.replicas):
        session.add(Pod(job_id=job.id, ordinal=ordinal, name=f"{job.id}-{ordinal}"))
    add_event(session, job.id, "job", status="pending", message="job created", spec=job.spec)
    session.commit()
    directory = job_dir(settings, job.id)
    resources = Resources(**spec.resources.model_dump()) if spec.resources else None
    trainer_spec = {key: value for key, value in job.spec.items() if key != "resources"}
    launch = Launch(job_id=job.id, replicas=spec.replicas, fault_tolerance=spec.fault_tolerance,
                    spec=trainer_spec, resources=resources,
                    report_url=f"{settings.base_url}/api/v1/jobs/{job.id}/reports",
                    report_token=token, heal_secret=secrets.token_urlsafe(32),
                    checkpoint_dir=directory / "checkpoints",
                    model_dir=directory / "model", inputs_dir=settings.resolved_inputs_dir,
                    cache_dir=settings.cache_dir)
    try:
        backend.launch(launch)
    except BackendError as exc:
        job.status, job.reason, job.finished_at = JobStatus.failed, f"launch failed: {exc}", \
            utc_now()
        add_event(session, job.id, "job", status="failed", message=job.reason)
        session.commit()
        raise BackendUnavailable(f"job {job.id} could not be launched: {exc}") from None
    job.status, job.started_at = JobStatus.starting, utc_now()
    add_event(session, job.id, "job", status="starting", message=f"{backend.name} backend "
                                                                 f"launched {spec.replicas} pods")
    session.commit()
    logger.info("job %s launched on %s with %d pods", job.id, backend.name, spec.replicas)
    return job


def get_job(session: Session, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def pods_of(session: Session, job_id: str) -> list[Pod]:
    return list(session.exec(select(Pod).where(Pod.job_id == job_id).order_by(col(Pod.ordinal))))


def to_public(session: Session, job: Job) -> JobPublic:
    epochs = int(job.spec.get("epochs", 1))
    remaining = (job.total_samples - job.samples_seen) if job.total_samples else None
    throughput = job.metrics.get("samples_per_second")
    eta = None
    if remaining is not None and throughput and not job.status.finished:
        eta = round(max(remaining, 0) / throughput, 1)
    base = f"/api/v1/jobs/{job.id}"
    links = {"self": base, "events": f"{base}/events", "stream": f"{base}/stream",
             "checkpoints": f"{base}/checkpoints", "kill": f"{base}/pods/{{ordinal}}/kill"}
    if job.model_id:
        links["model"] = f"/api/v1/models/{job.model_id}"
    return JobPublic(
        id=job.id, name=job.name, status=job.status, reason=job.reason, spec=job.spec,
        pods=[PodPublic.model_validate(p) for p in pods_of(session, job.id)],
        progress=Progress(epoch=job.epoch, epochs=epochs, step=job.step,
                          samples_seen=job.samples_seen, total_samples=job.total_samples,
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
    jobs = session.exec(query.order_by(col(Job.created_at).desc()).offset(offset).limit(limit))
    return JobsPublic(data=[to_public(session, job) for job in jobs],
                      count=session.exec(count_query).one(), offset=offset, limit=limit)


def delete_workload(session: Session, backend: Backend, job_id: str) -> Job:
    """The first half of a cancel: the job's pods are gone (its checkpoints stay)."""
    job = get_job(session, job_id)
    if job.status.finished:
        raise Conflict(f"job {job_id} already {job.status.value}")
    try:
        backend.delete(job_id)
    except BackendError as exc:
        raise BackendUnavailable(f"could not delete the workload of {job_id}: {exc}") from None
    return job


def mark_cancelled(session: Session, job: Job) -> Event:
    """The second half of a cancel: the job and its event say so."""
    job.status, job.finished_at, job.reason = JobStatus.cancelled, utc_now(), "cancelled by user"
    event = add_event(session, job.id, "job", status="cancelled",
                      message="cancelled: workload deleted, checkpoints kept")
    session.commit()
    return event


def check_ordinal(job: Job, ordinal: int) -> None:
    if ordinal < 0 or ordinal >= int(job.spec["replicas"]):
        raise NotFound(f"job {job.id} has no pod {ordinal} (ordinals 0.."
                       f"{int(job.spec['replicas']) - 1})")


def kill_pod(session: Session, backend: Backend, job_id: str, ordinal: int,
             grace_seconds: float) -> Event:
    job = get_job(session, job_id)
    check_ordinal(job, ordinal)
    if job.status not in ACTIVE_STATUSES:
        raise Conflict(f"job {job_id} is {job.status.value}, not running: nothing to kill")
    try:
        backend.kill_pod(job_id, ordinal, grace_seconds)
    except WorkloadNotFound as exc:
        raise Conflict(f"job {job_id} has no running workload: {exc}") from None
    except BackendError as exc:
        raise BackendUnavailable(str(exc)) from None
    event = add_event(session, job_id, "pod", action="kill", ordinal=ordinal,
                      name=f"{job_id}-{ordinal}", grace_seconds=grace_seconds, by="admin",
                      message=f"pod {job_id}-{ordinal} killed on request "
                              f"(grace {grace_seconds:g} s)")
    session.commit()
    return event


def list_events(session: Session, job_id: str, after: int, limit: int,
                types: list[str] | None) -> EventsPublic:
    get_job(session, job_id)
    query = select(Event).where(Event.job_id == job_id, col(Event.id) > after)
    if types:
        query = query.where(col(Event.type).in_(types))
    events = list(session.exec(query.order_by(col(Event.id)).limit(limit + 1)))
    page = events[:limit]
    return EventsPublic(data=[EventPublic.model_validate(e) for e in page],
                        next_after=page[-1].id if len(events) > limit and page else None)
