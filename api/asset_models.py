"""Tables and schema families of the assets jobs train from: uploaded datasets (`Dataset`,
`DatasetPublic`, `DatasetsPublic`) and hub repositories staged for them (`Staging`,
`StagingPublic`, `StagingsPublic`). Beside api/models.py, which holds jobs and their records."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import JSON, BigInteger, Column, DateTime
from sqlmodel import Field as SQLField
from sqlmodel import SQLModel

from api.models import UTCDateTime, utc_now


class Dataset(SQLModel, table=True):
    """An uploaded dataset, checked and kept in its normal form (trainer.contract.datasets)."""

    id: str = SQLField(primary_key=True)
    name: str
    """The uploaded file's name."""
    format: str
    """csv, tsv, jsonl or parquet: how the upload was read."""
    text_column: str
    label_column: str
    rows: int
    """Rows that train: the upload's, less duplicates and empty ones."""
    labels: list[str] = SQLField(default_factory=list, sa_column=Column(JSON))
    """Label names in label order (the model's id2label)."""
    class_counts: list[int] = SQLField(default_factory=list, sa_column=Column(JSON))
    duplicates: int = 0
    empty: int = 0
    preview: list[dict[str, Any]] = SQLField(default_factory=list, sa_column=Column(JSON))
    upload_bytes: int = SQLField(default=0, sa_column=Column(BigInteger, nullable=False))
    sha256: str
    """Of the uploaded bytes."""
    size_bytes: int = SQLField(default=0, sa_column=Column(BigInteger, nullable=False))
    """Of the normal form that pods read."""
    created_at: datetime = SQLField(default_factory=utc_now,
                                    sa_column=Column(DateTime(timezone=True), nullable=False))


class DatasetPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    format: str
    text_column: str
    label_column: str
    rows: int
    labels: list[str]
    class_counts: list[int]
    """Rows per label, in label order."""
    duplicates: int
    """Rows dropped because their text came earlier in the file."""
    empty: int
    """Rows dropped because their text or label was missing or blank."""
    preview: list[dict[str, Any]]
    """The first rows that train (texts cut at 300 characters)."""
    upload_bytes: int
    sha256: str
    size_bytes: int
    created_at: UTCDateTime


class DatasetsPublic(BaseModel):
    data: list[DatasetPublic]
    count: int


class StagingStatus(StrEnum):
    running = "running"
    succeeded = "succeeded"
    failed = "failed"


class Staging(SQLModel, table=True):
    """A hub repository at a revision, staged once under the inputs dir for every job that
    names it (trainer.contract.staged; its id is `staging_id` of the three)."""

    id: str = SQLField(primary_key=True)
    kind: str
    """model, dataset (hub repositories), tokens (a job's tokenized splits) or file (a dataset
    file imported by its URL)."""
    repo_id: str
    revision: str
    status: StagingStatus = SQLField(default=StagingStatus.running)
    commit: str | None = None
    """The commit the revision named when it was staged."""
    files: int = 0
    bytes_done: int = SQLField(default=0, sa_column=Column(BigInteger, nullable=False))
    bytes_total: int | None = SQLField(default=None, sa_column=Column(BigInteger, nullable=True))
    error: str | None = None
    attempts: int = 0
    options: dict[str, Any] | None = SQLField(default=None, sa_column=Column(JSON))
    """What the initializer needs besides the repository: a job's spec (`tokens`), an import's
    source and columns (`file`)."""
    dataset_id: str | None = None
    """`file`: the dataset the imported file became."""
    created_at: datetime = SQLField(default_factory=utc_now,
                                    sa_column=Column(DateTime(timezone=True), nullable=False))
    started_at: datetime | None = SQLField(default=None,
                                           sa_column=Column(DateTime(timezone=True)))
    finished_at: datetime | None = SQLField(default=None,
                                            sa_column=Column(DateTime(timezone=True)))


class StagingPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    kind: str
    repo_id: str
    revision: str
    status: StagingStatus
    commit: str | None
    files: int
    bytes_done: int
    bytes_total: int | None
    """None until the hub has listed the files' sizes (a mirror may not)."""
    error: str | None
    attempts: int
    source: str | None = None
    """`file`: the URL it is imported from."""
    dataset_id: str | None
    """`file`: the dataset it became, once staged."""
    created_at: UTCDateTime
    started_at: UTCDateTime | None
    finished_at: UTCDateTime | None
    eta_seconds: float | None = None
    """While running, at the rate so far."""


class StagingsPublic(BaseModel):
    data: list[StagingPublic]
    count: int
