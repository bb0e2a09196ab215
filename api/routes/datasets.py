"""Datasets: upload (the file as the request body), import by URL, list, read, delete."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response, status
from pydantic import BaseModel, Field
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool

from api.asset_models import Dataset, DatasetPublic, DatasetsPublic, StagingPublic
from api.auth import AdminRoute
from api.db import session_scope
from api.deps import BackendDep, EngineDep, SessionDep, SettingsDep
from api.errors import error_responses
from api.routes import API_PREFIX
from api.services import datasets as service
from api.services import staging
from trainer.contract.spec import MAX_INT
from trainer.contract.staged import IMPORT_SCHEMES
from trainer.contract.tables import MEDIA_TYPES

router = APIRouter(prefix=API_PREFIX + "/datasets", tags=["datasets"],
                   route_class=AdminRoute, responses=error_responses(401, 403, 422))

Named = Annotated[str | None, Query(min_length=1, max_length=200)]
"""A file's or a column's name."""


def _store(engine: Engine, *args: Any) -> tuple[Dataset, bool]:
    """service.store in a session of its own (it runs in the thread pool: minutes of reading
    for a large file)."""
    with session_scope(engine) as session:
        return service.store(session, *args)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=DatasetPublic,
             responses={**error_responses(413, 415), 200: {"model": DatasetPublic,
                        "description": "The same file was uploaded before: that dataset."}},
             openapi_extra={"requestBody": {"required": True, "content": {
                 media: {"schema": {"type": "string", "format": "binary"}}
                 for media in MEDIA_TYPES}}})
async def upload_dataset(request: Request, response: Response, engine: EngineDep,
                         settings: SettingsDep,
                         name: Named = None, text_column: Named = None,
                         label_column: Named = None) -> Dataset:
    """Upload a CSV, TSV, JSONL or Parquet file as the request body (`curl --data-binary
    @reviews.csv '...?name=reviews.csv'`): its format comes from `name`'s suffix, else the
    Content-Type, else its first bytes. The text and label columns are `text_column` and
    `label_column`, else the first of text/review/sentence/... and label/sentiment/... found.
    Duplicate texts and rows without text or label are dropped; any number of classes from 2.
    201 with what was found; 200 with the dataset kept before for the same file and columns;
    422 saying why a file cannot train a classifier; 413 past `max_upload_bytes`."""
    content_type = request.headers.get("content-type")
    service.check_media_type(content_type)
    received = await service.receive(request.stream(), settings)
    try:
        dataset, created = await run_in_threadpool(
            _store, engine, settings, received, name, content_type, text_column, label_column)
    finally:
        received.discard()
    response.headers["Location"] = f"{API_PREFIX}/datasets/{dataset.id}"
    if not created:
        response.status_code = status.HTTP_200_OK
    return dataset


class DatasetImport(BaseModel):
    """A dataset file to import by its URL; the columns as for an upload."""

    source: str = Field(max_length=2000, pattern=f"^({'|'.join(IMPORT_SCHEMES)})://[^/]+/.+",
                        examples=["s3://reviews/2026/imdb.parquet"],
                        description="https://, http://, s3:// or az://; S3's and Azure's "
                                    "credentials come from the control plane's environment.")
    name: str | None = Field(default=None, min_length=1, max_length=200)
    text_column: str | None = Field(default=None, min_length=1, max_length=200)
    label_column: str | None = Field(default=None, min_length=1, max_length=200)


@router.post("/imports", status_code=status.HTTP_202_ACCEPTED, response_model=StagingPublic,
             responses={200: {"model": StagingPublic, "description": "Imported already."}})
def import_dataset(body: DatasetImport, response: Response, session: SessionDep,
                   settings: SettingsDep, backend: BackendDep) -> StagingPublic:
    """Fetch the file with an initializer, check it and keep it as an upload is: 202 with the
    staging (its progress at its Location; its `dataset_id` once done, or its `error` saying
    why the file cannot train a classifier); 200 where it was imported already."""
    row, already = staging.import_file(session, settings, backend, body.source, body.name,
                                       body.text_column, body.label_column)
    response.headers["Location"] = f"{API_PREFIX}/stagings/{row.id}"
    if already:
        response.status_code = status.HTTP_200_OK
    return staging.public(row)


@router.get("", response_model=DatasetsPublic)
def list_datasets(session: SessionDep, offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
                  limit: Annotated[int, Query(ge=1, le=200)] = 50) -> DatasetsPublic:
    return service.list_datasets(session, offset, limit)


@router.get("/{dataset_id}", response_model=DatasetPublic, responses=error_responses(404))
def get_dataset(dataset_id: str, session: SessionDep) -> Dataset:
    return service.get_dataset(session, dataset_id)


@router.delete("/{dataset_id}", status_code=status.HTTP_204_NO_CONTENT,
               responses=error_responses(404, 409))
def delete_dataset(dataset_id: str, session: SessionDep, settings: SettingsDep) -> Response:
    """Delete the dataset's files and record; 409 while a job not finished trains on it."""
    service.delete_dataset(session, settings, dataset_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
