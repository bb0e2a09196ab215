"""What a report batch becomes: the event rows of its new records, and the changes they make to
the job's and the pod's views (progress, a migration completed, the event quota)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, select, update

from api.models import Event, EventType, JobStatus, Migration
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
EVENTS, MIGRATIONS = Event.__table__, Migration.__table__  # type: ignore[attr-defined]
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


def of_incarnation(reported: str, incarnation: str | None) -> bool:
    """Whether a batch's incarnation is the pod incarnation a backend named (restart-mode
    workers add a suffix of their own to it)."""
    return incarnation is not None and (reported == incarnation
                                        or reported.startswith(f"{incarnation}-"))


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
        if isinstance(record.data, Joined):
            rows += [(row, True) for row in complete_migration(
                connection, job, pod, batch.incarnation, record.data, record.time)]
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
    migrated = connection.execute(select(MIGRATIONS.c.old_incarnation).where(
        MIGRATIONS.c.job_id == job.id, MIGRATIONS.c.ordinal == pod.ordinal)).scalars()
    if any(of_incarnation(incarnation, old) for old in migrated):
        return "migrate"
    return "sigterm"


def complete_migration(connection: Connection, job: JobView, pod: PodView, incarnation: str,
                       joined: Joined, time_: float) -> Items:
    """A pod's new incarnation took part: the pending migration of it, if any, is done."""
    migration = connection.execute(select(MIGRATIONS).where(
        MIGRATIONS.c.job_id == job.id, MIGRATIONS.c.ordinal == pod.ordinal,
        MIGRATIONS.c.status == "pending").order_by(MIGRATIONS.c.id.desc())).first()
    if (migration is None or of_incarnation(incarnation, migration.old_incarnation)
            or time_ < migration.requested_at):
        return []
    seconds = round(time_ - migration.requested_at, 3)
    # The replacement started from the state after step `joined.step - 1`.
    lost = max(0, migration.step_at_request - (joined.step - 1))
    connection.execute(update(MIGRATIONS).where(MIGRATIONS.c.id == migration.id).values(
        status="done", new_incarnation=incarnation, seconds=seconds, steps_lost=lost))
    return [event_row(job.id, "job", time_, {
        "type": "migrated", "ordinal": pod.ordinal, "pod": joined.pod,
        "old_incarnation": migration.old_incarnation, "new_incarnation": incarnation,
        "node_from": migration.node_from, "node_to": migration.node_to,
        "seconds": seconds, "steps_lost": lost, "step": joined.step,
        "message": f"{joined.pod} migrated: its replacement took part {seconds:.1f} s "
                   f"after the request, {lost} steps lost"})]
