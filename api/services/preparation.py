"""A job's `preparing` status: the hub repositories it names are staged before its pods start.

A job is created `pending`. Where it names hub repositories not staged yet (a hub model, a hub
dataset alias), it waits `preparing` while their stagings run (api.services.staging), and the
reconciler asks again on every pass. Once every one is staged, its spec is checked against the
staged model (its config.json: stages, LoRA targets, max_length, as for a local model); then
its splits are tokenized once into the staged tokens (trainer.contract.staged), so that no pod,
however often it is recreated with an empty cache, tokenizes them again; and the job is
launched. A failed staging or a spec the model cannot train fails the job with the reason,
before any pod starts.
"""

from __future__ import annotations

from sqlmodel import Session

from api.asset_models import Staging, StagingStatus
from api.backends.base import Backend, BackendError
from api.errors import InvalidSpec
from api.models import Job, JobStatus, utc_now
from api.services import staging
from api.services.events import EventLog, new_event
from api.services.job_inputs import check_against_model, hub_model, hub_repositories
from api.settings import Settings
from api.sizes import human_size
from trainer.contract.datasets import is_dataset_id
from trainer.contract.staged import DEFAULT_REVISION, Kind, tokens_key


def _fail(session: Session, events: EventLog, job: Job, reason: str) -> None:
    job.status, job.reason, job.finished_at = JobStatus.failed, reason, utc_now()
    with events.append(session) as failed:
        failed.add(new_event(job.id, "job", status="failed", message=reason))


def _size(row: Staging) -> str:
    return human_size(row.bytes_done) if row.bytes_done else "size unknown"


def _ensure(session: Session, settings: Settings, backend: Backend, events: EventLog,
             job: Job, wanted: list[tuple[Kind, str, str]], retry: bool) -> list[Staging] | None:
    """These stagings, started where they are neither staged nor running (the reconciler moves
    running ones on); None where one failed (the job failed with it)."""
    rows = []
    for kind, repo_id, revision in wanted:
        spec = job.spec.model_dump_json() if kind == "tokens" else None
        try:
            rows.append(staging.ensure(session, settings, backend, kind, repo_id, revision,
                                       retry=retry, spec=spec))
        except BackendError as exc:
            _fail(session, events, job, f"cannot stage {kind} {repo_id}: {exc}")
            return None
    failed = next((row for row in rows if row.status == StagingStatus.failed), None)
    if failed is not None:
        _fail(session, events, job, f"staging {staging.describe(failed)} failed: {failed.error}")
        return None
    return rows


def _wait(session: Session, events: EventLog, job: Job, waiting: list[Staging]) -> bool:
    """False, the job `preparing` (said once, naming what it waits for)."""
    if job.status != JobStatus.preparing:
        job.status = JobStatus.preparing
        named = ", ".join(staging.describe(row) for row in waiting)
        with events.append(session) as preparing:
            preparing.add(new_event(
                job.id, "job", status="preparing", stagings=[row.id for row in waiting],
                message=f"preparing: staging {named} (GET /api/v1/stagings shows progress)"))
    return False


def prepared(session: Session, settings: Settings, backend: Backend, events: EventLog,
             job: Job, retry: bool = False) -> bool:
    """Start the job's stagings where they are neither staged nor running (the reconciler moves
    running ones on); True once the job may launch. First the hub repositories it names; once
    they are, and its spec fits the model, its tokenized splits (for a job on hub or uploaded
    assets). A job created now passes `retry`, so that a staging that failed before is tried
    again for it."""
    inputs = settings.resolved_inputs_dir
    repositories = hub_repositories(job.spec, inputs)
    rows = _ensure(session, settings, backend, events, job, repositories, retry)
    if rows is None:
        return False
    if waiting := [row for row in rows if row.status == StagingStatus.running]:
        return _wait(session, events, job, waiting)
    model = hub_model(job.spec, inputs)
    if model is not None and job.status == JobStatus.preparing:
        try:
            check_against_model(job.spec, model)
        except InvalidSpec as exc:
            problem = exc.detail[0] if isinstance(exc.detail, list) else {}
            field = ".".join(str(part) for part in problem.get("loc", ["", "spec"])[1:])
            _fail(session, events, job, f"{field}: {problem.get('msg', exc)}")
            return False
    if repositories or is_dataset_id(job.spec.dataset):
        tokens = _ensure(session, settings, backend, events, job,
                          [("tokens", tokens_key(job.spec, inputs), DEFAULT_REVISION)], retry)
        if tokens is None:
            return False
        if tokens[0].status == StagingStatus.running:
            return _wait(session, events, job, tokens)
        rows += tokens
    if job.status == JobStatus.preparing:
        staged = ", ".join(f"{staging.describe(row)} ({_size(row)})" for row in rows)
        with events.append(session) as done:
            done.add(new_event(job.id, "job", status="preparing", message=f"staged {staged}"))
    return True
