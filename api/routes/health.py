"""Liveness, readiness and Prometheus metrics (no token: for probes and scrapers)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from api.deps import BackendDep, EngineDep
from api.errors import BackendUnavailable

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(engine: EngineDep, backend: BackendDep) -> dict[str, str]:
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        raise BackendUnavailable(f"database unavailable: {type(exc).__name__}") from None
    return {"status": "ready", "backend": backend.name}


@router.get("/metrics", response_class=Response)
def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
