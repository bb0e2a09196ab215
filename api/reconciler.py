"""Observe every active job's pods; record pod events, move job status, finalize completion.

Runs one pass per interval in a worker thread. A control-plane restart loses nothing: each pass
rebuilds its view from the backend (which outlives the API) and the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from api.backends.base import Backend, BackendError, WorkloadStatus
from api.db import session_scope
from api.models import ACTIVE_STATUSES, Event, Job, JobStatus, utc_now
from api.services.jobs import add_event, event_item, pods_of
from api.services.models import register_model
from api.settings import Settings

logger = logging.getLogger(__name__)

LOG_LINES_ON_FAILURE = 20
COMPLETION_GRACE = 15.0
"""Seconds the other pods get to report completion after the primary did."""


class Reconciler:
    def __init__(self, engine: Engine, settings: Settings, backend: Backend,
                 publish: Callable[[str, list[dict]], None],
                 ordering: AbstractContextManager[Any] | None = None) -> None:
        self.engine, self.settings, self.backend, self.publish = engine, settings, backend, publish
        self.ordering = ordering or contextlib.nullcontext()
        """Held from the first write to the publish (Broker.ordering)."""
        self._task: asyncio.Task[None] | None = None

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
                self._finish(session, job, JobStatus.failed,
                             "the control plane stopped before the job was launched")
            session.commit()

    def reconcile_once(self) -> None:
        with session_scope(self.engine) as session:
            jobs = list(session.exec(select(Job).where(col(Job.status).in_(ACTIVE_STATUSES))))
            for job in jobs:
                try:
                    status = self.backend.status(job.id)
                except BackendError as exc:
                    logger.warning("job %s: cannot observe pods: %s", job.id, exc)
                    continue
                with self.ordering:
                    # A cancel may have finished the job since it was listed: it stays so.
                    session.refresh(job)
                    if job.status in ACTIVE_STATUSES:
                        self.reconcile_job(session, job, status)

    def reconcile_job(self, session: Session, job: Job, status: WorkloadStatus) -> None:
        first_new = self._last_event_id(session)
        self._sync_pods(session, job, status)
        model_dir = self._finished_model_dir(session, job, status)
        if model_dir is not None:
            self._delete_workload(job)
            for pod in pods_of(session, job.id):
                # The pods finished their work; the workload deletion only ended the processes.
                if pod.phase in ("Pending", "Running"):
                    pod.phase = "Succeeded"
                    session.add(pod)
            model = register_model(session, self.settings, job, model_dir)
            self._finish(session, job, JobStatus.succeeded, None,
                         f"succeeded: model {model.id} registered, workload deleted")
        elif status.finished and status.reason:
            self._delete_workload(job)
            self._finish(session, job, JobStatus.failed, status.reason)
        elif status.finished:
            self._finish(session, job, JobStatus.failed,
                         "every pod exited but no model was exported")
        elif not status.present:
            self._finish(session, job, JobStatus.failed,
                         "the workload vanished (its supervisor or StatefulSet is gone)")
        elif job.status in (JobStatus.running, JobStatus.degraded):
            self._update_degraded(session, job, status)
        session.add(job)
        session.commit()
        new = session.exec(select(Event).where(Event.job_id == job.id,
                                               col(Event.id) > first_new).order_by(col(Event.id)))
        self.publish(job.id, [event_item(e) for e in new])

    @staticmethod
    def _update_degraded(session: Session, job: Job, status: WorkloadStatus) -> None:
        """Degraded while fewer pods than asked run, or take part in the latest step."""
        replicas = int(job.spec["replicas"])
        running = sum(p.phase == "Running" for p in status.pods)
        participants = int(job.metrics.get("participants", replicas))
        wanted = JobStatus.degraded if min(running, participants) < replicas else \
            JobStatus.running
        if wanted != job.status:
            job.status = wanted
            add_event(session, job.id, "job", status=wanted.value, running=running,
                      participants=participants,
                      message=f"{running} of {replicas} pods running, {participants} "
                              "training")

    @staticmethod
    def _last_event_id(session: Session) -> int:
        last = session.exec(select(Event.id).order_by(col(Event.id).desc()).limit(1)).first()
        return last or 0

    def _sync_pods(self, session: Session, job: Job, status: WorkloadStatus) -> None:
        observed = {p.ordinal: p for p in status.pods}
        for pod in pods_of(session, job.id):
            seen = observed.get(pod.ordinal)
            if seen is None:
                continue
            if (seen.phase, seen.restarts) == (pod.phase, pod.restarts):
                continue
            add_event(session, job.id, "pod", ordinal=pod.ordinal, name=pod.name,
                      phase=seen.phase, previous=pod.phase, restarts=seen.restarts,
                      exit_code=seen.exit_code, reason=seen.reason,
                      message=f"pod {pod.name}: {pod.phase} -> {seen.phase}"
                              + (f" (restart {seen.restarts})" if seen.restarts > pod.restarts
                                 else "") + (f": {seen.reason}" if seen.reason else ""))
            if seen.phase == "Failed" or seen.restarts > pod.restarts:
                self._log_tail(session, job, pod.ordinal, pod.name)
            pod.phase, pod.restarts, pod.exit_code = seen.phase, seen.restarts, seen.exit_code
            session.add(pod)

    def _log_tail(self, session: Session, job: Job, ordinal: int, name: str) -> None:
        try:
            lines = self.backend.tail_logs(job.id, ordinal, LOG_LINES_ON_FAILURE)
        except BackendError:
            return
        if lines:
            add_event(session, job.id, "log", pod=name, level="error", lines=lines,
                      message=f"last {len(lines)} log lines of {name}")

    def _finished_model_dir(self, session: Session, job: Job,
                            status: WorkloadStatus) -> Path | None:
        """The exported model, once the job is over: every pod succeeded, or the primary
        reported completion and every pod has reported too (or had COMPLETION_GRACE seconds)."""
        expected = self.settings.jobs_dir / job.id / "model"
        if not (expected / "config.json").is_file():
            return None
        if status.finished and not status.reason:
            return expected
        if job.completed_model_dir is None:
            return None
        completions = [e for e in session.exec(select(Event).where(
            Event.job_id == job.id, Event.type == "job")) if e.data.get("type") == "completed"]
        everyone = {e.data.get("pod") for e in completions} >= {
            f"{job.id}-{o}" for o in range(int(job.spec["replicas"]))}
        first = min((e.time for e in completions), default=time.time())
        return expected if everyone or time.time() - first > COMPLETION_GRACE else None

    def _delete_workload(self, job: Job) -> None:
        try:
            self.backend.delete(job.id)
        except BackendError as exc:
            logger.warning("job %s: could not delete its workload: %s", job.id, exc)

    @staticmethod
    def _finish(session: Session, job: Job, status: JobStatus, reason: str | None,
                message: str | None = None) -> None:
        job.status, job.reason, job.finished_at = status, reason, utc_now()
        add_event(session, job.id, "job", status=status.value, message=message or reason or "")
        session.add(job)
