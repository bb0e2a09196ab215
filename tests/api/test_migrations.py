"""Schema migrations (api/migrations) on real SQLite files and a real PostgreSQL: they build
exactly the models' schema, a database from before them is taken over with its rows, and one
written by a newer version is refused, by `python -m api` too, with a message that says so."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlmodel import Session, SQLModel, select

from api import migrations
from api.models import Event, Job


def sqlite(path: Path) -> Engine:
    return create_engine(f"sqlite:///{path}")


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An empty database: a real SQLite file, or a new database on a real PostgreSQL server."""
    if request.param == "sqlite":
        engine = sqlite(tmp_path / "test.db")
    else:
        engine = create_engine(request.getfixturevalue("postgres").create_database())
    yield engine
    engine.dispose()


def test_the_migrations_build_exactly_the_models_schema(engine: Engine) -> None:
    with engine.begin() as connection:  # every revision in turn, not the empty-database path
        command.upgrade(migrations._config(connection), "head")
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), SQLModel.metadata) == []
    assert migrations.current(engine) == migrations.head()


def test_an_empty_database_gets_the_newest_schema(engine: Engine) -> None:
    migrations.upgrade(engine)
    assert migrations.current(engine) == migrations.head()
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), SQLModel.metadata) == []


def test_a_database_from_before_migrations_is_taken_over_with_its_rows(engine: Engine) -> None:
    with engine.begin() as connection:  # what every earlier version made at start-up
        command.upgrade(migrations._config(connection), migrations.BASELINE)
        connection.execute(text("DROP TABLE alembic_version"))
        connection.execute(text(
            "INSERT INTO job (id, status, spec, report_token_hash, created_at, epoch, step, "
            "samples_seen) VALUES ('job-0123abcd', 'running', '{\"model\": \"minilm\"}', 'x', "
            "CURRENT_TIMESTAMP, 0, 0, 0)"))
        connection.execute(text("INSERT INTO event (job_id, type, time, data) VALUES "
                                "('job-0123abcd', 'job', 1.0, '{\"status\": \"pending\"}')"))
    assert migrations.current(engine) is None

    migrations.upgrade(engine)
    assert migrations.current(engine) == migrations.head()
    with Session(engine) as session:
        assert [job.id for job in session.exec(select(Job))] == ["job-0123abcd"]
        assert session.exec(select(Job)).one().event_bytes == 0
        # Rows stored before sizes existed get the size of their JSON: pages count them too.
        assert session.exec(select(Event)).one().size == len('{"status": "pending"}')
    migrations.upgrade(engine)  # at the newest already: nothing to do
    assert migrations.current(engine) == migrations.head()


def test_metric_points_stored_before_their_columns_get_them(engine: Engine) -> None:
    with engine.begin() as connection:
        command.upgrade(migrations._config(connection), "0002")
        connection.execute(text(
            "INSERT INTO job (id, status, spec, report_token_hash, created_at, epoch, step, "
            "samples_seen, event_bytes) VALUES ('job-0123abcd', 'running', '{}', 'x', "
            "CURRENT_TIMESTAMP, 0, 0, 0, 0)"))
        connection.execute(text(
            "INSERT INTO event (job_id, type, time, data, size) VALUES "
            "('job-0123abcd', 'metric', 1.0, '{\"kind\": \"metric\", \"step\": 7, "
            "\"loss\": 0.25, \"samples_per_second\": 31.5, \"participants\": 3}', 0), "
            "('job-0123abcd', 'metric', 2.0, '{\"kind\": \"eval\", \"step\": 7, "
            "\"accuracy\": 0.8}', 0)"))
    migrations.upgrade(engine)
    with Session(engine) as session:
        point, evaluation = session.exec(select(Event).order_by(Event.time)).all()
    assert (point.step, point.loss, point.rate, point.participants) == (7, 0.25, 31.5, 3)
    assert (evaluation.step, evaluation.loss) == (None, None)  # an evaluation is no point


def test_a_database_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    engine = sqlite(data_dir / "migrator.db")
    migrations.upgrade(engine)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(migrations.SchemaError, match="revision '9999', which this version"):
        migrations.upgrade(engine)
    assert migrations.current(engine) == "9999"  # untouched

    env = {**os.environ, "MIGRATOR_DATA_DIR": str(data_dir),
           "MIGRATOR_ADMIN_TOKEN": "a-token-long-enough-for-the-settings-0123"}
    env.pop("MIGRATOR_DATABASE_URL", None)
    started = subprocess.run([sys.executable, "-m", "api", "--port", "1"], env=env,
                             capture_output=True, text=True, timeout=120, check=False)
    assert started.returncode == 2, started.stderr
    assert "cannot use the database" in started.stderr
    assert "a newer version wrote it" in started.stderr
    assert "Traceback" not in started.stderr
