"""The SQLModel engine: SQLite in WAL mode with a busy timeout by default, any URL otherwise;
and the JSON column type that holds a pydantic model (a job's spec)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic_core import from_json, to_json
from sqlalchemy import JSON, event
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.types import TypeDecorator
from sqlmodel import Session, create_engine

from api.settings import Settings


def _to_json(value: Any) -> str:
    return to_json(value).decode()


# JSON columns through pydantic's serializer, several times faster than the json module's on the
# busiest path (every report record), and the one that sizes events (services/events.json_size).
JSON_CODEC: dict[str, Any] = {"json_serializer": _to_json, "json_deserializer": from_json}

M = TypeVar("M", bound=BaseModel)


class ModelJSON(TypeDecorator[M]):
    """A JSON column that holds a pydantic model: stored as the model's JSON dump (the same
    document a dict column held), validated into the model when loaded, so that its defaults
    live in the model and nowhere else."""

    impl = JSON
    cache_ok = True

    def __init__(self, model: type[M]) -> None:
        super().__init__()
        self.model = model

    def process_bind_param(self, value: M | None, dialect: Dialect) -> Any:
        return None if value is None else value.model_dump(mode="json")

    def process_result_value(self, value: Any, dialect: Dialect) -> M | None:
        return None if value is None else self.model.model_validate(value)


def make_engine(settings: Settings) -> Engine:
    url = settings.sqlite_url
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True, **JSON_CODEC)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30},
                           **JSON_CODEC)

    @event.listens_for(engine, "connect")
    def _pragmas(connection: Any, _record: Any) -> None:
        # WAL lets the stream and the dashboard read while reports are written.
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return engine


def init_db(engine: Engine) -> None:
    """Bring the schema to this version's (`api/migrations`); SchemaError if it is newer."""
    from api import migrations

    migrations.upgrade(engine)


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session that writes only when committed (no autoflush): see api/services/events.py."""
    with Session(engine, expire_on_commit=False, autoflush=False) as session:
        yield session
