"""Dependencies shared by the routes, each an Annotated alias defined once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.engine import Engine
from sqlmodel import Session

from api.backends.base import Backend
from api.broker import Broker
from api.db import session_scope
from api.services.events import EventLog
from api.settings import Settings


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


def get_session(engine: Annotated[Engine, Depends(get_engine)]) -> Iterator[Session]:
    with session_scope(engine) as session:
        yield session


def get_backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


def get_broker(request: Request) -> Broker:
    broker: Broker = request.app.state.broker
    return broker


def get_events(request: Request) -> EventLog:
    events: EventLog = request.app.state.events
    return events


SettingsDep = Annotated[Settings, Depends(get_settings)]
EngineDep = Annotated[Engine, Depends(get_engine)]
SessionDep = Annotated[Session, Depends(get_session)]
BackendDep = Annotated[Backend, Depends(get_backend)]
BrokerDep = Annotated[Broker, Depends(get_broker)]
EventsDep = Annotated[EventLog, Depends(get_events)]
