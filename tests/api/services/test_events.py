"""One event path: appends publish committed events in each job's id order, and slow backend
work never holds up another job's events."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from api.app import create_app
from api.db import session_scope
from api.models import Event
from api.reconciler import Reconciler
from api.services.events import EventLog, EventOrderError, new_event
from api.settings import Settings
from tests.api.conftest import AUTH, create_job
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


def appended_ids(engine: Engine, job_id: str) -> list[int]:
    with session_scope(engine) as session:
        return [e.id for e in session.exec(select(Event).where(Event.job_id == job_id)
                                           .order_by(col(Event.id))) if e.id is not None]


def test_appends_publish_committed_events_in_each_jobs_id_order(client: TestClient) -> None:
    engine: Engine = client.app.state.engine  # type: ignore[attr-defined]
    jobs = [create_job(client)["id"] for _ in range(2)]
    published: dict[str, list[int]] = {job_id: [] for job_id in jobs}
    unseen: list[int] = []

    def publish(job_id: str, items: list[dict]) -> None:
        ids = [item["id"] for item in items]
        with session_scope(engine) as other:  # another connection sees them: committed
            found = set(other.exec(select(Event.id).where(col(Event.id).in_(ids))))
        unseen.extend(set(ids) - found)
        published[job_id] += ids

    log = EventLog(publish)

    def writer(job_id: str) -> None:
        for n in range(15):
            with session_scope(engine) as session, log.append(session) as appending:
                appending.add(new_event(job_id, "log", message=f"{n}a"),
                              new_event(job_id, "log", message=f"{n}b"))

    threads = [threading.Thread(target=writer, args=(job_id,)) for job_id in jobs * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert unseen == []
    for job_id in jobs:
        assert len(published[job_id]) == 60
        assert published[job_id] == sorted(published[job_id])  # in id order, none twice
        assert set(published[job_id]) <= set(appended_ids(engine, job_id))


def test_an_append_that_would_go_back_in_a_jobs_stream_is_refused(client: TestClient) -> None:
    engine: Engine = client.app.state.engine  # type: ignore[attr-defined]
    job_id = create_job(client)["id"]
    created = appended_ids(engine, job_id)
    published: list[int] = []
    log = EventLog(lambda _, items: published.extend(item["id"] for item in items))

    def append(event_id: int, guard: Callable[[], bool] | None = None) -> bool:
        event = new_event(job_id, "log", message=str(event_id))
        event.id = event_id
        with session_scope(engine) as session, log.append(session, guard) as appending:
            appending.add(event)
        return appending.committed

    assert append(1_000_000)
    with pytest.raises(EventOrderError, match="would be published after event 1000000"):
        append(999_999)  # a stream that was sent 1000000 would skip it
    assert not append(1_000_001, guard=lambda: False)  # its guard said no: rolled back
    assert published == [1_000_000]
    assert appended_ids(engine, job_id) == [*created, 1_000_000]
    with pytest.raises(ZeroDivisionError), session_scope(engine) as session, \
            log.append(session) as appending:
        appending.add(new_event(job_id, "log", message="never"))
        raise ZeroDivisionError  # an error in the block: nothing committed or published
    assert published == [1_000_000]
    assert appended_ids(engine, job_id) == [*created, 1_000_000]
    assert append(1_000_002)
    assert published == [1_000_000, 1_000_002]
