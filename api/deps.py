"""Dependencies shared by the routes, each an Annotated alias defined once."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Engine
from sqlmodel import Session

from api.backends.base import Backend
from api.broker import Broker
from api.errors import Forbidden, Unauthorized
from api.settings import Settings

bearer = HTTPBearer(auto_error=False, description="The admin token (or ?token= on GET)")


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


def get_session(engine: Annotated[Engine, Depends(get_engine)]) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as session:
        yield session


def get_backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


def get_broker(request: Request) -> Broker:
    broker: Broker = request.app.state.broker
    return broker


def bearer_token(request: Request,
                 credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
                 ) -> str:
    """The bearer token; GET requests may pass it as ?token= (EventSource, download links)."""
    if credentials is not None:
        return credentials.credentials
    if request.method == "GET" and request.query_params.get("token"):
        return request.query_params["token"]
    raise Unauthorized("missing bearer token")


def require_admin(request: Request, token: Annotated[str, Depends(bearer_token)]) -> None:
    expected: str = request.app.state.admin_token
    if not hmac.compare_digest(token.encode(), expected.encode()):
        raise Forbidden("invalid token")


SettingsDep = Annotated[Settings, Depends(get_settings)]
EngineDep = Annotated[Engine, Depends(get_engine)]
SessionDep = Annotated[Session, Depends(get_session)]
BackendDep = Annotated[Backend, Depends(get_backend)]
BrokerDep = Annotated[Broker, Depends(get_broker)]
TokenDep = Annotated[str, Depends(bearer_token)]
AdminDep = Depends(require_admin)
