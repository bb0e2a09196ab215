"""Ingestion of trainer reports: authenticate, drop duplicates, store events, update progress.

One writer thread stores every report. Concurrent batches share a transaction (group commit) and a
handful of statements: one multi-row INSERT for all their events, one UPDATE per job, one
executemany for pods and one for the seq high-water marks. SQLite has a single writer anyway;
queueing here instead of in SQLite's busy handler (which sleeps) keeps ingestion fast and its
latency flat under many reporters. The writer caches what only it changes (pod ids and steps, seq
high-water marks) and drops the caches whenever a transaction fails.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, bindparam, insert, select, update
from sqlalchemy.engine import Engine

from api.errors import DomainError, InvalidSpec, NotFound
from api.models import Event, EventType, Incarnation, Job, JobStatus, Migration, Pod, utc_now
from api.services.events import EventLog
from trainer.contract.records import (
    Completed,
    Evaluation,
    Joined,
    Kind,
    LeaveReason,
    Left,
    Metric,
    RecordData,
    ReportBatch,
    Started,
    StepSkipped,
)
from trainer.contract.spec import pod_count

logger = logging.getLogger(__name__)

# Report record kind -> stream event type.
STREAM_TYPES: dict[Kind, EventType] = {"metric": "metric", "eval": "metric",
                                       "checkpoint": "checkpoint", "event": "job",
                                       "samples": "samples"}
LIVE_METRICS = ("loss", "samples_per_second", "learning_rate", "participants")
JOBS, PODS, EVENTS, SEQS, MIGRATIONS = (
    Job.__table__, Pod.__table__, Event.__table__,  # type: ignore[attr-defined]
    Incarnation.__table__, Migration.__table__)  # type: ignore[attr-defined]
Items = list[dict[str, Any]]


@dataclass
class JobView:
    """The columns of a job that ingestion reads and changes."""

    id: str
    status: JobStatus
    epochs: int
    replicas: int
    """Pods the job runs (replicas x stages for a pipeline)."""
    step: int
    epoch: int
    samples_seen: int
    total_samples: int | None
    metrics: dict[str, Any]
    completed_model_dir: str | None
    changed: bool = False
    started_running: bool = False
    """The first report arrived: starting -> running."""

    def apply(self, data: RecordData) -> None:
        match data:
            case Metric() if data.step >= self.step:
                self.step, self.epoch, self.samples_seen = data.step, data.epoch, data.samples_seen
                self.metrics = {**self.metrics, **{k: getattr(data, k) for k in LIVE_METRICS}}
            case Evaluation():
                prefix = "val" if data.split == "validation" else data.split
                self.metrics = {**self.metrics, f"{prefix}_accuracy": data.accuracy,
                                f"{prefix}_f1": data.f1, f"{prefix}_loss": data.loss}
            case Started():
                self.total_samples = data.samples.get("train", 0) * self.epochs
                if data.parameters is not None:  # none from a pipeline's stages
                    self.metrics = {**self.metrics, "parameters": data.parameters["total"],
                                    "trainable_parameters": data.parameters["trainable"]}
            case Completed() if data.model_dir:
                # The primary's export, or a live pod's that outlived it.
                self.completed_model_dir = data.model_dir
            case StepSkipped():  # every participant counts the job's skipped steps alike
                skipped = max(data.skipped, self.metrics.get("skipped_steps", 0))
                self.metrics = {**self.metrics, "skipped_steps": skipped}
            case _:
                return
        self.changed = True


@dataclass
class PodView:
    id: int
    ordinal: int
    step: int


def of_incarnation(reported: str, incarnation: str | None) -> bool:
    """Whether a batch's incarnation is the pod incarnation a backend named (restart-mode
    workers add a suffix of their own to it)."""
    return incarnation is not None and (reported == incarnation
                                        or reported.startswith(f"{incarnation}-"))


@dataclass
class _Pending:
    job_id: str
    batch: ReportBatch
    done: Future[tuple[Items, int]] = field(default_factory=Future)


class ReportWriter:
    MAX_GROUP = 200

    def __init__(self, engine: Engine, events: EventLog) -> None:
        self.engine, self.events = engine, events
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="report-writer", daemon=True)
        self._pods: dict[tuple[str, str], PodView] = {}
        self._seqs: dict[tuple[str, str, str], int | None] = {}
        """High-water seq per (job, pod, incarnation); None: no row stored yet."""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def submit(self, job_id: str, batch: ReportBatch) -> Future[tuple[Items, int]]:
        """Queue an authenticated batch; the future gives (stored stream items, duplicates)."""
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
        with self.events.batch() as publish:
            stored = self._store(group)
            for pending, items, _ in stored:
                publish(pending.job_id, items)
        for pending, items, duplicates in stored:
            pending.done.set_result((items, duplicates))

    def _store(self, group: list[_Pending]) -> list[tuple[_Pending, Items, int]]:
        """Store the group in one transaction: (batch, its stream items, duplicates skipped)."""
        staged: list[tuple[_Pending, Items, int]] = []
        try:
            with self.engine.begin() as connection:
                jobs = self._jobs(connection, {pending.job_id for pending in group})
                touched_pods: dict[int, PodView] = {}
                seqs: dict[tuple[str, str, str], int] = {}
                for pending in group:
                    try:
                        job = self._job(jobs, pending.job_id)
                        pod = self._pod(connection, job.id, pending.batch.pod)
                    except DomainError as exc:  # nothing of this batch was staged
                        pending.done.set_exception(exc)
                        continue
                    rows, duplicates = self._stage(connection, job, pod, pending.batch, seqs)
                    touched_pods[pod.id] = pod
                    staged.append((pending, rows, duplicates))
                items = self._insert_events(connection, [r for _, rows, _ in staged for r in rows])
                self._update(connection, jobs, touched_pods, seqs)
        except Exception as exc:
            logger.exception("writing %d report batches failed", len(group))
            self._pods.clear()
            self._seqs.clear()
            for pending, _, _ in staged:
                pending.done.set_exception(exc)
            return []
        stored = []
        for pending, rows, duplicates in staged:
            mine, items = items[:len(rows)], items[len(rows):]
            stored.append((pending, mine, duplicates))
        return stored

    @staticmethod
    def _jobs(connection: Connection, ids: set[str]) -> dict[str, JobView]:
        columns = (JOBS.c.id, JOBS.c.status, JOBS.c.spec, JOBS.c.step,
                   JOBS.c.epoch, JOBS.c.samples_seen, JOBS.c.total_samples, JOBS.c.metrics,
                   JOBS.c.completed_model_dir)
        found = {}
        for row in connection.execute(select(*columns).where(JOBS.c.id.in_(ids))):
            found[row.id] = JobView(
                row.id, JobStatus(row.status), int(row.spec["epochs"]),
                pod_count(row.spec), row.step, row.epoch, row.samples_seen,
                row.total_samples, row.metrics or {}, row.completed_model_dir)
        return found

    @staticmethod
    def _job(jobs: dict[str, JobView], job_id: str) -> JobView:
        job = jobs.get(job_id)
        if job is None:  # deleted since its token was checked
            raise NotFound(f"job {job_id} not found")
        return job

    def _pod(self, connection: Connection, job_id: str, name: str) -> PodView:
        if (job_id, name) not in self._pods:
            row = connection.execute(select(PODS.c.id, PODS.c.ordinal, PODS.c.step).where(
                PODS.c.job_id == job_id, PODS.c.name == name)).first()
            if row is None:
                raise InvalidSpec("pod", f"job {job_id} has no pod named {name!r}")
            self._pods[(job_id, name)] = PodView(row.id, row.ordinal, row.step or 0)
        return self._pods[(job_id, name)]

    def _last_seq(self, connection: Connection, key: tuple[str, str, str]) -> int:
        if key not in self._seqs:
            self._seqs[key] = connection.execute(select(SEQS.c.last_seq).where(
                SEQS.c.job_id == key[0], SEQS.c.pod == key[1],
                SEQS.c.incarnation == key[2])).scalar()
        return self._seqs[key] or 0

    def _stage(self, connection: Connection, job: JobView, pod: PodView, batch: ReportBatch,
               seqs: dict[tuple[str, str, str], int]) -> tuple[Items, int]:
        """Event rows of the batch's new records, and the job/pod/seq changes they imply."""
        key = (job.id, batch.pod, batch.incarnation)
        last = seqs.get(key) or self._last_seq(connection, key)
        unique = sorted({r.seq: r for r in batch.records if r.seq > last}.values(),
                        key=lambda r: r.seq)
        rows: Items = []
        for record in unique:
            # The validated fields as they are (JSON values: no dump needed).
            data = {**dict(record.data), "pod": batch.pod, "kind": record.kind}
            if isinstance(record.data, Left):
                data["reason"] = self._leave_reason(connection, job, pod, batch.incarnation)
            rows.append({"job_id": job.id, "type": STREAM_TYPES[record.kind], "time": record.time,
                         "data": data})
            if isinstance(record.data, Joined):
                rows += self._complete_migration(connection, job, pod, batch.incarnation,
                                                 record.data, record.time)
            job.apply(record.data)
            if isinstance(record.data, Metric):
                pod.step = max(pod.step, record.data.step)
        now = time.time()
        if batch.dropped:
            rows.append({"job_id": job.id, "type": "log", "time": now, "data": {
                "pod": batch.pod, "level": "warning",
                "message": f"{batch.dropped} metric records of {batch.pod} were dropped while "
                           f"the API was unreachable"}})
        if job.status == JobStatus.starting and unique:
            job.status, job.started_running = JobStatus.running, True
            rows.append({"job_id": job.id, "type": "job", "time": now,
                         "data": {"status": "running", "message": "training is running"}})
        if unique:
            seqs[key] = unique[-1].seq
        return rows, len(batch.records) - len(unique)

    @staticmethod
    def _leave_reason(connection: Connection, job: JobView, pod: PodView,
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

    @staticmethod
    def _complete_migration(connection: Connection, job: JobView, pod: PodView,
                            incarnation: str, joined: Joined, time_: float) -> Items:
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
        return [{"job_id": job.id, "type": "job", "time": time_, "data": {
            "type": "migrated", "ordinal": pod.ordinal, "pod": joined.pod,
            "old_incarnation": migration.old_incarnation, "new_incarnation": incarnation,
            "node_from": migration.node_from, "node_to": migration.node_to,
            "seconds": seconds, "steps_lost": lost, "step": joined.step,
            "message": f"{joined.pod} migrated: its replacement took part {seconds:.1f} s "
                       f"after the request, {lost} steps lost"}}]

    @staticmethod
    def _insert_events(connection: Connection, rows: Items) -> Items:
        """One multi-row INSERT ... RETURNING: the ids become the stream's event ids."""
        if not rows:
            return []
        statement = insert(EVENTS).returning(EVENTS.c.id, sort_by_parameter_order=True)
        ids = connection.execute(statement, rows).scalars().all()
        return [{"id": event_id, "type": row["type"], "time": row["time"], "data": row["data"]}
                for event_id, row in zip(ids, rows, strict=True)]

    def _update(self, connection: Connection, jobs: dict[str, JobView],
                pods: dict[int, PodView], seqs: dict[tuple[str, str, str], int]) -> None:
        for job in jobs.values():
            if job.changed:  # status is the reconciler's, except for the one move below
                connection.execute(update(JOBS).where(JOBS.c.id == job.id).values(
                    step=job.step, epoch=job.epoch, samples_seen=job.samples_seen,
                    total_samples=job.total_samples, metrics=job.metrics,
                    completed_model_dir=job.completed_model_dir))
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
