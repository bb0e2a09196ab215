"""Dependencies shared by the routes, each an Annotated alias defined once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyQuery, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Engine
from sqlmodel import Session

from api.auth import ADMIN
from api.backends.base import Backend
from api.broker import Broker
from api.db import session_scope
from api.errors import Unauthorized
from api.services.events import EventLog
from api.settings import Settings

# Declared for OpenAPI; the route classes of api/auth.py check the tokens before the body.
admin_scheme = HTTPBearer(auto_error=False, scheme_name="AdminToken",
                          description="The admin token")
stream_token = APIKeyQuery(name="token", auto_error=False, scheme_name="StreamToken",
                           description="The admin token, for EventSource (it sends no headers)")
report_scheme = HTTPBearer(auto_error=False, scheme_name="ReportToken",
                           description="The job's report token (handed to its pods)")


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


def _authenticated_as(request: Request, principal: str) -> None:
    # Fail closed: a route wired without one of api/auth.py's route classes answers 401.
    if getattr(request.state, "principal", None) != principal:
        raise Unauthorized("not authenticated")


def require_admin(request: Request,
                  _: Annotated[HTTPAuthorizationCredentials | None, Depends(admin_scheme)]) -> None:
    _authenticated_as(request, ADMIN)


def require_admin_or_stream_token(
        request: Request,
        _header: Annotated[HTTPAuthorizationCredentials | None, Depends(admin_scheme)],
        _query: Annotated[str | None, Depends(stream_token)]) -> None:
    _authenticated_as(request, ADMIN)


def require_reporter(request: Request, job_id: str,
                     _: Annotated[HTTPAuthorizationCredentials | None, Depends(report_scheme)],
                     ) -> None:
    _authenticated_as(request, f"reporter:{job_id}")


def get_events(request: Request) -> EventLog:
    events: EventLog = request.app.state.events
    return events


SettingsDep = Annotated[Settings, Depends(get_settings)]
EngineDep = Annotated[Engine, Depends(get_engine)]
SessionDep = Annotated[Session, Depends(get_session)]
BackendDep = Annotated[Backend, Depends(get_backend)]
BrokerDep = Annotated[Broker, Depends(get_broker)]
EventsDep = Annotated[EventLog, Depends(get_events)]
AdminDep = Depends(require_admin)
StreamAuthDep = Depends(require_admin_or_stream_token)
ReporterDep = Depends(require_reporter)
