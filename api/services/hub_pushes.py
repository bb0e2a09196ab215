"""A succeeded job's model pushed to the Hugging Face hub, where its spec asks
(`export.hub_repo`).

The push is a staging of kind `push` (api.services.staging): once per (repository, job), run
by an initializer (trainer.hub_push), the one kind of process that holds the hub token and may
reach the hub. The reconciler starts it once the job's success is recorded, and moves it on
with the other stagings; when it ends, the job gets an event: `pushed` with the commit, or
`push_failed` with the reason. Either way the job stays succeeded with its model in the
registry. The token is never in the spec, the staging or an event.
"""

from __future__ import annotations

import json
import logging

from sqlmodel import Session

from api.asset_models import Staging, StagingStatus
from api.backends.base import Backend, BackendError
from api.errors import NotFound
from api.models import Job, Model
from api.services import staging
from api.services.events import EventLog, new_event
from api.services.registry import model_path
from api.settings import Settings

logger = logging.getLogger(__name__)


def start(session: Session, settings: Settings, backend: Backend, events: EventLog, job: Job,
          model: Model) -> None:
    """Start pushing the job's registered model where its spec asks (once per job; a push
    already made is reported again, not made again)."""
    export = job.spec.export
    if export is None:
        return
    try:
        options = {"model_dir": str(model_path(settings, model)), "private": export.private,
                   "message": f"{job.name or job.id}: fine-tuned by Live Migrator (job {job.id})"}
        row = staging.ensure(session, settings, backend, "push", export.hub_repo, job.id,
                             retry=True, spec=json.dumps(options))
    except (BackendError, NotFound) as exc:
        _event(session, events, job.id, "push_failed", export.hub_repo,
               f"push to the hub ({export.hub_repo}) not started: {exc}; the model stays in "
               "the registry")
        return
    if row.status != StagingStatus.running:
        report(session, events, row)


def report(session: Session, events: EventLog, row: Staging) -> None:
    """The job's event for its push, which has ended."""
    job_id, repo = row.revision, row.repo_id
    if row.status == StagingStatus.succeeded:
        _event(session, events, job_id, "pushed", repo,
               f"pushed to the hub: {repo} at {(row.commit or '?')[:12]}", commit=row.commit)
    else:
        _event(session, events, job_id, "push_failed", repo,
               f"push to the hub ({repo}) failed: {row.error}; the model stays in the registry")


def _event(session: Session, events: EventLog, job_id: str, kind: str, repo: str, message: str,
           **data: str | None) -> None:
    logger.info("job %s: %s", job_id, message)
    with events.append(session) as pushed:
        pushed.add(new_event(job_id, "job", type=kind, hub_repo=repo, message=message, **data))
