"""Tables and schema families of the assets jobs train from: uploaded datasets (`Dataset`,
`DatasetPublic`, `DatasetsPublic`). Beside api/models.py, which holds jobs and their records."""

from __future__ import annotations

from datetime import datetime
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
