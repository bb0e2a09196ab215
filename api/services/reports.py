"""Ingestion of trainer reports: authenticate, drop duplicates, store events, update progress.

One writer thread stores every report. Concurrent batches share a transaction (group commit) and a
handful of statements: one multi-row INSERT for all their events, one UPDATE per job, one
executemany for pods and one for the seq high-water marks. SQLite has a single writer anyway;
queueing here instead of in SQLite's busy handler (which sleeps) keeps ingestion fast and its
latency flat under many reporters. The writer caches what only it changes (pod ids and steps, seq
high-water marks) and drops the caches whenever a transaction fails.

One batch must not fail the others: when a group's transaction fails, the group is written again
with a savepoint around each batch's own statements, and a batch that fails there is rolled back
to its savepoint and its changes to the job's and pod's views undone, while the others commit.
Its sender alone gets the error: a 422 for data the database refused (retrying would not help),
else a 500. Savepoints cost each batch a few statements (twice the writer's time per record on
PostgreSQL, measured), so the group tries without them first.

Each job's reports may store `max_job_event_bytes` of events (report_rows.admit). Past that, a
batch's other records still move the job's progress but are not stored, its sender gets a 429,
and the job one warning event.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from sqlalchemy import Connection, bindparam, insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError
from sqlmodel import Session

from api.errors import DomainError, InvalidSpec, NotFound, QuotaExceeded
from api.models import Incarnation, Job, JobStatus, Pod, utc_now
from api.services.events import EventLog
from api.services.job_view import JobView, PodView
from api.services.report_rows import EVENTS, Items, admit, stage
from trainer.contract.records import ReportBatch

logger = logging.getLogger(__name__)

JOBS, PODS, SEQS = (Job.__table__, Pod.__table__,  # type: ignore[attr-defined]
                    Incarnation.__table__)  # type: ignore[attr-defined]
SeqKey = tuple[str, str, str]
"""(job, pod, incarnation)."""


Taken = tuple[Items, int, int | None]
"""A stored batch's stream items, its duplicates, and its job's `finish_after_epoch`."""


@dataclass
class _Pending:
    job_id: str
    batch: ReportBatch
    done: Future[Taken] = field(default_factory=Future)


@dataclass
class _Staged:
    """A batch's part of the group's transaction."""

    rows: Items
    """The event rows it stores; once inserted, its stream items (with their ids)."""
    duplicates: int
    refused: int
    """Events the job's quota refused."""
    pod: PodView
    finish_after_epoch: int | None
    key: SeqKey
    last_seq: int | None
    """Its new seq high-water mark, if it had new records."""


Outcome = _Staged | Exception


def _refusal(exc: Exception) -> str | None:
    """Why the database refused a batch's data (a constraint, a value it cannot hold), or None
    for any other failure."""
    if isinstance(exc, IntegrityError | DataError) or (
            isinstance(exc, StatementError) and not isinstance(exc, DBAPIError)):
        return str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:300]
    return None


class ReportWriter:
    MAX_GROUP = 200

    def __init__(self, engine: Engine, events: EventLog, quota: int) -> None:
        self.engine, self.events, self.quota = engine, events, quota
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="report-writer", daemon=True)
        self._pods: dict[tuple[str, str], PodView] = {}
        self._seqs: dict[SeqKey, int | None] = {}
        """High-water seq per (job, pod, incarnation); None: no row stored yet."""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def submit(self, job_id: str, batch: ReportBatch) -> Future[Taken]:
        """Queue an authenticated batch; the future gives what it took (`Taken`)."""
        pending = _Pending(job_id, batch)
        self._queue.put(pending)
        return pending.done

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            group = [first]
            while len(group) < self.MAX_GROUP:
                try:
                    following = self._queue.get_nowait()
                except queue.Empty:
                    break
                if following is None:
                    self._queue.put(None)
                    break
                group.append(following)
            self._write(group)

    def _write(self, group: list[_Pending]) -> None:
        outcomes = self._store(group)
        for pending, outcome in zip(group, outcomes, strict=True):
            if isinstance(outcome, Exception):
                pending.done.set_exception(outcome)
            elif outcome.refused:
                pending.done.set_exception(QuotaExceeded(
                    f"job {pending.job_id} reached its event quota of {self.quota} bytes "
                    f"(MIGRATOR_MAX_JOB_EVENT_BYTES): {outcome.refused} events of this batch "
                    "were not stored. Its lifecycle events still are, and every record still "
                    "moves its progress."))
            else:
                pending.done.set_result((outcome.rows, outcome.duplicates,
                                         outcome.finish_after_epoch))

    def _store(self, group: list[_Pending]) -> list[Outcome]:
        """Each batch's outcome: the group in one transaction, or else each batch in a
        savepoint of one, so that a batch that fails fails alone."""
        try:
            return self._append(group, isolated=False)
        except Exception as exc:
            logger.warning("writing %d report batches at once failed (%s): writing each in a "
                           "savepoint", len(group), type(exc).__name__)
            self._forget()
        try:
            return self._append(group, isolated=True)
        except Exception as exc:
            logger.exception("writing %d report batches failed", len(group))
            self._forget()
            return [exc] * len(group)

    def _forget(self) -> None:
        """Drop the caches: the failed transaction may have changed them."""
        self._pods.clear()
        self._seqs.clear()

    def _append(self, group: list[_Pending], isolated: bool) -> list[Outcome]:
        """The group in one transaction, its events appended (committed, then published)."""
        with Session(self.engine) as session, self.events.append(session) as appending:
            outcomes = self._transaction(session.connection(), group, isolated)
            for pending, outcome in zip(group, outcomes, strict=True):
                if isinstance(outcome, _Staged) and outcome.rows:
                    appending.add_inserted(pending.job_id, outcome.rows)
        return outcomes

    def _transaction(self, connection: Connection, group: list[_Pending],
                     isolated: bool) -> list[Outcome]:
        if isolated and connection.dialect.name == "sqlite":
            # pysqlite begins a transaction only before its first write: a SAVEPOINT
            # before that would begin one of its own, which its RELEASE commits.
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        jobs = self._jobs(connection, {pending.job_id for pending in group})
        seqs: dict[SeqKey, int] = {}
        outcomes: list[Outcome] = []
        for pending in group:
            outcome = self._batch(connection, jobs, seqs, pending, isolated)
            if isinstance(outcome, _Staged) and outcome.last_seq is not None:
                seqs[outcome.key] = outcome.last_seq  # the group's next batches see it
            outcomes.append(outcome)
        staged = [outcome for outcome in outcomes if isinstance(outcome, _Staged)]
        if not isolated:
            self._insert_events(connection, staged)
        self._update(connection, jobs, {done.pod.id: done.pod for done in staged}, seqs)
        return outcomes

    def _batch(self, connection: Connection, jobs: dict[str, JobView], seqs: dict[SeqKey, int],
               pending: _Pending, isolated: bool) -> Outcome:
        """Stage one batch (and, isolated, insert its events in a savepoint): its outcome.

        Not isolated, a failure other than a domain error fails the whole transaction."""
        job = jobs.get(pending.job_id)
        if job is None:  # deleted since its token was checked
            return NotFound(f"job {pending.job_id} not found")
        if not isolated:
            try:
                return self._stage(connection, job, seqs, pending.batch)
            except DomainError as exc:  # found before anything was staged
                return exc
        pod_key = (job.id, pending.batch.pod)
        cached = self._pods.get(pod_key)
        before = job.snapshot(), cached.snapshot() if cached is not None else None
        try:
            with connection.begin_nested():
                done = self._stage(connection, job, seqs, pending.batch)
                self._insert_events(connection, [done])
            return done
        except Exception as exc:  # undo this batch's changes to the views: the group goes on
            job.restore(before[0])
            if cached is not None and before[1] is not None:
                cached.restore(before[1])
            else:
                self._pods.pop(pod_key, None)
            reason = _refusal(exc)
            if reason is not None:  # a 422: its sender drops the batch
                logger.warning("job %s: the database refused a report batch of %s: %s",
                               job.id, pending.batch.pod, reason)
                return InvalidSpec("records", f"the database refused this batch: {reason}")
            if not isinstance(exc, DomainError):  # a 500 for this batch's sender alone
                logger.exception("job %s: a report batch of %s failed", job.id,
                                 pending.batch.pod)
            return exc

    def _stage(self, connection: Connection, job: JobView, seqs: dict[SeqKey, int],
               batch: ReportBatch) -> _Staged:
        """The batch's rows (those its job's quota lets in) and changes to the views."""
        pod = self._pod(connection, job.id, batch.pod)
        key = (job.id, batch.pod, batch.incarnation)
        rows, duplicates, last_seq = stage(connection, job, pod, batch,
                                           seqs.get(key) or self._last_seq(connection, key))
        kept, refused = admit(job, batch, rows)
        return _Staged(kept, duplicates, refused, pod, job.finish_after_epoch, key, last_seq)

    def _jobs(self, connection: Connection, ids: set[str]) -> dict[str, JobView]:
        columns = (JOBS.c.id, JOBS.c.status, JOBS.c.spec, JOBS.c.step,
                   JOBS.c.epoch, JOBS.c.samples_seen, JOBS.c.total_samples, JOBS.c.metrics,
                   JOBS.c.completed_model_dir, JOBS.c.event_bytes, JOBS.c.finish_after_epoch)
        found = {}
        for row in connection.execute(select(*columns).where(JOBS.c.id.in_(ids))):
            found[row.id] = JobView(
                row.id, JobStatus(row.status), row.spec.epochs,
                row.spec.pods, row.step, row.epoch, row.samples_seen,
                row.total_samples, row.metrics or {}, row.completed_model_dir,
                row.event_bytes, self.quota, row.finish_after_epoch)
        return found

    def _pod(self, connection: Connection, job_id: str, name: str) -> PodView:
        if (job_id, name) not in self._pods:
            row = connection.execute(select(PODS.c.id, PODS.c.ordinal, PODS.c.step).where(
                PODS.c.job_id == job_id, PODS.c.name == name)).first()
            if row is None:
                raise InvalidSpec("pod", f"job {job_id} has no pod named {name!r}")
            self._pods[(job_id, name)] = PodView(row.id, row.ordinal, row.step or 0)
        return self._pods[(job_id, name)]

    def _last_seq(self, connection: Connection, key: SeqKey) -> int:
        if key not in self._seqs:
            self._seqs[key] = connection.execute(select(SEQS.c.last_seq).where(
                SEQS.c.job_id == key[0], SEQS.c.pod == key[1],
                SEQS.c.incarnation == key[2])).scalar()
        return self._seqs[key] or 0

    @staticmethod
    def _insert_events(connection: Connection, staged: list[_Staged]) -> None:
        """One multi-row INSERT ... RETURNING for the batches' rows, which become their stream
        items: the ids are the stream's event ids."""
        rows = [row for done in staged for row in done.rows]
        if not rows:
            return
        statement = insert(EVENTS).returning(EVENTS.c.id, sort_by_parameter_order=True)
        ids = iter(connection.execute(statement, rows).scalars().all())
        for done in staged:
            done.rows = [{"id": next(ids), "type": row["type"], "time": row["time"],
                          "data": row["data"]} for row in done.rows]

    def _update(self, connection: Connection, jobs: dict[str, JobView],
                pods: dict[int, PodView], seqs: dict[SeqKey, int]) -> None:
        for job in jobs.values():
            if job.changed:  # status is the reconciler's, except for the one move below
                connection.execute(update(JOBS).where(JOBS.c.id == job.id).values(
                    step=job.step, epoch=job.epoch, samples_seen=job.samples_seen,
                    total_samples=job.total_samples, metrics=job.metrics,
                    completed_model_dir=job.completed_model_dir, event_bytes=job.event_bytes))
            if job.agreed:  # on its own: the request may have set it since it was read
                connection.execute(update(JOBS).where(JOBS.c.id == job.id).values(
                    finish_after_epoch=job.finish_after_epoch))
            if job.started_running:
                connection.execute(update(JOBS).where(
                    JOBS.c.id == job.id, JOBS.c.status == JobStatus.starting).values(
                    status=JobStatus.running))
        if pods:
            now = utc_now()
            connection.execute(
                update(PODS).where(PODS.c.id == bindparam("pod_id"))
                .values(step=bindparam("pod_step"), last_heartbeat=now),
                [{"pod_id": p.id, "pod_step": p.step} for p in pods.values()])
        new = [k for k in seqs if self._seqs.get(k) is None]
        known = [k for k in seqs if self._seqs.get(k) is not None]
        if new:
            connection.execute(insert(SEQS), [
                {"job_id": k[0], "pod": k[1], "incarnation": k[2], "last_seq": seqs[k]}
                for k in new])
        if known:
            connection.execute(
                update(SEQS).where(SEQS.c.job_id == bindparam("k_job"),
                                   SEQS.c.pod == bindparam("k_pod"),
                                   SEQS.c.incarnation == bindparam("k_inc"))
                .values(last_seq=bindparam("k_seq")),
                [{"k_job": k[0], "k_pod": k[1], "k_inc": k[2], "k_seq": seqs[k]} for k in known])
        self._seqs.update(seqs)
