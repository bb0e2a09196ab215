"""Uploaded datasets: receive a file's bytes, check them, keep their normal form under the inputs
dir (trainer.contract.datasets), list, show and delete.

An upload is streamed to a file of its own under `datasets/.incoming` (the route's body limit
stops it past `max_upload_bytes`), then read twice by api.services.tables in a worker thread,
and its normal form moved into place with one rename, so that a dataset's directory is either
whole or absent. Whatever ends an upload early (a 413, a client gone, a bad file, the API
killed) leaves nothing behind: its files are removed on the way out, or when the API starts.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, func, select

from api.asset_models import Dataset, DatasetPublic, DatasetsPublic
from api.errors import Conflict, DomainError, NotFound
from api.models import FINISHED_STATUSES, Job
from api.settings import Settings
from trainer.contract import tables
from trainer.contract.datasets import (
    DATASETS_DIR,
    INCOMING_DIR,
    dataset_dir,
    is_dataset_id,
)


class UnusableTable(DomainError):
    """The upload is not a table a classifier can train on (422, saying why)."""

    status_code, error = 422, "unusable_dataset"


class UnsupportedMediaType(DomainError):
    status_code, error = 415, "unsupported_media_type"


@dataclass
class Received:
    """An upload's bytes on disk, not checked yet."""

    path: Path
    sha256: str
    size: int

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


def incoming(settings: Settings) -> Path:
    return settings.resolved_inputs_dir / DATASETS_DIR / INCOMING_DIR


def sweep_incoming(settings: Settings) -> None:
    """Remove what uploads cut short by the API's end left: no upload outlives its process."""
    shutil.rmtree(incoming(settings), ignore_errors=True)


def media_type(content_type: str | None) -> str:
    """`text/csv` of `text/csv; charset=utf-8`."""
    return (content_type or "").split(";")[0].strip().lower()


def check_media_type(content_type: str | None) -> None:
    if media_type(content_type) == "multipart/form-data":
        raise UnsupportedMediaType(
            "send the file itself as the request body, not a form: "
            "curl --data-binary @reviews.csv '.../api/v1/datasets?name=reviews.csv'")


async def receive(chunks: AsyncIterator[bytes], settings: Settings) -> Received:
    """The request body, streamed to a file under the incoming dir; removed if the body does
    not arrive whole (the client went away, or the body limit stopped it)."""
    directory = incoming(settings)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{uuid.uuid4().hex}.upload"
    digest, size = hashlib.sha256(), 0
    try:
        with path.open("wb") as handle:
            async for chunk in chunks:
                handle.write(chunk)
                digest.update(chunk)
                size += len(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return Received(path, digest.hexdigest(), size)


def store(session: Session, settings: Settings, received: Received, name: str | None,
          content_type: str | None, text_column: str | None,
          label_column: str | None) -> tuple[Dataset, bool]:
    """Check the upload and keep its normal form: (the dataset, whether it is new). The same
    bytes read with the same columns are the same dataset, kept once (tables.keep)."""
    try:
        record, _ = tables.keep(received.path, received.sha256, name, media_type(content_type),
                                text_column, label_column, settings.resolved_inputs_dir)
    except tables.TableError as exc:
        raise UnusableTable(str(exc)) from None
    return register(session, record)


def register(session: Session, record: dict[str, Any]) -> tuple[Dataset, bool]:
    """The dataset whose normal form `record` describes, recorded unless it is already: (it,
    whether it is new)."""
    existing = session.get(Dataset, record["id"])
    if existing is not None:
        return existing, False
    dataset = Dataset.model_validate(record)
    session.add(dataset)
    try:
        session.commit()
    except IntegrityError:  # recorded meanwhile by another request: theirs stands
        session.rollback()
        return get_dataset(session, dataset.id), False
    return dataset, True


def get_dataset(session: Session, dataset_id: str) -> Dataset:
    dataset = session.get(Dataset, dataset_id) if is_dataset_id(dataset_id) else None
    if dataset is None:
        raise NotFound(f"no dataset '{dataset_id}'")
    return dataset


def list_datasets(session: Session, offset: int, limit: int) -> DatasetsPublic:
    rows = session.exec(select(Dataset).order_by(col(Dataset.created_at).desc(),
                                                 col(Dataset.id)).offset(offset).limit(limit))
    count = session.exec(select(func.count()).select_from(Dataset)).one()
    return DatasetsPublic(data=[DatasetPublic.model_validate(d) for d in rows], count=count)


def users(session: Session, dataset_id: str) -> list[str]:
    """The jobs not finished that train on the dataset."""
    unfinished = session.exec(select(Job).where(col(Job.status).not_in(FINISHED_STATUSES)))
    return [job.id for job in unfinished if job.spec.dataset == dataset_id]


def delete_dataset(session: Session, settings: Settings, dataset_id: str) -> None:
    dataset = get_dataset(session, dataset_id)
    using = users(session, dataset.id)
    if using:
        raise Conflict(f"dataset '{dataset.id}' is in use by {', '.join(using)}: cancel or "
                       "wait for them first")
    session.delete(dataset)
    session.commit()
    directory = dataset_dir(settings.resolved_inputs_dir, dataset.id)
    # Renamed away first, so that no job started from here on finds half of it.
    doomed = incoming(settings) / f"{uuid.uuid4().hex}.deleted"
    doomed.parent.mkdir(parents=True, exist_ok=True)
    try:
        directory.replace(doomed)
    except FileNotFoundError:
        return
    shutil.rmtree(doomed, ignore_errors=True)

