"""Prometheus metrics of the control plane."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.engine import Engine
from sqlmodel import Session, func, select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REPORTS_INGESTED = Counter("migrator_report_records_ingested_total",
                           "Trainer report records stored")
REQUEST_LATENCY = Histogram("migrator_http_request_duration_seconds", "HTTP request latency",
                            ["method", "route", "status"])


class StateCollector(Collector):
    """Jobs by status (read from the database at scrape time) and connected SSE clients."""

    def __init__(self, engine: Engine, clients: Callable[[], int]) -> None:
        self.engine, self.clients = engine, clients

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from api.models import Job, JobStatus

        jobs = GaugeMetricFamily("migrator_jobs", "Jobs by status", labels=["status"])
        with Session(self.engine) as session:
            counts = dict(session.exec(select(Job.status, func.count()).group_by(Job.status)).all())
        for status in JobStatus:
            jobs.add_metric([status.value], counts.get(status, 0))
        yield jobs
        yield GaugeMetricFamily("migrator_sse_clients", "Connected event-stream clients",
                                value=self.clients())


_collector: StateCollector | None = None


def install_collector(engine: Engine, clients: Callable[[], int]) -> None:
    """(Re)point the one registered collector at this app's engine and broker."""
    global _collector
    if _collector is None:
        _collector = StateCollector(engine, clients)
        REGISTRY.register(_collector)
    else:
        _collector.engine, _collector.clients = engine, clients


class LatencyMiddleware:
    """Request latency by route template; plain ASGI, so it adds no task or stream per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            REQUEST_LATENCY.labels(scope["method"], path, str(status)).observe(
                time.perf_counter() - start)
