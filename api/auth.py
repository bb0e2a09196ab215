"""Who may call what, decided before a request's body is read.

FastAPI reads a body before it runs a route's dependencies, so a dependency alone would read
(and parse) a stranger's body first. Each router therefore takes one of the route classes
below, which authenticate in front of FastAPI's handler; each class also adds to its routes
the dependency that declares its scheme in OpenAPI (it checks nothing: the class has).

- `AdminRoute`: the admin token as a bearer header.
- `LinkRoute` (downloads, the event stream): the same, or a signed link (an HMAC of the path and
  an expiry) for what cannot send a header (a browser's download, an EventSource), so the admin
  token never sits in a URL, a browser history or a proxy log.
- `ReportRoute`: the job's own report token (its hash cached: reports are the hot path).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, ClassVar

from fastapi import Depends, Query, Request, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool

from api.errors import Forbidden, Unauthorized
from api.models import Job

ADMIN = "admin"
"""`request.state.principal` of a request made with the admin token."""
LINK_SECONDS = 300
"""How long a signed download link works."""

# Read by LinkRoute before the handler; handlers declare them so that OpenAPI shows them.
Expires = Annotated[int | None, Query(description="Expiry of a signed link (Unix time)")]
Signature = Annotated[str | None, Query(max_length=128, description="Signature of the link")]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer(request: Request) -> str | None:
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return credentials.strip() or None if scheme.lower() == "bearer" else None


class LinkSigner:
    """Signed, expiring URLs: `path?expires=T&signature=HMAC(path, T)`, good for that path only
    (a download link opens no stream, a job's stream link no other job's)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _signature(self, path: str, expires: int) -> str:
        return hmac.new(self._key, f"{path}\n{expires}".encode(), hashlib.sha256).hexdigest()

    def sign(self, path: str, seconds: int = LINK_SECONDS) -> tuple[str, int]:
        """The signed URL of `path` and its expiry (Unix time), `seconds` from now or a little
        more (never less: the expiry is a whole second)."""
        expires = math.ceil(time.time() + seconds)
        return f"{path}?expires={expires}&signature={self._signature(path, expires)}", expires

    def verify(self, path: str, expires: str | None, signature: str | None) -> bool:
        if not (expires and expires.isdigit() and signature) or int(expires) < time.time():
            return False
        return hmac.compare_digest(signature, self._signature(path, int(expires)))


class ReportTokens:
    """Report-token hashes by job, read from the database once (a job's token never changes)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._hashes: dict[str, str] = {}
        self._lock = threading.Lock()

    def _load(self, job_id: str) -> str | None:
        with self.engine.connect() as connection:
            found: str | None = connection.execute(
                select(Job.report_token_hash).where(Job.id == job_id)).scalar()  # type: ignore[call-overload]
        if found is not None:
            with self._lock:
                self._hashes[job_id] = found
        return found

    async def verify(self, job_id: str, token: str) -> bool:
        expected = self._hashes.get(job_id) or await run_in_threadpool(self._load, job_id)
        # An unknown job and a wrong token answer alike: nobody learns which job ids exist.
        return expected is not None and hmac.compare_digest(hash_token(token), expected)

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._hashes.pop(job_id, None)


def is_admin(request: Request, token: str | None) -> bool:
    expected: str = request.app.state.admin_token.value
    return token is not None and hmac.compare_digest(token.encode(), expected.encode())


def require_admin_token(request: Request, token: str | None) -> None:
    if token is None:
        raise Unauthorized("missing bearer token")
    if not is_admin(request, token):
        raise Forbidden("invalid token")
    request.state.principal = ADMIN


Handler = Callable[[Request], Coroutine[Any, Any, Response]]

admin_scheme = HTTPBearer(auto_error=False, scheme_name="AdminToken",
                          description="The admin token")
report_scheme = HTTPBearer(auto_error=False, scheme_name="ReportToken",
                           description="The job's report token (handed to its pods)")
BearerCredentials = HTTPAuthorizationCredentials | None


def admin_documented(_: Annotated[BearerCredentials, Depends(admin_scheme)]) -> None:
    """OpenAPI: the admin token as a bearer header."""


def report_documented(_: Annotated[BearerCredentials, Depends(report_scheme)]) -> None:
    """OpenAPI: the job's report token as a bearer header."""


class _AuthenticatedRoute(APIRoute):
    documented: ClassVar[Callable[..., None]]
    """The dependency that declares the route's scheme in OpenAPI."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        kwargs["dependencies"] = [Depends(type(self).documented),
                                  *(kwargs.get("dependencies") or [])]
        super().__init__(path, endpoint, **kwargs)

    async def authenticate(self, request: Request) -> None:
        raise NotImplementedError

    def get_route_handler(self) -> Handler:
        handle = super().get_route_handler()

        async def authenticated(request: Request) -> Response:
            await self.authenticate(request)
            return await handle(request)

        return authenticated


class AdminRoute(_AuthenticatedRoute):
    documented = admin_documented

    async def authenticate(self, request: Request) -> None:
        require_admin_token(request, bearer(request))


class LinkRoute(_AuthenticatedRoute):
    documented = admin_documented  # a signed link's query parameters are the handlers'

    async def authenticate(self, request: Request) -> None:
        token = bearer(request)
        if token is None:
            signer: LinkSigner = request.app.state.link_signer
            query = request.query_params
            if not query.get("signature"):
                raise Unauthorized("missing bearer token or signed link")
            if not signer.verify(request.url.path, query.get("expires"), query.get("signature")):
                raise Forbidden("the link is invalid or has expired: ask for a new one")
            request.state.principal = ADMIN
            return
        require_admin_token(request, token)


class ReportRoute(_AuthenticatedRoute):
    documented = report_documented

    async def authenticate(self, request: Request) -> None:
        token = bearer(request)
        if token is None:
            raise Unauthorized("missing bearer token")
        job_id = str(request.path_params["job_id"])
        tokens: ReportTokens = request.app.state.report_tokens
        if not await tokens.verify(job_id, token):
            raise Forbidden(f"this report token is not valid for job {job_id}")
        request.state.principal = f"reporter:{job_id}"
