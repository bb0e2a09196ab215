"""A pod migration's whole life: started by an admin's request, completed when the new
incarnation's `joined` report arrives (the report writer), failed when its replacement is gone
without having taken part (the reconciler).

Its one timeout is the backends' own (`api.backends.base.MIGRATION_TIMEOUT`): a backend gives
up on a replacement then, and a migration still pending after it, whose pod is no longer
migrating, has failed.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import sqlalchemy
from sqlalchemy import ColumnElement, Connection, update
from sqlmodel import Session, col, select

from api.backends.base import MIGRATION_TIMEOUT, Backend, WorkloadStatus
from api.errors import Conflict
from api.models import Event, Job, JobStatus, Migration
from api.services.events import EventLog, new_event
from api.services.jobs import call_backend, check_ordinal, get_job, still_active
from trainer.contract.records import Joined

MIGRATIONS = Migration.__table__  # type: ignore[attr-defined]


def of_incarnation(reported: str, incarnation: str | None) -> bool:
    """Whether a batch's incarnation is the pod incarnation a backend named (restart-mode
    workers add a suffix of their own to it)."""
    return incarnation is not None and (reported == incarnation
                                        or reported.startswith(f"{incarnation}-"))


def start(session: Session, backend: Backend, events: EventLog, job_id: str, ordinal: int,
          node: str | None) -> Migration:
    """Start moving one pod: its replacement starts; the reports say when it takes part."""
    job = get_job(session, job_id)
    check_ordinal(job, ordinal)
    if job.spec.stages > 1:
        raise Conflict(f"job {job_id} is a pipeline job: its pods cannot be migrated yet (each "
                       "stage pod holds a part of its replica's model)")
    if job.status not in (JobStatus.running, JobStatus.degraded):
        raise Conflict(f"job {job_id} is {job.status.value}: only a running job's pods migrate")
    pending = session.exec(select(Migration).where(
        Migration.job_id == job_id, Migration.ordinal == ordinal,
        Migration.status == "pending")).first()
    if pending is not None:
        raise Conflict(f"pod {job_id}-{ordinal} is already migrating (since "
                       f"{time.time() - pending.requested_at:.0f} s)")
    requested_at = time.time()
    moving = call_backend("migrate", lambda: backend.migrate_pod(job_id, ordinal, node))
    migration = Migration(job_id=job_id, ordinal=ordinal, requested_at=requested_at,
                          step_at_request=job.step, node_to=node,
                          old_incarnation=moving.incarnation, node_from=moving.node)
    session.add(migration)
    name = f"{job_id}-{ordinal}"
    with events.append(session, guard=lambda: still_active(session, job_id)) as started:
        started.add(new_event(
            job_id, "pod", action="migrate", ordinal=ordinal, name=name, node=node, by="admin",
            message=f"pod {name} migrating" + (f" to node {node}" if node else "")
                    + ": its replacement starts"))
    return migration


def pending_by_job(session: Session, jobs: ColumnElement[bool]) -> dict[str, list[Migration]]:
    """The pending migrations of the jobs `jobs` selects, per job (one query for them all)."""
    pending: dict[str, list[Migration]] = defaultdict(list)
    for migration in session.exec(select(Migration).join(Job).where(
            jobs, col(Migration.status) == "pending")):
        pending[migration.job_id].append(migration)
    return pending


def complete(connection: Connection, job_id: str, ordinal: int, incarnation: str,
             joined: Joined, time_: float) -> dict[str, Any] | None:
    """A pod's new incarnation took part: the pending migration of it, if any, is done; the
    data of its `migrated` event then."""
    migration = connection.execute(sqlalchemy.select(MIGRATIONS).where(
        MIGRATIONS.c.job_id == job_id, MIGRATIONS.c.ordinal == ordinal,
        MIGRATIONS.c.status == "pending").order_by(MIGRATIONS.c.id.desc())).first()
    if (migration is None or of_incarnation(incarnation, migration.old_incarnation)
            or time_ < migration.requested_at):
        return None
    seconds = round(time_ - migration.requested_at, 3)
    # The replacement started from the state after step `joined.step - 1`.
    lost = max(0, migration.step_at_request - (joined.step - 1))
    connection.execute(update(MIGRATIONS).where(MIGRATIONS.c.id == migration.id).values(
        status="done", new_incarnation=incarnation, seconds=seconds, steps_lost=lost))
    return {"type": "migrated", "ordinal": ordinal, "pod": joined.pod,
            "old_incarnation": migration.old_incarnation, "new_incarnation": incarnation,
            "node_from": migration.node_from, "node_to": migration.node_to,
            "seconds": seconds, "steps_lost": lost, "step": joined.step,
            "message": f"{joined.pod} migrated: its replacement took part {seconds:.1f} s "
                       f"after the request, {lost} steps lost"}


def retired(connection: Connection, job_id: str, ordinal: int, incarnation: str) -> bool:
    """Whether a migration of the pod replaced `incarnation` (why it left)."""
    replaced = connection.execute(sqlalchemy.select(MIGRATIONS.c.old_incarnation).where(
        MIGRATIONS.c.job_id == job_id, MIGRATIONS.c.ordinal == ordinal)).scalars()
    return any(of_incarnation(incarnation, old) for old in replaced)


def fail_overdue(session: Session, job_id: str, status: WorkloadStatus,
                 pending: list[Migration]) -> list[Event]:
    """Fail the migrations whose replacement is gone without having taken part: older than
    MIGRATION_TIMEOUT, with their pod no longer migrating. Their events (not yet committed)."""
    events: list[Event] = []
    migrating = {p.ordinal for p in status.pods if p.migrating}
    for migration in pending:
        if (migration.ordinal in migrating
                or time.time() - migration.requested_at < MIGRATION_TIMEOUT):
            continue
        migration.status = "failed"
        session.add(migration)
        name = f"{job_id}-{migration.ordinal}"
        events.append(new_event(
            job_id, "job", type="migration_failed", ordinal=migration.ordinal, pod=name,
            message=f"migration of {name} failed: its replacement did not take part "
                    f"within {MIGRATION_TIMEOUT:.0f} s; the pod runs on as it was"))
    return events
