"""Dependencies shared by the routes, each an Annotated alias defined once.

Every object the app shares (set on `app.state` at start-up) reaches a route through one of
these, never through `request.app.state`: `shared(name)` is the one way in. Two exceptions: the
route classes of api/auth.py, which authenticate before FastAPI resolves any dependency, and
the reports route, the API's hot path, which parses its body by hand and reads its writer
directly.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy.engine import Engine
from sqlmodel import Session

from api.auth import LinkSigner, ReportTokens
from api.backends.base import Backend
from api.broker import Broker
from api.db import session_scope
from api.services.events import EventLog
from api.services.login import LoginCodes
from api.services.registry import Predictor
from api.settings import Settings


def shared(name: str) -> Callable[[Request], Coroutine[Any, Any, Any]]:
    """A dependency that gives the app's shared object `name` (its type is the alias's).
    Async, so FastAPI calls it in the event loop rather than handing it to its thread pool."""

    async def dependency(request: Request) -> Any:
        return getattr(request.app.state, name)

    dependency.__name__ = f"shared_{name}"
    return dependency


EngineDep = Annotated[Engine, Depends(shared("engine"))]


def get_session(engine: EngineDep) -> Iterator[Session]:
    with session_scope(engine) as session:
        yield session


async def get_admin_token(request: Request) -> str:
    value: str = request.app.state.admin_token.value
    return value


SettingsDep = Annotated[Settings, Depends(shared("settings"))]
SessionDep = Annotated[Session, Depends(get_session)]
BackendDep = Annotated[Backend, Depends(shared("backend"))]
BrokerDep = Annotated[Broker, Depends(shared("broker"))]
EventsDep = Annotated[EventLog, Depends(shared("events"))]
ReportTokensDep = Annotated[ReportTokens, Depends(shared("report_tokens"))]
PredictorDep = Annotated[Predictor, Depends(shared("predictor"))]
LoginCodesDep = Annotated[LoginCodes, Depends(shared("login_codes"))]
LinkSignerDep = Annotated[LinkSigner, Depends(shared("link_signer"))]
AdminTokenDep = Annotated[str, Depends(get_admin_token)]
"""The admin token's value."""
