import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from api.app import create_app
from api.settings import Settings
from tests.api.conftest import AUTH, metric
from tests.api.fakes import FakeBackend
from tests.api.live import serve, sse_events, take
from tests.factories import record
from tests.support import wait_for
from trainer.contract.records import Quorum


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


def refusal(http: httpx.Client, url: str, **headers: str) -> tuple[int, str]:
    """The status and error detail of opening `url`; a stream that opens is closed at once
    (read whole, it would never end)."""
    with http.stream("GET", url, headers=headers) as response:
        if response.status_code == 200:
            return 200, ""
        return response.status_code, str(json.loads(response.read())["detail"])


def test_the_stream_takes_a_signed_link_and_never_the_token_in_its_url(server) -> None:
    url, _ = server
    with httpx.Client(base_url=url, timeout=20) as http:
        assert http.get("/api/v1/jobs/job-nope/stream", headers=AUTH).status_code == 404
        assert http.post("/api/v1/jobs/job-nope/stream-link", headers=AUTH).status_code == 404
        assert http.get("/api/v1/jobs/job-nope/stream").status_code == 401
        job_id, other = start_job(http), start_job(http)
        path = f"/api/v1/jobs/{job_id}/stream"
        token = AUTH["Authorization"].removeprefix("Bearer ")
        status, detail = refusal(http, f"{path}?token={token}")  # never in a URL
        assert status == 401 and "signed link" in detail
        assert http.post(f"/api/v1/jobs/{job_id}/stream-link").status_code == 401

        link = http.post(f"/api/v1/jobs/{job_id}/stream-link", headers=AUTH).json()
        assert link["url"].startswith(f"{path}?expires=") and token not in link["url"]
        assert 55 <= link["expires_at"] - time.time() <= 61  # stream_link_seconds: 60
        assert http.get(f"/api/v1/jobs/{job_id}", headers=AUTH).json()["links"][
            "stream_link"] == f"/api/v1/jobs/{job_id}/stream-link"
        with http.stream("GET", f"{link['url']}&after=0") as response:  # no header
            assert response.status_code == 200
            assert next(sse_events(response))["data"]["message"] == "job created"

        # The signature covers the job's stream path and the expiry: no other job's stream,
        # no download, no changed expiry.
        for forged in (link["url"].replace(job_id, other),
                       link["url"].replace("/stream?", "/checkpoints/step-1/download?"),
                       link["url"].replace("expires=", "expires=1")):
            assert refusal(http, forged)[0] == 403, forged


def test_an_open_stream_outlives_its_link_and_a_reconnect_takes_a_new_one(settings, backend,
                                                                         ) -> None:
    settings = settings.model_copy(update={"stream_link_seconds": 2})
    with serve(create_app(settings, backend)) as url, \
            httpx.Client(base_url=url, timeout=20) as http:
        job_id = start_job(http)
        link = http.post(f"/api/v1/jobs/{job_id}/stream-link", headers=AUTH).json()
        with http.stream("GET", link["url"]) as response:
            events = sse_events(response)
            created = next(events)
            wait_for(lambda: time.time() > link["expires_at"] + 0.5, timeout=5,
                     what="the link to expire")
            post_metrics(http, backend, job_id, 1, 1)
            assert metric_steps_until(events, 1) == [1]  # the open stream goes on

        # What the browser's own retry would send: the same link, now expired.
        status, detail = refusal(http, link["url"], **{"Last-Event-ID": created["id"]})
        assert status == 403 and "expired" in detail
        fresh = http.post(f"/api/v1/jobs/{job_id}/stream-link", headers=AUTH).json()
        assert fresh["expires_at"] > link["expires_at"]
        with http.stream("GET", fresh["url"], headers={"Last-Event-ID": created["id"]}) as resumed:
            assert metric_steps_until(sse_events(resumed), 1) == [1]  # from where it stopped


def metric_steps_until(events, last_step: int) -> list[int]:
    steps = []
    for event in events:
        if event["event"] == "metric":
            steps.append(event["data"]["step"])
            if steps[-1] == last_step:
                return steps
    raise AssertionError("stream ended early")


def test_slow_client_slows_nobody_and_catches_up(settings: Settings,
                                                 backend: FakeBackend) -> None:
    # Small queues: every batch of 500 overflows them, so the catch-up path surely runs.
    small_queues = settings.model_copy(update={"stream_queue_size": 50})
    with serve(create_app(small_queues, backend)) as url, \
            httpx.Client(base_url=url, timeout=30) as http, \
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


def test_the_replay_reads_history_in_pages_bounded_in_bytes(server, monkeypatch) -> None:
    import api.routes.stream
    from api.services.events import PAGE_BYTES, event_page, json_size

    pages: list[int] = []

    def measured(*args, **kwargs):
        events, next_after = event_page(*args, **kwargs)
        pages.append(sum(json_size(event.data) for event in events))
        return events, next_after

    monkeypatch.setattr(api.routes.stream, "event_page", measured)
    url, backend = server
    with httpx.Client(base_url=url, timeout=30) as http:
        job_id = start_job(http)
        token = next(launch.report_token for launch in backend.launches)
        big = [record(seq, Quorum(message="q" * 9_000, quorum_id=seq, participants=2, step=seq))
               for seq in range(1, 301)]  # 2.7 MB of history
        assert http.post(f"/api/v1/jobs/{job_id}/reports",
                         headers={"Authorization": f"Bearer {token}"},
                         json={"pod": f"{job_id}-0", "incarnation": "i",
                               "records": big}).status_code == 200
        quorums = []
        with http.stream("GET", f"/api/v1/jobs/{job_id}/stream", headers=AUTH) as response:
            for event in sse_events(response):
                if event["data"].get("type") == "quorum":
                    quorums.append(event["data"]["quorum_id"])
                    if quorums[-1] == 300:
                        break
    assert quorums == list(range(1, 301))
    assert len(pages) >= 3 and max(pages) <= PAGE_BYTES
