"""What a report batch becomes: the event rows of its new records, and the changes they make to
the job's and the pod's views (progress, the event quota); a `joined` record completes its pod's
migration (api/services/pod_migrations.py)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection

from api.models import Event, EventType, JobStatus
from api.services import pod_migrations
from api.services.events import json_size
from api.services.job_view import JobView, PodView
from trainer.contract.records import (
    Joined,
    Kind,
    LeaveReason,
    Left,
    Metric,
    RecordData,
    ReportBatch,
)

# Report record kind -> stream event type.
STREAM_TYPES: dict[Kind, EventType] = {"metric": "metric", "eval": "metric",
                                       "checkpoint": "checkpoint", "event": "job",
                                       "samples": "samples"}
EVENTS = Event.__table__  # type: ignore[attr-defined]
Items = list[dict[str, Any]]
Row = tuple[dict[str, Any], bool]
"""An event row to insert, and whether it is a lifecycle event (stored past the quota)."""
NO_POINT: dict[str, Any] = {"step": None, "loss": None, "rate": None, "participants": None}


def event_row(job_id: str, type_: EventType, time_: float, data: dict[str, Any],
              record: RecordData | None = None) -> dict[str, Any]:
    """An event row as the report writer inserts it, every column named (the rows of a group go
    in one multi-row INSERT): a metric point's numbers in their own columns (`Event.step`...)."""
    point = NO_POINT if not isinstance(record, Metric) else {
        "step": record.step, "loss": record.loss, "rate": record.samples_per_second,
        "participants": record.participants}
    return {"job_id": job_id, "type": type_, "time": time_, "data": data, **point}


def stage(connection: Connection, job: JobView, pod: PodView, batch: ReportBatch,
          last: int) -> tuple[list[Row], int, int | None]:
    """Event rows of the batch's records after seq `last`, its duplicates, and its new seq
    high-water mark; the job and pod views take the changes its records imply."""
    unique = sorted({r.seq: r for r in batch.records if r.seq > last}.values(),
                    key=lambda r: r.seq)
    rows: list[Row] = []
    for record in unique:
        # The validated fields as they are (JSON values: no dump needed).
        data = {**dict(record.data), "pod": batch.pod, "kind": record.kind}
        if isinstance(record.data, Left):
            data["reason"] = leave_reason(connection, job, pod, batch.incarnation)
        rows.append((event_row(job.id, STREAM_TYPES[record.kind], record.time, data, record.data),
                     record.kind == "event"))
        if isinstance(record.data, Joined) and (migrated := pod_migrations.complete(
                connection, job.id, pod.ordinal, batch.incarnation, record.data,
                record.time)) is not None:
            rows.append((event_row(job.id, "job", record.time, migrated), True))
        job.apply(record.data)
        if isinstance(record.data, Metric):
            pod.step = max(pod.step, record.data.step)
    now = time.time()
    if batch.dropped:
        rows.append((event_row(job.id, "log", now, {
            "pod": batch.pod, "level": "warning",
            "message": f"{batch.dropped} metric records of {batch.pod} were dropped while the "
                       "API was unreachable"}), False))
    if job.status == JobStatus.starting and unique:
        job.status, job.started_running = JobStatus.running, True
        rows.append((event_row(job.id, "job", now,
                               {"status": "running", "message": "training is running"}), True))
    return rows, len(batch.records) - len(unique), unique[-1].seq if unique else None


def admit(job: JobView, batch: ReportBatch, rows: list[Row]) -> tuple[Items, int]:
    """The rows the job's event quota lets in (each with its size), and how many it refused;
    with the job's one warning when this batch reached the quota."""
    told = job.over_quota
    kept: Items = []
    for row, lifecycle in rows:
        row["size"] = json_size(row["data"])
        if job.admit(row["size"], lifecycle):
            kept.append(row)
    refused = len(rows) - len(kept)
    if job.over_quota and not told:
        data = {"pod": batch.pod, "level": "warning", "quota_bytes": job.quota,
                "message": f"job {job.id} reached its event quota ({job.quota} bytes, "
                           "MIGRATOR_MAX_JOB_EVENT_BYTES): its metrics, evaluations, "
                           "checkpoint records and sample ids are no longer stored, its "
                           "lifecycle events still are"}
        size = json_size(data)
        job.event_bytes += size
        kept.append({**event_row(job.id, "log", time.time(), data), "size": size})
    return kept, refused


def leave_reason(connection: Connection, job: JobView, pod: PodView,
                 incarnation: str) -> LeaveReason:
    """Why a pod left: its ordinal was scaled away, a migration retired it, or else it got
    SIGTERM from outside (an eviction, a drain, a kill with a grace)."""
    if pod.ordinal >= job.replicas:
        return "scale-down"
    if pod_migrations.retired(connection, job.id, pod.ordinal, incarnation):
        return "migrate"
    return "sigterm"
