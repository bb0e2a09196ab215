"""Reconcile and observe every active job's workload; record pod events, move job status,
finalize completion.

Runs one pass per interval in a worker thread. A control-plane restart loses nothing: each pass
rebuilds its view from the backend (which outlives the API) and the database. Backend calls
(observing pods, reading logs, deleting a workload: up to seconds each on Kubernetes) happen
before anything is written; the writes then go through the event log in milliseconds, guarded
against a cancel that finished the job meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select
from upath import UPath

from api.backends.base import Backend, BackendError, WorkloadStatus
from api.db import session_scope
from api.errors import BackendUnavailable
from api.models import (
    ACTIVE_STATUSES,
    FINISHED_STATUSES,
    Event,
    Job,
    JobStatus,
    Migration,
    Pod,
    utc_now,
)
from api.services import checkpoints, hub_pushes, jobs, pod_migrations, preparation, staging
from api.services.artifacts import checkpoints_dir, model_dir
from api.services.events import EventLog, completions, new_event
from api.services.job_credentials import Renewals
from api.services.jobs import REMOVED, still_active
from api.services.registry import clear_export_staging, register_model
from api.settings import Settings
from trainer.contract import artifact_store
from trainer.contract.checkpoints import EXPORTED

logger = logging.getLogger(__name__)

LOG_LINES_ON_FAILURE = 20
ORPHANS_EVERY = 10.0
"""Seconds between two looks for workloads whose job has finished."""
COMPLETION_GRACE = 15.0
"""Seconds the other pods get to report completion after the primary did."""
PRUNE_EVERY = 60.0
"""Seconds between two looks for finished jobs whose checkpoints have outlived their TTL."""
SWEEPS_PER_PASS = 20
"""Finished jobs whose export staging one pass looks for at most (a restarted control plane
looks at each once: spread over passes, each a listing in the artifacts store)."""


class Reconciler:
    def __init__(self, engine: Engine, settings: Settings, backend: Backend,
                 events: EventLog) -> None:
        self.engine, self.settings, self.backend, self.events = engine, settings, backend, events
        self._task: asyncio.Task[None] | None = None
        self._orphans_checked = -ORPHANS_EVERY
        self._pruned_at = -PRUNE_EVERY
        self._pruned: set[str] = set()
        """Jobs whose checkpoints were pruned by this process (each is pruned once)."""
        self.credentials = Renewals(settings) if settings.artifacts_per_job else None
        self._swept: set[str] = set()
        """Finished jobs whose export staging this process cleared (each is cleared once)."""

    def start(self) -> None:
        self.fail_unlaunched()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="reconciler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.reconcile_once)
            except Exception:
                logger.exception("reconcile pass failed; retrying")
            await asyncio.sleep(self.settings.reconcile_interval)

    def fail_unlaunched(self) -> None:
        """A job still pending at start-up was never launched: the API stopped in between."""
        with session_scope(self.engine) as session:
            for job in session.exec(select(Job).where(Job.status == JobStatus.pending)):
                with self.events.append(session) as failed:
                    failed.add(self._finish(job, JobStatus.failed, "the control plane stopped "
                                            "before the job was launched"))

    def reconcile_once(self) -> None:
        with session_scope(self.engine) as session:
            self.advance_preparing(session)
            active = col(Job.status).in_(ACTIVE_STATUSES)
            jobs = list(session.exec(select(Job).where(active)))
            # Three queries a pass, not two a job: the pass's cost grows with the jobs alone.
            pods: dict[str, list[Pod]] = defaultdict(list)
            for pod in session.exec(select(Pod).join(Job).where(active).order_by(
                    col(Pod.job_id), col(Pod.ordinal))):
                pods[pod.job_id].append(pod)
            pending = pod_migrations.pending_by_job(session, active)
            for job in jobs:
                try:
                    self.backend.reconcile(job.id)
                    status = self.backend.status(job.id)
                except BackendError as exc:  # half done, say a supervisor not yet replaced
                    logger.warning("job %s: cannot reconcile or observe its workload: %s",
                                   job.id, exc)
                    continue
                self.reconcile_job(session, job, status, pods[job.id], pending[job.id])
            if self.credentials is not None:
                self.credentials.keep(session)
            if time.monotonic() - self._orphans_checked >= ORPHANS_EVERY:
                self._orphans_checked = time.monotonic()
                self.delete_orphans(session)
            if (self.settings.checkpoint_ttl is not None
                    and time.monotonic() - self._pruned_at >= PRUNE_EVERY):
                self._pruned_at = time.monotonic()
                self.prune_checkpoints(session, self.settings.checkpoint_ttl)

    def advance_preparing(self, session: Session) -> None:
        """Move every running staging on (those jobs wait for, and imports), once; then launch
        the jobs whose stagings are all done, or start the next ones they need."""
        for row in staging.advance_all(session, self.settings, self.backend):
            if row.kind == "push":
                hub_pushes.report(session, self.events, row)
        for job in session.exec(select(Job).where(Job.status == JobStatus.preparing)).all():
            try:
                if preparation.prepared(session, self.settings, self.backend, self.events, job):
                    jobs.launch_job(session, self.settings, self.backend, self.events, job)
            except BackendUnavailable as exc:  # the job failed, with the reason
                logger.warning("job %s: %s", job.id, exc)

    def prune_checkpoints(self, session: Session, ttl: float) -> None:
        """Keep only the final and the best checkpoint of each job finished over `ttl` s ago."""
        cutoff = utc_now() - timedelta(seconds=ttl)
        jobs = session.exec(select(Job).where(col(Job.status).in_(FINISHED_STATUSES),
                                              col(Job.finished_at) < cutoff)).all()
        events = []
        for job in jobs:
            if job.id in self._pruned:
                continue
            self._pruned.add(job.id)
            try:
                removed = checkpoints.prune(checkpoints_dir(self.settings, job.id))
            except artifact_store.UnlistableKey as exc:
                logger.warning("job %s: checkpoints not pruned: %s", job.id, exc)
                continue
            if removed:
                events.append(new_event(
                    job.id, "job", type="checkpoints_pruned", removed=removed,
                    message=f"{len(removed)} checkpoints pruned {ttl:.0f} s after the job "
                            "ended; the final and the best are kept"))
        if events:
            with self.events.append(session) as pruned:
                pruned.add(*events)

    def delete_orphans(self, session: Session) -> None:
        """Delete the workloads of finished jobs: a cancel whose deletion failed, say."""
        try:
            running = self.backend.active_jobs()
        except BackendError as exc:
            logger.warning("cannot list workloads: %s", exc)
            return
        finished = session.exec(select(Job.id).where(
            col(Job.id).in_(running), col(Job.status).in_(FINISHED_STATUSES))).all()
        for job_id in finished:
            logger.info("job %s has finished but its workload runs: deleting it", job_id)
            self._delete_workload(job_id)
        self.sweep_export_staging(session, set(running))

    def sweep_export_staging(self, session: Session, running: set[str]) -> None:
        """Clear the export staging of finished jobs whose workload is gone: no pod is left
        to finish (or to start) an export then."""
        ended = session.exec(select(Job.id).where(col(Job.status).in_(FINISHED_STATUSES))).all()
        for job_id in [j for j in ended if j not in self._swept and j not in running][
                :SWEEPS_PER_PASS]:
            try:
                if not self.backend.gone(job_id):
                    continue
                removed = clear_export_staging(self.settings, job_id)
            except (BackendError, OSError) as exc:
                logger.warning("job %s: cannot clear its export staging yet: %s", job_id, exc)
                continue
            self._swept.add(job_id)
            if removed:
                logger.info("job %s: removed %s, left by killed exports", job_id,
                            ", ".join(removed))

    def reconcile_job(self, session: Session, job: Job, status: WorkloadStatus,
                      pods: list[Pod], pending: list[Migration]) -> None:
        """Record what changed in one job (its pod rows and pending migrations given, read for
        the whole pass at once)."""
        events = self._sync_pods(session, job, status, pods) + pod_migrations.fail_overdue(
            session, job.id, status, pending)
        model_dir, model = self._finished_model_dir(session, job, status), None
        if model_dir is not None:
            self._delete_workload(job.id)
            for pod in pods:
                # The pods finished their work; the workload deletion only ended the processes.
                if pod.phase in ("Pending", "Running"):
                    pod.phase = "Succeeded"
                    session.add(pod)
            model = register_model(session, self.settings, job, model_dir)
            events.append(self._finish(job, JobStatus.succeeded, None,
                                       f"succeeded: model {model.id} registered, workload "
                                       "deleted"))
        elif status.finished and status.reason:
            self._delete_workload(job.id)
            events.append(self._finish(job, JobStatus.failed, status.reason))
        elif status.finished:
            events.append(self._finish(job, JobStatus.failed,
                                       "every pod exited but no model was exported"))
        elif not status.present:
            events.append(self._finish(job, JobStatus.failed, "the workload vanished (its "
                                       "supervisor or Kubernetes objects are gone)"))
        elif job.status in (JobStatus.running, JobStatus.degraded):
            events += self._update_degraded(job, status)
        if not events:  # every change above comes with its event: nothing to write
            # (No rollback: it would expire every object the pass loaded, a cost per job that
            # grows with the jobs.)
            return
        session.add(job)
        # A cancel may have finished the job since it was read: then it stays as the cancel left it.
        with self.events.append(session, guard=lambda: still_active(session, job.id)) as synced:
            synced.add(*events)
        if not synced.committed:
            logger.info("job %s finished meanwhile; this pass's view of it is dropped", job.id)
        elif model is not None:  # succeeded: its model goes to the hub where its spec asks
            hub_pushes.start(session, self.settings, self.backend, self.events, job, model)

    @staticmethod
    def _update_degraded(job: Job, status: WorkloadStatus) -> list[Event]:
        """Degraded while fewer pods than asked run, or fewer replicas take part in the latest
        step than asked (a pipeline replica is one participant of `stages` pods)."""
        replicas, pods = job.spec.replicas, job.spec.pods
        running = sum(p.phase == "Running" for p in status.pods)
        participants = int(job.metrics.get("participants", replicas))
        wanted = JobStatus.degraded if running < pods or participants < replicas else \
            JobStatus.running
        if wanted == job.status:
            return []
        job.status = wanted
        return [new_event(job.id, "job", status=wanted.value, running=running,
                          participants=participants,
                          message=f"{running} of {pods} pods running, {participants} "
                                  "training")]

    def _sync_pods(self, session: Session, job: Job, status: WorkloadStatus,
                   rows: list[Pod]) -> list[Event]:
        """Copy observed pod phases and restarts into the pods' rows, as events."""
        events: list[Event] = []
        pods = job.spec.pods
        observed = {p.ordinal: p for p in status.pods}
        for pod in rows:  # a scale adds the rows of new ordinals
            seen = observed.get(pod.ordinal)
            if seen is None and pod.ordinal >= pods and pod.phase != REMOVED:
                events.append(new_event(
                    job.id, "pod", ordinal=pod.ordinal, name=pod.name, phase=REMOVED,
                    previous=pod.phase, message=f"pod {pod.name} removed: the job runs "
                                                f"{pods} pods"))
                pod.phase = REMOVED
                session.add(pod)
            if seen is None or (seen.phase, seen.restarts) == (pod.phase, pod.restarts):
                continue
            events.append(new_event(
                job.id, "pod", ordinal=pod.ordinal, name=pod.name, phase=seen.phase,
                previous=pod.phase, restarts=seen.restarts, exit_code=seen.exit_code,
                reason=seen.reason,
                message=f"pod {pod.name}: {pod.phase} -> {seen.phase}"
                        + (f" (restart {seen.restarts})" if seen.restarts > pod.restarts else "")
                        + (f": {seen.reason}" if seen.reason else "")))
            if seen.phase == "Failed" or seen.restarts > pod.restarts:
                events += self._log_tail(job, pod)
            pod.phase, pod.restarts, pod.exit_code = seen.phase, seen.restarts, seen.exit_code
            session.add(pod)
        return events

    def _log_tail(self, job: Job, pod: Pod) -> list[Event]:
        try:
            lines = self.backend.tail_logs(job.id, pod.ordinal, LOG_LINES_ON_FAILURE)
        except BackendError:
            return []
        return [new_event(job.id, "log", pod=pod.name, level="error", lines=lines,
                          message=f"last {len(lines)} log lines of {pod.name}")] if lines else []

    def _finished_model_dir(self, session: Session, job: Job,
                            status: WorkloadStatus) -> Path | UPath | None:
        """The exported model, once the job is over: every pod succeeded, or the primary
        reported completion and every pod has reported too (or had COMPLETION_GRACE seconds).
        The store is asked last: it may be a remote one."""
        if not (status.finished and not status.reason):
            if job.completed_model_dir is None:
                return None
            completed = completions(session, job.id)
            everyone = {pod for pod, _ in completed} >= {
                f"{job.id}-{o}" for o in range(job.spec.pods)}
            first = min((time_ for _, time_ in completed), default=time.time())
            if not (everyone or time.time() - first > COMPLETION_GRACE):
                return None
        expected = model_dir(self.settings, job.id)
        return expected if artifact_store.has_file(expected, EXPORTED) else None

    def _delete_workload(self, job_id: str) -> None:
        try:
            self.backend.delete(job_id)
        except BackendError as exc:
            logger.warning("job %s: could not delete its workload: %s", job_id, exc)

    @staticmethod
    def _finish(job: Job, status: JobStatus, reason: str | None,
                message: str | None = None) -> Event:
        job.status, job.reason, job.finished_at = status, reason, utc_now()
        return new_event(job.id, "job", status=status.value, message=message or reason or "")
