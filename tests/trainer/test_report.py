import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.factories import metric_data
from trainer.contract.records import CheckpointSaved, Started
from trainer.report import HttpSink, JsonlSink, Reporter


class ReportServer:
    """A real HTTP server on 127.0.0.1 that records report batches (status is settable)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.batches: list[dict] = []
        self.status = 200
        self.release = threading.Event()
        self.release.set()
        self.headers: list[str] = []
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                owner.release.wait(30)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.headers.append(self.headers.get("Authorization", ""))
                if owner.status == 200:
                    owner.batches.append(body)
                self.send_response(owner.status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1/jobs/j/reports"

    def records(self) -> list[dict]:
        """Records after server-side dedup on (pod, incarnation, seq), in arrival order."""
        seen, unique = set(), []
        for batch in self.batches:
            for record in batch["records"]:
                key = (batch["pod"], batch["incarnation"], record["seq"])
                if key not in seen:
                    seen.add(key)
                    unique.append(record)
        return unique


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.02)


@pytest.fixture
def server() -> Iterator[ReportServer]:
    instance = ReportServer(free_port())
    yield instance
    instance.release.set()
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
