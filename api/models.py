"""Tables and API schemas, one family per resource (Base / Create / table / Public / list)."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from sqlalchemy import JSON, Column, DateTime, Index, UniqueConstraint
from sqlmodel import Field as SQLField
from sqlmodel import SQLModel

from api.db import ModelJSON
from trainer.contract.spec import MAX_INT, MAX_REPLICAS, JobSpec


def utc_now() -> datetime:
    return datetime.now(UTC)


def _as_utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; every stored time is UTC.
    return value if value.tzinfo else value.replace(tzinfo=UTC)


UTCDateTime = Annotated[datetime, AfterValidator(_as_utc)]


def _time_column() -> Any:
    return Column(DateTime(timezone=True), nullable=True)


class JobStatus(StrEnum):
    pending = "pending"
    preparing = "preparing"
    """Waiting for the hub repositories it names to be staged (api.services.staging)."""
    starting = "starting"
    running = "running"
    degraded = "degraded"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)


ACTIVE_STATUSES = (JobStatus.starting, JobStatus.running, JobStatus.degraded)
FINISHED_STATUSES = tuple(status for status in JobStatus if status.finished)


# --- jobs --------------------------------------------------------------------------------


class JobCreate(JobSpec):
    """Request body of POST /api/v1/jobs: the job spec of trainer.contract.spec."""


class Job(SQLModel, table=True):
    """A fine-tuning job as stored."""

    id: str = SQLField(primary_key=True)
    name: str | None = None
    status: JobStatus = SQLField(default=JobStatus.pending, index=True)
    reason: str | None = None
    spec: JobSpec = SQLField(sa_column=Column(ModelJSON(JobSpec), nullable=False))
    report_token_hash: str
    created_at: datetime = SQLField(default_factory=utc_now,
                                    sa_column=Column(DateTime(timezone=True), nullable=False))
    started_at: datetime | None = SQLField(default=None, sa_column=_time_column())
    finished_at: datetime | None = SQLField(default=None, sa_column=_time_column())
    epoch: int = 0
    step: int = 0
    samples_seen: int = 0
    total_samples: int | None = None
    metrics: dict[str, Any] = SQLField(default_factory=dict, sa_column=Column(JSON))
    completed_model_dir: str | None = None
    """Set when the primary reports completion; the reconciler then finalizes the job."""
    model_id: str | None = None
    event_bytes: int = SQLField(default=0, sa_column_kwargs={"server_default": "0"})
    """Bytes of events its reports stored, against settings.max_job_event_bytes."""
    finish_after_epoch: int | None = None
    """POST /jobs/{id}/finish: the epoch after which its pods finish early (trainer.finish)."""


class Progress(BaseModel):
    epoch: int
    epochs: int
    step: int
    samples_seen: int
    total_samples: int | None
    eta_seconds: float | None


class PodPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    ordinal: int
    name: str
    phase: str
    restarts: int
    last_heartbeat: UTCDateTime | None
    step: int | None
    exit_code: int | None
    replica: int = 0
    """The data-parallel replica the pod belongs to (its ordinal, unless the job pipelines)."""
    stage: int = 0
    """A pipeline job's stage this pod runs (0 in a data-parallel job)."""


class JobPublic(BaseModel):
    id: str
    name: str | None
    status: JobStatus
    reason: str | None
    spec: dict[str, Any]
    pods: list[PodPublic]
    progress: Progress
    metrics: dict[str, Any]
    created_at: UTCDateTime
    started_at: UTCDateTime | None
    finished_at: UTCDateTime | None
    model_id: str | None
    links: dict[str, str]


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int
    offset: int
    limit: int


class KillRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grace_seconds: float = Field(default=0, ge=0, le=300)


class JobUpdate(BaseModel):
    """Body of PATCH /api/v1/jobs/{id}: what may change while a job runs."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    replicas: int = Field(ge=1, le=MAX_REPLICAS)
    """Pods to run, 1 to the job's `max_replicas`: new ordinals heal from a peer and take part;
    the highest ones leave gracefully."""


class FinishRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    after_epoch: int | None = Field(default=None, ge=1, le=MAX_INT)
    """Finish after this epoch (from 1, at most the spec's `epochs`), or after the epoch under
    way when the pods agree, if that is later; none: after the epoch under way now."""


class MigrateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    node: str | None = Field(default=None, min_length=1, max_length=253,
                             pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    """The node to move the pod to (Kubernetes); none: any node but its current one."""


class DownloadLink(BaseModel):
    url: str
    """A path with `expires` and `signature`: GET it without a token until it expires."""
    expires_at: int
    """Unix time."""


class StreamLink(BaseModel):
    url: str
    """The job's event stream with `expires` and `signature`: open it without a token before it
    expires (an open stream goes on after); reconnect with a new link."""
    expires_at: int
    """Unix time."""


class LoginLink(BaseModel):
    url: str
    """The dashboard with a login code in the URL's fragment (which no browser sends to a
    server): it logs in once, before `expires_at`."""
    expires_at: int
    """Unix time."""


class LoginRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    code: str = Field(min_length=1, max_length=64)
    """A code from a login URL."""


class LoginToken(BaseModel):
    token: str
    """The admin token, for the dashboard to send as a bearer header."""


class Accepted(BaseModel):
    id: str
    status: str
    detail: str


# --- pods --------------------------------------------------------------------------------


class Pod(SQLModel, table=True):
    """A pod of a job, as last observed, with its reported progress."""

    __table_args__ = (UniqueConstraint("job_id", "ordinal"),)

    id: int | None = SQLField(default=None, primary_key=True)
    job_id: str = SQLField(foreign_key="job.id", index=True)
    ordinal: int
    name: str
    phase: str = "Pending"
    restarts: int = 0
    exit_code: int | None = None
    step: int | None = None
    last_heartbeat: datetime | None = SQLField(default=None, sa_column=_time_column())


class Migration(SQLModel, table=True):
    """A pod moved on request, from the request to its replacement taking part."""

    id: int | None = SQLField(default=None, primary_key=True)
    job_id: str = SQLField(foreign_key="job.id", index=True)
    ordinal: int
    status: str = "pending"
    """`pending` until the replacement takes part (`done`) or the backend gives up (`failed`)."""
    requested_at: float
    """Unix time of the request."""
    step_at_request: int
    old_incarnation: str | None = None
    new_incarnation: str | None = None
    node_from: str | None = None
    node_to: str | None = None
    """The node asked for; None: any but the current one."""
    seconds: float | None = None
    """From the request to the replacement's first committed step."""
    steps_lost: int | None = None
    """Committed steps the replacement had to redo (0 in live mode)."""


# --- events (the stream and its history) -------------------------------------------------

EventType = Literal["metric", "checkpoint", "samples", "job", "pod", "log"]
"""A stream event's type (its SSE `event:`). From pods' reports: `metric` (metric and eval
records, `data.kind` says which), `checkpoint`, `samples`, `job` (event records, `data.type` says
which: trainer.contract.records); from the control plane: `job` (status moves, `data.status`),
`pod` (phases, restarts, kills) and `log` (a failed pod's last lines)."""


class Event(SQLModel, table=True):
    """One streamable event; its id is the SSE event id (increasing over all jobs)."""

    # Pages follow (job_id, id); the reconciler looks a job's completions up by type; a job's
    # chart series reads its metric points by step.
    __table_args__ = (Index("ix_event_job_id_type", "job_id", "type"),
                      Index("ix_event_job_id_step", "job_id", "step"))

    id: int | None = SQLField(default=None, primary_key=True)
    job_id: str = SQLField(foreign_key="job.id", index=True)
    type: str
    time: float
    data: dict[str, Any] = SQLField(sa_column=Column(JSON, nullable=False))
    size: int = SQLField(default=0, sa_column_kwargs={"server_default": "0"})
    """Bytes of `data` as compact JSON: pages are bounded by it, and quotas count it."""
    step: int | None = None
    """A metric point's step (`data.kind` "metric"; None for every other event). The point's
    numbers have columns of their own, so a job's chart series never parses its history."""
    loss: float | None = None
    rate: float | None = None
    """The point's samples/s."""
    participants: int | None = None


class EventPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    type: EventType
    time: float
    data: dict[str, Any]


class SeriesPublic(BaseModel):
    """A job's chart series, downsampled to a bounded number of points, extremes kept."""

    last_id: int
    """The newest event id the series covers: the rest of the history, and the stream, go on
    from it."""
    steps: int
    """Steps with metric points in all (the series holds a bounded number of them)."""
    points: list[tuple[int, float, float | None, float | None, int | None]]
    """(step, time, mean loss, mean samples/s, most participants) per step kept, oldest first:
    every step while they are few, else each span's first and last, lowest and highest loss
    and samples/s, and fewest participants."""
    latest: dict[str, Any] | None
    """The newest metric point's data, with its `time`."""


class EventsPublic(BaseModel):
    data: list[EventPublic]
    next_after: int | None
    """Pass as `after` to get the next page; None when this page is the last."""
    next_before: int | None = None
    """With `newest=true`: pass as `before` to get the page before this one; None when no
    older event is left."""


class Incarnation(SQLModel, table=True):
    """The highest report seq stored per (job, pod, incarnation): makes ingestion idempotent."""

    job_id: str = SQLField(foreign_key="job.id", primary_key=True)
    pod: str = SQLField(primary_key=True)
    incarnation: str = SQLField(primary_key=True)
    last_seq: int = 0


# --- checkpoints ---------------------------------------------------------------------------


class CheckpointPublic(BaseModel):
    id: str
    step: int
    epoch: int | None
    epoch_end: bool
    val_accuracy: float | None
    size_bytes: int
    saved_at: float | None
    links: dict[str, str]


# --- models --------------------------------------------------------------------------------


class Model(SQLModel, table=True):
    """A trained model registered when its job succeeded."""

    id: str = SQLField(primary_key=True)
    job_id: str = SQLField(index=True)
    """The job that trained it; no foreign key: a model outlives its job's deleted record."""
    name: str
    path: str
    """Directory of the save_pretrained export, relative to the data dir."""
    base_model: str
    dataset: str
    metrics: dict[str, Any] = SQLField(default_factory=dict, sa_column=Column(JSON))
    size_bytes: int = 0
    created_at: datetime = SQLField(default_factory=utc_now,
                                    sa_column=Column(DateTime(timezone=True), nullable=False))


class ModelPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    job_id: str
    name: str
    base_model: str
    dataset: str
    metrics: dict[str, Any]
    size_bytes: int
    created_at: UTCDateTime
    links: dict[str, str] = {}


class ModelsPublic(BaseModel):
    data: list[ModelPublic]
    count: int


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    texts: list[Annotated[str, Field(min_length=1, max_length=20_000)]] = Field(
        min_length=1, max_length=64)


class Prediction(BaseModel):
    label: str
    score: float


class PredictResponse(BaseModel):
    model_id: str
    predictions: list[Prediction]
