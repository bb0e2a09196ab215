"""The database layer (api/db.py): a job's spec is a JobSpec in Python and the same JSON
document in the database, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import select as core_select
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlmodel import Session

from api.db import init_db, make_engine
from api.models import Job
from api.settings import Settings
from trainer.contract.spec import JobSpec

JOBS = Job.__table__  # type: ignore[attr-defined]


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    engine = make_engine(settings)
    init_db(engine)
    yield engine
    engine.dispose()


def stored(engine: Engine, job_id: str) -> object:
    """The spec column as the database holds it, read past the model."""
    with engine.connect() as connection:
        raw = connection.execute(text("SELECT spec FROM job WHERE id = :id"),
                                 {"id": job_id}).scalar_one()
    return json.loads(raw) if isinstance(raw, str) else raw  # PostgreSQL's driver parses JSON


def test_a_spec_is_stored_as_its_json_dump_and_loaded_as_a_job_spec(engine: Engine) -> None:
    spec = JobSpec(replicas=3, finetune="lora", epochs=2)
    with Session(engine) as session:
        session.add(Job(id="job-0000aaaa", spec=spec, report_token_hash="x"))
        session.commit()
    assert stored(engine, "job-0000aaaa") == spec.model_dump(mode="json")
    with Session(engine) as session:
        job = session.get(Job, "job-0000aaaa")
        assert job is not None
        assert type(job.spec) is JobSpec and job.spec == spec
        job.spec = job.spec.model_copy(update={"replicas": 4})  # a scale, as the service does
        session.add(job)
        session.commit()
    assert stored(engine, "job-0000aaaa") == {**spec.model_dump(mode="json"), "replicas": 4}
    with engine.connect() as connection:  # Core reads (the report writer's) get it typed too
        loaded = connection.execute(core_select(JOBS.c.spec)).scalar_one()
    assert loaded == spec.model_copy(update={"replicas": 4})


def test_a_spec_stored_without_newer_fields_gets_the_models_defaults(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO job (id, status, spec, report_token_hash, created_at, epoch, step, "
            "samples_seen, event_bytes) VALUES ('job-0000bbbb', 'running', "
            "'{\"replicas\": 3, \"parallelism\": \"pipeline\"}', 'x', CURRENT_TIMESTAMP, "
            "0, 0, 0, 0)"))
    with Session(engine) as session:
        job = session.get(Job, "job-0000bbbb")
        assert job is not None
        assert job.spec == JobSpec(replicas=3, parallelism="pipeline")
        assert (job.spec.stages, job.spec.pods, job.spec.max_replicas) == (2, 6, 8)
