"""The FastAPI application: routers, error mapping, lifespan (database, backend, reconciler)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api.backends.base import Backend
from api.broker import Broker
from api.db import init_db, make_engine
from api.errors import add_exception_handlers
from api.metrics import LatencyMiddleware, install_collector
from api.reconciler import Reconciler
from api.routes import checkpoints, health, jobs, models, pods, reports, stream
from api.routes.web import mount_web
from api.services.models import Predictor
from api.services.reports import ReportWriter
from api.settings import Settings

logger = logging.getLogger(__name__)

TOKEN_FILE = "admin_token"


def admin_token(settings: Settings) -> str:
    """The configured token, else the one generated on first start and kept in the data dir."""
    if settings.admin_token:
        return settings.admin_token
    path = settings.data_dir / TOKEN_FILE
    if path.is_file():
        return path.read_text().strip()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token


def make_backend(settings: Settings) -> Backend:
    if settings.backend == "local":
        from api.backends.local import LocalBackend

        return LocalBackend(settings.jobs_dir, max_restarts=settings.restart_budget,
                            restart_backoff=settings.restart_backoff)
    from api.backends.kubernetes import KubernetesBackend

    return KubernetesBackend.from_settings(settings)


def create_app(settings: Settings | None = None, backend: Backend | None = None) -> FastAPI:
    settings = settings or Settings()
    engine = make_engine(settings)
    broker = Broker()
    chosen = backend or make_backend(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        init_db(engine)
        broker.bind(asyncio.get_running_loop())
        install_collector(engine, lambda: broker.clients)
        writer = ReportWriter(engine, broker.publish, broker.ordering)
        app.state.report_writer = writer
        writer.start()
        reconciler = Reconciler(engine, settings, chosen, broker.publish, broker.ordering)
        reconciler.start()
        # Everything loaded so far (torch among it) lives as long as the process: keep it out of
        # the collector's full passes, whose pauses otherwise set the API's tail latency.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            broker.close()
            await reconciler.stop()
            writer.stop()
            engine.dispose()
            close = getattr(chosen, "close", None)
            if backend is None and close is not None:
                close()  # a backend the app made (the Kubernetes one holds a watch thread)

    app = FastAPI(title="Live Migrator", version="0.1.0", lifespan=lifespan,
                  description="Fault-tolerant distributed fine-tuning of BERT-family sentiment "
                              "classifiers.")
    app.state.settings = settings
    app.state.engine = engine
    app.state.broker = broker
    app.state.backend = chosen
    app.state.admin_token = admin_token(settings)
    app.state.predictor = Predictor(settings.predict_cache_size)
    add_exception_handlers(app)
    app.add_middleware(LatencyMiddleware)
    for module in (jobs, pods, reports, stream, checkpoints, models):
        app.include_router(module.router)
    app.include_router(health.router)
    mount_web(app)
    return app


