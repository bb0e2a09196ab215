import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from tests.factories import metric_data
from tests.support import ReportServer, wait_for
from trainer.contract.records import CheckpointSaved, Kind, RecordData, Started
from trainer.report import HttpSink, JsonlSink, Reporter, trust


class Loose(RecordData):
    """Record data the contract would refuse (any float at all): what a bug could emit."""

    KIND: ClassVar[Kind] = "metric"
    value: float


@pytest.fixture
def server() -> Iterator[ReportServer]:
    instance = ReportServer()  # started by each test: some post before anyone listens
    yield instance
    instance.stop()


def reporter_for(server: ReportServer, **options: object) -> tuple[Reporter, HttpSink]:
    reporter = Reporter("job-0", "inc-1")
    sink = HttpSink(server.url, "secret", "job-0", "inc-1", interval=0.05, **options)
    reporter.sinks = [sink]
    return reporter, sink


def test_server_down_then_up_loses_nothing_and_keeps_order(server: ReportServer) -> None:
    reporter, sink = reporter_for(server)
    for step in range(1, 301):
        reporter.emit(metric_data(step))
    assert not sink.flush(timeout=0.3)  # nobody listening yet: still pending
    server.start()
    for step in range(301, 501):
        reporter.emit(metric_data(step))
    assert sink.flush(timeout=20)
    reporter.close()
    records = server.records()
    assert [r["data"]["step"] for r in records] == list(range(1, 501))
    assert [r["seq"] for r in records] == list(range(1, 501))
    assert all(h == "Bearer secret" for h in server.headers)


def test_retried_batches_are_deduplicated_by_seq(server: ReportServer) -> None:
    server.start()
    server.status = 503
    reporter, sink = reporter_for(server)
    for step in range(20):
        reporter.emit(metric_data(step))
    wait_for(lambda: len(server.headers) >= 2)  # refused and retried
    server.status = 200
    assert sink.flush(timeout=20)
    reporter.close()
    assert len(server.records()) == 20


def test_emit_never_waits_for_a_hanging_server(server: ReportServer) -> None:
    server.release.clear()  # every request hangs until released
    server.start()
    reporter, sink = reporter_for(server)
    reporter.emit(metric_data(0))
    wait_for(lambda: sink._buffer and sink.flush(0) is False)
    for step in range(1, 5001):  # would block (and time out the test) if emit waited
        reporter.emit(metric_data(step))
    server.release.set()
    assert sink.flush(timeout=30)
    reporter.close()
    assert len(server.records()) == 5001


def test_overflow_drops_only_metrics_and_counts_them(server: ReportServer) -> None:
    reporter, sink = reporter_for(server, capacity=100)
    reporter.emit(Started(message="go", step=0, epoch=1, samples={}))
    for step in range(300):
        reporter.emit(metric_data(step))
    reporter.emit(CheckpointSaved(step=300, epoch=1, path="step-300", size_bytes=1,
                                   epoch_end=False, val_accuracy=None))
    server.start()
    assert sink.flush(timeout=20)
    reporter.close()
    kinds = [r["kind"] for r in server.records()]
    assert kinds[0] == "event" and kinds[-1] == "checkpoint"
    dropped = sum(batch["dropped"] for batch in server.batches)
    assert dropped > 0 and len(kinds) + dropped == 302
    steps = [r["data"]["step"] for r in server.records() if r["kind"] == "metric"]
    assert steps == sorted(steps) and steps[-1] == 299  # the newest metrics survive


def test_rejected_reports_are_not_retried_forever(server: ReportServer) -> None:
    server.start()
    server.status = 403
    reporter, sink = reporter_for(server)
    reporter.emit(metric_data(1))
    assert sink.flush(timeout=20)
    reporter.close()
    assert len(server.headers) == 1


def test_idle_sink_sends_heartbeats(server: ReportServer) -> None:
    server.start()
    reporter, _ = reporter_for(server, heartbeat_interval=0.1)
    wait_for(lambda: len(server.batches) >= 2)
    reporter.close()
    assert all(batch["records"] == [] for batch in server.batches)


def test_jsonl_sink_stamps_pod_and_appends(tmp_path: Path) -> None:
    path = tmp_path / "reports.jsonl"
    for pod in ("job-0", "job-1"):
        reporter = Reporter(pod, "i", [JsonlSink(path, pod, "i")])
        reporter.emit(metric_data(1))
        reporter.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    data = metric_data(1).model_dump(mode="json")
    assert [(line["pod"], line["seq"], line["kind"], line["data"]) for line in lines] == [
        ("job-0", 1, "metric", data), ("job-1", 1, "metric", data)]


def test_a_record_without_json_is_dropped_and_later_ones_are_delivered(
        server: ReportServer, tmp_path: Path) -> None:
    server.start()
    reporter, sink = reporter_for(server)
    lines = JsonlSink(tmp_path / "reports.jsonl", "job-0", "inc-1")
    reporter.sinks.append(lines)
    reporter.emit(metric_data(1))
    reporter.emit(Loose(value=float("nan")))  # JSON has no NaN: the API would refuse it
    reporter.emit(Loose(value=float("-inf")))
    for step in range(2, 6):
        reporter.emit(metric_data(step))
    assert sink.flush(timeout=20)
    reporter.close()
    assert [r["seq"] for r in server.records()] == [1, 4, 5, 6, 7]
    assert [r["data"]["step"] for r in server.records()] == [1, 2, 3, 4, 5]
    assert sink.unserializable == lines.unserializable == 2
    assert len((tmp_path / "reports.jsonl").read_text().splitlines()) == 5


class FailsOnce(httpx.HTTPTransport):
    """A real transport whose first request fails in a way no HTTP error does."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if not self.failed:
            self.failed = True
            raise RuntimeError("something nobody expected")
        return super().handle_request(request)


def test_the_sender_outlives_an_unexpected_error(server: ReportServer) -> None:
    server.start()
    transport = FailsOnce()
    reporter, sink = reporter_for(server, client=httpx.Client(transport=transport))
    reporter.emit(metric_data(1))
    assert sink.flush(timeout=20)
    reporter.close()
    assert transport.failed and [r["seq"] for r in server.records()] == [1]


def test_an_ending_pod_waits_for_a_restarting_control_plane(server: ReportServer) -> None:
    """close() keeps the buffer until the control plane is back (within `drain_seconds`): a
    pod that ends while the API restarts loses no report."""
    reporter, sink = reporter_for(server, drain_seconds=120.0)
    for step in range(1, 51):
        reporter.emit(metric_data(step))
    closer = threading.Thread(target=reporter.close)
    closer.start()
    assert not sink.flush(timeout=0.5) and closer.is_alive()  # nobody listening: it waits
    server.start()
    closer.join(timeout=60)
    assert not closer.is_alive()
    assert [r["data"]["step"] for r in server.records()] == list(range(1, 51))


def test_past_its_drain_an_ending_pod_says_what_it_lost(
        server: ReportServer, caplog: pytest.LogCaptureFixture) -> None:
    reporter, _ = reporter_for(server, drain_seconds=0.3)
    for step in range(1, 8):
        reporter.emit(metric_data(step))
    reporter.close()
    assert "7 report records not delivered" in caplog.text


def test_every_report_client_of_a_process_shares_one_trust_store(
        server: ReportServer) -> None:
    """Built once (tens of ms on 2 cores), by a standby before it becomes a pod."""
    sinks = [HttpSink(server.url, "secret", f"job-{i}", "inc-1") for i in range(2)]
    try:
        contexts = [sink._client._transport._pool._ssl_context  # type: ignore[attr-defined]
                    for sink in sinks]
        assert contexts[0] is contexts[1] is trust()
    finally:
        for sink in sinks:
            sink.close(timeout=0)
