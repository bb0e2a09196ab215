import threading
from collections.abc import Iterator

import httpx
import pytest

from api.app import create_app
from tests.api.conftest import AUTH, metric
from tests.api.fakes import FakeBackend
from tests.api.live import serve, sse_events, take


@pytest.fixture
def server(settings, backend: FakeBackend) -> Iterator[tuple[str, FakeBackend]]:
    with serve(create_app(settings, backend)) as url:
        yield url, backend


def start_job(http: httpx.Client) -> str:
    response = http.post("/api/v1/jobs", json={}, headers=AUTH)
    assert response.status_code == 201
    return response.json()["id"]


def post_metrics(http: httpx.Client, backend: FakeBackend, job_id: str, first: int,
                 count: int) -> None:
    token = next(launch.report_token for launch in backend.launches if launch.job_id == job_id)
    response = http.post(f"/api/v1/jobs/{job_id}/reports",
                         headers={"Authorization": f"Bearer {token}"},
                         json={"pod": f"{job_id}-0", "incarnation": "i",
                               "records": [metric(first + i, first + i) for i in range(count)]})
    assert response.status_code == 200, response.text


def test_late_client_gets_exactly_the_missed_events_then_live(server) -> None:
    url, backend = server
    with httpx.Client(base_url=url, timeout=20) as http:
        job_id = start_job(http)
        post_metrics(http, backend, job_id, 1, 5)
        history = http.get(f"/api/v1/jobs/{job_id}/events", headers=AUTH).json()["data"]
        seen = history[2]["id"]
        headers = {**AUTH, "Last-Event-ID": str(seen)}
        with http.stream("GET", f"/api/v1/jobs/{job_id}/stream", headers=headers) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            events = sse_events(response)
            missed = take(events, len(history) - 3)
            assert [int(e["id"]) for e in missed] == [e["id"] for e in history[3:]]
            assert {e["event"] for e in missed} <= {"job", "metric"}
            post_metrics(http, backend, job_id, 6, 1)
            live = next(events)
            assert live["event"] == "metric" and live["data"]["step"] == 6
            assert int(live["id"]) > int(missed[-1]["id"])


def test_token_query_parameter_and_unknown_job(server) -> None:
    url, _ = server
    with httpx.Client(base_url=url, timeout=20) as http:
        assert http.get("/api/v1/jobs/job-nope/stream", headers=AUTH).status_code == 404
        assert http.get("/api/v1/jobs/job-nope/stream").status_code == 401
        job_id = start_job(http)
        token = AUTH["Authorization"].removeprefix("Bearer ")
        with http.stream("GET", f"/api/v1/jobs/{job_id}/stream?token={token}") as response:
            assert response.status_code == 200
            assert next(sse_events(response))["data"]["message"] == "job created"


def metric_steps_until(events, last_step: int) -> list[int]:
    steps = []
    for event in events:
        if event["event"] == "metric":
            steps.append(event["data"]["step"])
            if steps[-1] == last_step:
                return steps
    raise AssertionError("stream ended early")


def test_slow_client_slows_nobody_and_catches_up(server, monkeypatch) -> None:
    import api.broker

    # Small queues: every batch of 500 overflows them, so the catch-up path surely runs.
    monkeypatch.setattr(api.broker, "QUEUE_SIZE", 50)
    url, backend = server
    with httpx.Client(base_url=url, timeout=30) as http, \
            httpx.Client(base_url=url, timeout=30) as slow_http:
        job_id = start_job(http)
        stream_url = f"/api/v1/jobs/{job_id}/stream"
        with slow_http.stream("GET", stream_url, headers=AUTH) as slow:
            slow_events = sse_events(slow)
            next(slow_events)  # connected; it now stops reading while 3,000 events arrive
            for first in range(1, 3001, 500):  # would time out if ingestion waited for it
                post_metrics(http, backend, job_id, first, 500)
            with http.stream("GET", stream_url, headers=AUTH) as fast:
                assert metric_steps_until(sse_events(fast), 3000) == list(range(1, 3001))
            assert metric_steps_until(slow_events, 3000) == list(range(1, 3001))


def test_concurrent_writers_lose_no_event_on_the_stream(server) -> None:
    """Reports and kills write events from different threads: the stream gets every one."""
    url, backend = server
    with httpx.Client(base_url=url, timeout=30) as http:
        job_id = start_job(http)
        with http.stream("GET", f"/api/v1/jobs/{job_id}/stream", headers=AUTH) as response:
            events = sse_events(response)
            next(events)

            def report() -> None:
                with httpx.Client(base_url=url, timeout=30) as client:
                    for step in range(1, 301):
                        post_metrics(client, backend, job_id, step, 1)

            def kill() -> None:
                with httpx.Client(base_url=url, timeout=30, headers=AUTH) as client:
                    for _ in range(150):
                        assert client.post(f"/api/v1/jobs/{job_id}/pods/0/kill").status_code \
                            == 202

            threads = [threading.Thread(target=report), threading.Thread(target=kill)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            stored, after = [], 0
            while page := http.get(f"/api/v1/jobs/{job_id}/events", headers=AUTH,
                                   params={"after": after, "limit": 1000}).json()["data"]:
                stored += [e["id"] for e in page]
                after = stored[-1]
            received = []
            for event in events:
                received.append(int(event["id"]))
                if received[-1] == stored[-1]:
                    break
            first = stored.index(received[0])
            assert received == stored[first:]
