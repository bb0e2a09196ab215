"""Report records: what pods post to `POST /api/v1/jobs/{id}/reports`, one typed kind each.

A batch is `{"pod", "incarnation", "dropped", "records": [{"seq", "kind", "time", "data"}]}`.
`(pod, incarnation, seq)` identifies a record: seq starts at 1 for every incarnation (one process
life of the pod) and grows by one per record, so the API drops duplicates of retried batches.
`dropped` counts records the pod discarded while the API was unreachable (only metrics ever are).
A batch with no records is a heartbeat.

`kind` selects the type of `data`: `metric`, `eval`, `checkpoint`, `samples`, or `event`, whose
`data.type` selects the event. The trainer builds records from these classes, and the API
validates them against the same ones, so a field exists on both sides or on neither.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict  # pydantic needs it, not typing's, before Python 3.12

from trainer.contract.spec import MAX_INT

Kind = Literal["metric", "eval", "checkpoint", "samples", "event"]


class RecordData(BaseModel):
    """The `data` of one record; KIND says which record kind carries it."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    KIND: ClassVar[Kind]


# Every field is bounded: one record must not be able to fail its batch in the database (an
# integer past 64 bits, a NaN that PostgreSQL's json refuses, a NUL that its text refuses) nor
# fill it. Refused values are a 422 that names the field.
Count = Annotated[int, Field(ge=0, le=MAX_INT)]
"""A step, count, size or index: what a 64-bit database integer holds."""
Ordinal = Annotated[int, Field(ge=1, le=MAX_INT)]
"""Counted from 1 (an epoch)."""
Finite = Annotated[float, Field(allow_inf_nan=False)]
"""Any float but NaN and Infinity, which JSON lacks and PostgreSQL's json refuses."""
Rate = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
UnixTime = Annotated[float, Field(ge=0, le=253_402_300_799, allow_inf_nan=False)]
"""Seconds since 1970, up to the end of the year 9999."""
_PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
Name = Annotated[str, Field(min_length=1, max_length=100, pattern=_PRINTABLE)]
"""A pod's name, an incarnation, a checksum: one printable line."""
Location = Annotated[str, Field(min_length=1, max_length=4096, pattern=_PRINTABLE)]
"""A directory, a store URL or an address."""
Message = Annotated[str, Field(max_length=10_000, pattern=r"^[^\x00]*$")]
"""Text for people, lines included; no NUL, which PostgreSQL's text refuses."""
MAX_SAMPLE_IDS = 65_536
"""Sample ids of one step: batch_size (at most 1,024) x participants (16), with room."""
SampleIdList = Annotated[list[Count], Field(max_length=MAX_SAMPLE_IDS)]
EvalSplit = Literal["validation", "test"]
DataSplit = Literal["train", "validation", "test"]


class Metric(RecordData):
    """A committed training step (the dashboard's loss and throughput charts)."""

    KIND = "metric"
    step: Count
    """Committed steps of the whole job."""
    epoch: Ordinal
    """Epoch of the step, counted from 1."""
    loss: Finite
    """Mean training loss over the samples this pod counted; finite, as every float here."""
    learning_rate: Rate
    samples_per_second: Rate
    """Job-wide training throughput over the last few seconds."""
    participants: Count
    """Pods that took part in the step."""
    samples_seen: Count
    """Training samples consumed by committed steps, over all epochs."""


class Evaluation(RecordData):
    """Metrics over a validation or test split."""

    KIND = "eval"
    split: EvalSplit
    accuracy: Fraction
    loss: Finite
    f1: Fraction
    """F1 of the positive class."""
    samples: Count
    epoch: Count
    """Epochs completed when evaluated."""
    step: Count


class Scores(TypedDict):
    """An evaluation's figures as `Completed.metrics` holds them (an Evaluation but its split)."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]
    accuracy: Fraction
    loss: Finite
    f1: Fraction
    samples: Count
    epoch: Count
    step: Count


class CheckpointSaved(RecordData):
    """A complete checkpoint (its marker written)."""

    KIND = "checkpoint"
    step: Count
    epoch: Count
    path: Name
    """The checkpoint's directory name, `step-N`."""
    size_bytes: Count
    epoch_end: bool
    val_accuracy: Fraction | None
    emergency: bool = False
    """Written by a survivor after a failure (restart mode), not on schedule."""


class SampleIds(RecordData):
    """Debug (`log_sample_ids`): the samples of a committed step, to prove exactly-once use."""

    KIND = "samples"
    step: Count
    epoch: Ordinal
    cursor: Count
    """Position in the epoch's sample order where the step's window starts."""
    rank: Count
    ids: SampleIdList
    """Sample ids this pod trained on (none where it healed into the step)."""
    window: SampleIdList
    """Sample ids of every participant of the step."""


# --- events --------------------------------------------------------------------------------


class Event(RecordData):
    """Something that happened to the pod or the job; `message` is for people."""

    KIND = "event"
    message: Message


class Started(Event):
    type: Literal["started"] = "started"
    step: Count
    epoch: Ordinal
    samples: dict[DataSplit, Count]
    """Samples per split: train, validation, test."""
    parameters: dict[Literal["trainable", "total"], Count] | None = None
    """The model's parameters (`total`) and how many of them train (`trainable`: a LoRA
    job's few percent); none from a pipeline's stages, which hold a part each."""


class Resumed(Event):
    """Loaded a checkpoint (a restart, or a live group that lost every pod)."""

    type: Literal["resumed"] = "resumed"
    checkpoint: Name
    """The checkpoint's directory name, `step-N`."""
    step: Count
    epoch: Ordinal
    cursor: Count


class Healed(Event):
    """Fetched the live state from a peer (`synced`: at step 0, recorded by the versions
    before every pod started from the seeded model alone)."""

    type: Literal["healed", "synced"] = "healed"
    source: Name
    """Pod the state came from."""
    target: Name
    step: Count
    epoch: Ordinal
    cursor: Count
    bytes: Count = 0
    """What the pod waited for before it could compute: the state but the optimizer's moments,
    which arrive while it computes its first step (trainer.fault_tolerance.heal)."""
    seconds: Rate = 0.0
    """How long it waited for those bytes."""
    source_address: Location | None = None


class Quorum(Event):
    """The set of participants changed (reported by the primary)."""

    type: Literal["quorum"] = "quorum"
    quorum_id: int = Field(ge=-1, le=MAX_INT)
    """-1 before torchft's first quorum."""
    participants: Count
    step: Count


class Primary(Event):
    """This pod became the primary: it writes checkpoints and the export."""

    type: Literal["primary"] = "primary"
    pod: Name
    step: Count


class EpochEnd(Event):
    type: Literal["epoch_end"] = "epoch_end"
    epoch: Ordinal
    step: Count


class Stopped(Event):
    """Stopped on SIGTERM (this pod's, or a participant's) after a checkpoint."""

    type: Literal["sigterm"] = "sigterm"
    step: Count


LeaveReason = Literal["scale-down", "migrate", "sigterm"]


class Left(Event):
    """Left the job on purpose after committing `step`: its peers go on without it at once."""

    type: Literal["left"] = "left"
    pod: Name
    step: Count
    epoch: Ordinal
    reason: LeaveReason | None = None
    """Why it was asked to leave: the API fills it in (the pod only knows it got SIGTERM)."""


class Joined(Event):
    """This incarnation took part in a committed step for the first time (after a heal, the
    heal's size and duration)."""

    type: Literal["joined"] = "joined"
    pod: Name
    step: Count
    epoch: Ordinal
    participants: int = Field(ge=1, le=MAX_INT)
    heal_bytes: Count = 0
    heal_seconds: Rate = 0.0


class Completed(Event):
    """Training done: test metrics, the weights' checksum, and the export if this pod wrote it."""

    type: Literal["completed"] = "completed"
    step: Count
    model_dir: Location | None
    metrics: dict[EvalSplit, Scores]
    """The last evaluation of each split."""
    checksum: Name
    """Digest of every weight: equal across replicas that hold equal weights."""
    primary: bool


class StepSkipped(Event):
    """A step whose gradients were not finite, committed without its update (the spec's
    `nonfinite_loss: "skip"`): its samples count as used; the weights and the optimizer's state
    stay as they were."""

    type: Literal["step_skipped"] = "step_skipped"
    step: Count
    """The step skipped (committed steps of the job, it included)."""
    epoch: Ordinal
    non_finite: Literal["nan", "inf", "-inf"]
    """The value that was not finite: this pod's loss, else the norm of the gradients (which
    the gradient synchronisation spreads from any participant to all)."""
    loss: Finite | None = None
    """This pod's loss over the step's samples, where it was finite."""
    skipped: Count
    """Steps of the job skipped so far, this one included."""


class Finishing(Event):
    """The step's participants agreed to end the job early, after `epoch` (as the control
    plane asked: trainer.finish); reported by each of them."""

    type: Literal["finishing"] = "finishing"
    epoch: Ordinal
    step: Count
    """The committed step at which they agreed."""


class Failed(Event):
    type: Literal["failed"] = "failed"
    reason: Literal["bad_input", "error", "non_finite_loss"]
    """`non_finite_loss`: a step's loss or gradients were not finite (`nonfinite_loss: "fail"`)."""


EventData = Annotated[Started | Resumed | Healed | Quorum | Primary | EpochEnd | Stopped
                      | Left | Joined | Completed | StepSkipped | Finishing | Failed,
                      Field(discriminator="type")]


# --- records and batches -------------------------------------------------------------------


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq: int = Field(ge=1, le=MAX_INT)
    time: UnixTime
    """Unix time the pod recorded it."""


class MetricRecord(_Record):
    kind: Literal["metric"]
    data: Metric


class EvalRecord(_Record):
    kind: Literal["eval"]
    data: Evaluation


class CheckpointRecord(_Record):
    kind: Literal["checkpoint"]
    data: CheckpointSaved


class SamplesRecord(_Record):
    kind: Literal["samples"]
    data: SampleIds


class EventRecord(_Record):
    kind: Literal["event"]
    data: EventData


Record = Annotated[MetricRecord | EvalRecord | CheckpointRecord | SamplesRecord | EventRecord,
                   Field(discriminator="kind")]


class ReportBatch(BaseModel):
    """One POST of a pod: its records since the last one that was accepted."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    pod: Name
    """The pod's stable name, `<job>-<ordinal>`."""
    incarnation: Name
    """One process life of the pod; seq restarts at 1 with each."""
    dropped: int = Field(default=0, ge=0, le=MAX_INT)
    records: list[Record] = Field(max_length=10_000)


class ReportAccepted(BaseModel):
    """The control plane's reply to a ReportBatch."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    accepted: int
    duplicates: int
    """Records it had stored already (by pod, incarnation and seq)."""
    finish_after_epoch: int | None = None
    """The epoch after which the job is to finish early, if it was asked to (trainer.finish)."""


RECORD_KINDS: tuple[str, ...] = get_args(Kind)
EVENT_TYPES: tuple[str, ...] = tuple(
    value for cls in get_args(get_args(EventData)[0])
    for value in get_args(cls.model_fields["type"].annotation))
"""Every `data.type` an event record may carry."""
CONTROL_EVENT_TYPES = ("scaled", "migrated", "migration_failed", "finish_requested", "pushed",
                       "push_failed")
"""The `data.type` of job events the control plane itself records (membership changes it
made: a scale, a migration; an early finish asked for; a succeeded job's model pushed to the
hub, or why not)."""
