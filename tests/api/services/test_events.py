"""One event path: slow backend work never holds up another job's events."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from api.app import create_app
from api.reconciler import Reconciler
from api.settings import Settings
from tests.api.conftest import AUTH
from tests.api.fakes import FakeBackend
from tests.api.live import serve, sse_events
from tests.api.routes.test_stream import post_metrics, start_job


class SlowDeletes(FakeBackend):
    """Deleting a workload blocks until the test lets it finish (a slow Kubernetes API)."""

    def __init__(self) -> None:
        super().__init__()
        self.deleting, self.release = threading.Event(), threading.Event()

    def delete(self, job_id: str) -> None:
        self.deleting.set()
        assert self.release.wait(timeout=30), "the test never released the deletion"
        super().delete(job_id)


@pytest.fixture
def backend() -> SlowDeletes:
    return SlowDeletes()


def test_a_blocked_workload_deletion_holds_up_no_other_job(settings: Settings,
                                                          backend: SlowDeletes) -> None:
    app = create_app(settings, backend)
    with serve(app) as url, httpx.Client(base_url=url, timeout=5) as http:
        finishing, busy = start_job(http), start_job(http)
        backend.finish(finishing, reason="pod x failed: bad input")
        reconciler = Reconciler(app.state.engine, settings, backend, app.state.events)
        pass_ = threading.Thread(target=reconciler.reconcile_once)
        pass_.start()
        try:
            assert backend.deleting.wait(timeout=10)
            # While the first job's workload is being deleted, the other job's reports are
            # stored and streamed at once (a 5 s client timeout fails the test otherwise).
            with http.stream("GET", f"/api/v1/jobs/{busy}/stream", headers=AUTH) as response:
                events: Iterator[dict] = sse_events(response)
                post_metrics(http, backend, busy, 1, 1)
                live = next(e for e in events if e["event"] == "metric")
                assert live["data"]["step"] == 1
            kill = http.post(f"/api/v1/jobs/{busy}/pods/0/kill", headers=AUTH)
            assert kill.status_code == 202
            assert not backend.release.is_set() and pass_.is_alive()
        finally:
            backend.release.set()
            pass_.join(timeout=30)
        assert not pass_.is_alive()
        assert http.get(f"/api/v1/jobs/{finishing}", headers=AUTH).json()["status"] == "failed"
