"""Stagings (trainer.contract.staged): hub repositories, a job's tokenized splits and dataset
files imported by URL, each staged once under the inputs dir for every job that reads it.

A job that names hub assets waits in `preparing` (api.services.preparation) while the backend
runs an initializer (trainer.initializer) for each staging not done yet; an import starts one
with no job waiting. The reconciler moves every running staging on each pass (`advance`): it
reads the initializer's progress file, and when the initializer has ended, records the outcome
(an imported file's dataset among it). A staging is one row per (kind, repository, revision),
shared by every job that names the same: a second job on the same assets finds them staged and
starts at once. A failed staging is tried again by the next job or import that needs it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import uuid
from pathlib import Path
from typing import Any, cast

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, func, select

from api.asset_models import Staging, StagingPublic, StagingsPublic, StagingStatus
from api.backends.base import Backend, BackendError, StagingRequest
from api.errors import Conflict, NotFound
from api.models import FINISHED_STATUSES, Job, utc_now
from api.services.datasets import register
from api.services.job_inputs import hub_repositories
from api.settings import Settings
from trainer.contract.datasets import META_FILE, dataset_dir
from trainer.contract.staged import (
    DEFAULT_REVISION,
    HUB_DIR,
    PARTIAL_DIR,
    STAGED_FILE,
    TOKENS_DIR,
    Kind,
    file_key,
    progress_file,
    read_staged,
    staged,
    staged_dir,
    staging_id,
    tokens_key,
)

logger = logging.getLogger(__name__)

ATTEMPTS = 3
"""Initializer starts for one staging before it fails, where one ends without an outcome (the
control plane restarted, the process was killed)."""


def _log(settings: Settings, staging: str) -> Path:
    """A local initializer's output, under the data dir."""
    return settings.data_dir.resolve() / "stagings" / f"{staging}.log"


def _progress(settings: Settings, staging: str) -> dict[str, Any]:
    try:
        progress: dict[str, Any] = json.loads(
            progress_file(settings.resolved_inputs_dir, staging).read_text())
    except (OSError, ValueError):  # not written yet
        return {}
    return progress


def _start(settings: Settings, backend: Backend, row: Staging) -> None:
    progress_file(settings.resolved_inputs_dir, row.id).unlink(missing_ok=True)
    row.status, row.error, row.finished_at = StagingStatus.running, None, None
    row.attempts, row.started_at, row.bytes_done = row.attempts + 1, utc_now(), 0
    backend.stage(StagingRequest(row.id, cast(Kind, row.kind), row.repo_id, row.revision,
                                 settings.resolved_inputs_dir, _log(settings, row.id),
                                 json.dumps(row.options) if row.options is not None else None))
    logger.info("staging %s: %s %s@%s, attempt %d", row.id, row.kind, row.repo_id, row.revision,
                row.attempts)


def _finish(row: Staging, status: StagingStatus, error: str | None = None) -> None:
    row.status, row.error, row.finished_at = status, error, utc_now()
    logger.info("staging %s: %s%s", row.id, status.value, f" ({error})" if error else "")


def ensure(session: Session, settings: Settings, backend: Backend, kind: Kind, repo_id: str,
           revision: str = DEFAULT_REVISION, retry: bool = False,
           spec: str | None = None) -> Staging:
    """The repository's staging, started where it is neither staged nor running (again where
    it failed and `retry`, or where what it staged is gone), recorded staged where it is; a
    running one is otherwise left to `advance`. `spec`: what its initializer needs besides the
    repository (a job's spec for `tokens`, an import for `file`), as JSON. Commits."""
    found = session.get(Staging, staging_id(kind, repo_id, revision))
    row = found or Staging(id=staging_id(kind, repo_id, revision), kind=kind, repo_id=repo_id,
                           revision=revision)
    if spec is not None:
        row.options = json.loads(spec)
    if found is not None and found.status == StagingStatus.failed and not retry:
        return found
    directory = staged(settings.resolved_inputs_dir, kind, repo_id, revision)
    if directory is None and found is not None and found.status == StagingStatus.running:
        return found
    if directory is None:
        _start(settings, backend, row)
    elif row.status != StagingStatus.succeeded or found is None:
        _succeed(session, settings, row, directory)
    return _commit(session, row)


def advance(session: Session, settings: Settings, backend: Backend, row: Staging) -> Staging:
    """Move a running staging on: record it staged, or read its progress while its
    initializer runs; where none runs, record the failure it wrote, or start it again (at
    most ATTEMPTS in all). Commits."""
    def done() -> Path | None:
        return staged(settings.resolved_inputs_dir, cast(Kind, row.kind), row.repo_id,
                      row.revision)

    directory = done()
    running = directory is None and backend.staging(row.id)
    if directory is None and not running:  # it may have ended since the first look
        directory = done()
    progress = _progress(settings, row.id) if directory is None else {}
    if directory is not None:
        _succeed(session, settings, row, directory)
    elif running:
        row.bytes_done = int(progress.get("bytes_done") or row.bytes_done)
        row.bytes_total = progress.get("bytes_total") or row.bytes_total
        row.files, row.commit = progress.get("files") or row.files, progress.get("commit")
    elif progress.get("state") == "failed":
        _finish(row, StagingStatus.failed, progress.get("error") or "the initializer failed")
    elif row.attempts >= ATTEMPTS:
        _finish(row, StagingStatus.failed, f"the initializer ended {row.attempts} times "
                                           "without an outcome")
    else:
        _start(settings, backend, row)
    return _commit(session, row)


def _succeed(session: Session, settings: Settings, row: Staging, directory: Path) -> None:
    meta = read_staged(directory)
    if row.kind == "file":  # first: recording the dataset commits (or rolls back) the session
        row.dataset_id = _register(session, settings, meta["dataset_id"])
    row.commit, row.files = meta.get("commit"), len(meta.get("files", ()))
    row.bytes_done = row.bytes_total = int(meta.get("bytes", 0))
    _finish(row, StagingStatus.succeeded)


def _commit(session: Session, row: Staging) -> Staging:
    session.add(row)
    try:
        session.commit()
    except IntegrityError:  # another request created it first: theirs stands
        session.rollback()
        row = session.get(Staging, row.id) or row
    return row


def _register(session: Session, settings: Settings, dataset_id: str) -> str:
    """Record the dataset an imported file became, as an upload's is."""
    meta = dataset_dir(settings.resolved_inputs_dir, dataset_id) / META_FILE
    register(session, json.loads(meta.read_text()))
    return dataset_id


def public(row: Staging) -> StagingPublic:
    shown = StagingPublic.model_validate(row)
    shown.source = (row.options or {}).get("source") if row.kind == "file" else None
    if shown.status == StagingStatus.running and shown.bytes_total and shown.bytes_done and (
            shown.started_at is not None):  # UTC, once validated (SQLite's are naive)
        elapsed = (utc_now() - shown.started_at).total_seconds()
        rate = shown.bytes_done / max(elapsed, 1e-3)
        shown.eta_seconds = round(max(shown.bytes_total - shown.bytes_done, 0) / rate, 1)
    return shown


def get_staging(session: Session, staging: str) -> Staging:
    row = session.get(Staging, staging)
    if row is None:
        raise NotFound(f"no staging '{staging}'")
    return row


def list_stagings(session: Session, offset: int, limit: int,
                  kind: Kind | None = None) -> StagingsPublic:
    query, counted = select(Staging), select(func.count()).select_from(Staging)
    if kind is not None:
        query, counted = query.where(Staging.kind == kind), counted.where(Staging.kind == kind)
    rows = session.exec(query.order_by(col(Staging.created_at).desc(),
                                       col(Staging.id)).offset(offset).limit(limit))
    count = session.exec(counted).one()
    return StagingsPublic(data=[public(row) for row in rows], count=count)


def describe(row: Staging) -> str:
    if row.kind == "tokens":
        return f"tokenized splits {row.repo_id}"
    if row.kind == "push":
        return f"push of {row.revision}'s model to {row.repo_id}"
    return f"{row.kind} {row.repo_id}@{row.revision}"


def import_repository(session: Session, settings: Settings, backend: Backend, kind: Kind,
                      repo_id: str, revision: str) -> tuple[Staging, bool]:
    """Stage a hub repository ahead of the jobs that will name it: (the staging, whether it was
    staged already). A failed one is tried again."""
    already = staged(settings.resolved_inputs_dir, kind, repo_id, revision) is not None
    return ensure(session, settings, backend, kind, repo_id, revision, retry=True), already


def import_file(session: Session, settings: Settings, backend: Backend, source: str,
                name: str | None, text_column: str | None,
                label_column: str | None) -> tuple[Staging, bool]:
    """Import a dataset file by its URL (trainer.dataset_import): (the staging, whether it was
    imported already). A failed import is tried again."""
    key = file_key(source, text_column, label_column)
    already = staged(settings.resolved_inputs_dir, "file", key) is not None
    options = {"source": source, "name": name, "text_column": text_column,
               "label_column": label_column}
    return ensure(session, settings, backend, "file", key, retry=True,
                  spec=json.dumps(options)), already


def advance_all(session: Session, settings: Settings, backend: Backend) -> list[Staging]:
    """Move every running staging on, once a pass: those jobs wait for, imports and pushes;
    those that ended."""
    running = session.exec(select(Staging).where(Staging.status == StagingStatus.running)).all()
    ended = []
    for row in running:
        try:  # one backend that cannot answer leaves the others to move on, and be reported
            if advance(session, settings, backend, row).status != StagingStatus.running:
                ended.append(row)
        except BackendError as exc:
            logger.warning("staging %s: cannot move it on yet: %s", row.id, exc)
    return ended


def users(session: Session, settings: Settings, row: Staging) -> list[str]:
    """The jobs not finished that read the staging."""
    inputs = settings.resolved_inputs_dir
    found = []
    for job in session.exec(select(Job).where(col(Job.status).not_in(FINISHED_STATUSES))):
        if row.kind == "tokens":
            reads = tokens_key(job.spec, inputs) == row.repo_id
        else:
            reads = (row.kind, row.repo_id, row.revision) in hub_repositories(job.spec, inputs)
        if reads:
            found.append(job.id)
    return found


def delete_staging(session: Session, settings: Settings, staging: str) -> None:
    """Remove what was staged and its record; 409 while it runs or a job not finished reads
    it (its files are renamed away first: a job started meanwhile stages them again)."""
    row = get_staging(session, staging)
    if row.status == StagingStatus.running:
        raise Conflict(f"staging '{row.id}' is running: wait for it to end first")
    using = users(session, settings, row)
    if using:
        raise Conflict(f"{describe(row)} is in use by {', '.join(using)}: cancel or wait for "
                       "them first")
    session.delete(row)
    session.commit()
    inputs = settings.resolved_inputs_dir
    directory = staged_dir(inputs, cast(Kind, row.kind), row.repo_id, row.revision)
    doomed = inputs / HUB_DIR / PARTIAL_DIR / f"{uuid.uuid4().hex}.deleted"
    doomed.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        directory.replace(doomed)
        if row.kind == "tokens":  # its files too, but those another staging lists as well
            tokens = inputs / HUB_DIR / TOKENS_DIR
            kept = {name for other in tokens.glob(f"*/*/{STAGED_FILE}")
                    for name in json.loads(other.read_text()).get("files", {}).values()}
            for name in set(read_staged(doomed).get("files", {}).values()) - kept:
                (tokens / name).unlink(missing_ok=True)
    shutil.rmtree(doomed, ignore_errors=True)
    progress_file(inputs, row.id).unlink(missing_ok=True)
