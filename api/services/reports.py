"""Ingestion of trainer reports: authenticate, drop duplicates, store events, update progress."""

from __future__ import annotations

import hmac
from typing import Any

from sqlmodel import Session, select

from api.errors import Forbidden, InvalidSpec
from api.models import Event, Incarnation, Job, JobStatus, Pod, ReportBatch, utc_now
from api.services.jobs import add_event, get_job, hash_token

# Report record kind -> stream event type.
STREAM_TYPES = {"metric": "metric", "eval": "metric", "checkpoint": "checkpoint", "event": "job",
                "samples": "samples"}
LIVE_METRICS = ("loss", "samples_per_second", "learning_rate", "participants")


def authenticate(session: Session, job_id: str, token: str) -> Job:
    """The job whose report token this is; a token of another job is refused (403)."""
    job = get_job(session, job_id)
    if not hmac.compare_digest(hash_token(token), job.report_token_hash):
        raise Forbidden(f"this report token is not valid for job {job_id}")
    return job


def _pod(session: Session, job: Job, name: str) -> Pod:
    pod = session.exec(select(Pod).where(Pod.job_id == job.id, Pod.name == name)).first()
    if pod is None:
        raise InvalidSpec("pod", f"job {job.id} has no pod named {name!r}")
    return pod


def _apply_metric(job: Job, pod: Pod, data: dict[str, Any]) -> None:
    step = int(data.get("step", 0))
    pod.step = max(pod.step or 0, step)
    if step >= job.step:
        job.step, job.epoch = step, int(data.get("epoch", job.epoch))
        job.samples_seen = int(data.get("samples_seen", job.samples_seen))
        job.metrics = {**job.metrics, **{k: data[k] for k in LIVE_METRICS if k in data}}


def _apply_eval(job: Job, data: dict[str, Any]) -> None:
    prefix = "val" if data.get("split") == "validation" else data.get("split", "eval")
    job.metrics = {**job.metrics, **{f"{prefix}_{k}": data[k] for k in ("accuracy", "f1", "loss")
                                     if k in data}}


def _apply_event(job: Job, data: dict[str, Any]) -> None:
    kind = data.get("type")
    if kind == "started" and isinstance(data.get("samples"), dict):
        train = int(data["samples"].get("train", 0))
        job.total_samples = train * int(job.spec.get("epochs", 1))
    elif kind == "completed" and data.get("primary") and data.get("model_dir"):
        job.completed_model_dir = str(data["model_dir"])


def ingest(session: Session, job: Job, batch: ReportBatch) -> tuple[list[Event], int]:
    """Store the batch's new records; return (stored events, duplicates skipped)."""
    pod = _pod(session, job, batch.pod)
    key = (job.id, batch.pod, batch.incarnation)
    seen = session.get(Incarnation, key) or Incarnation(
        job_id=job.id, pod=batch.pod, incarnation=batch.incarnation)
    fresh = sorted((r for r in batch.records if r.seq > seen.last_seq), key=lambda r: r.seq)
    unique = list({r.seq: r for r in fresh}.values())
    events = []
    for record in unique:
        data = {**record.data, "pod": batch.pod, "kind": record.kind}
        events.append(Event(job_id=job.id, type=STREAM_TYPES[record.kind], time=record.time,
                            data=data))
        if record.kind == "metric":
            _apply_metric(job, pod, record.data)
        elif record.kind == "eval":
            _apply_eval(job, record.data)
        elif record.kind == "event":
            _apply_event(job, record.data)
    if batch.dropped:
        events.append(add_event(session, job.id, "log", pod=batch.pod, level="warning",
                                message=f"{batch.dropped} metric records of {batch.pod} were "
                                        f"dropped while the API was unreachable"))
    session.add_all(events)
    if unique:
        seen.last_seq = unique[-1].seq
        session.add(seen)
    pod.last_heartbeat = utc_now()
    if job.status == JobStatus.starting and unique:
        job.status = JobStatus.running
        events.append(add_event(session, job.id, "job", status="running",
                                message="training is running"))
    session.add(job)
    session.add(pod)
    session.commit()
    return events, len(batch.records) - len(unique)

