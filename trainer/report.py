"""Reports from the trainer: a sink interface with no-op, JSON-lines and HTTP implementations.

What a record holds is the contract's (trainer.contract.records): the Reporter stamps typed
record data with (seq, kind, time) and hands the JSON form to every sink.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import ssl
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from trainer.contract.records import RecordData

logger = logging.getLogger(__name__)

Record = dict[str, Any]
DROPPABLE = "metric"
DRAIN_NOTICE = 30.0
"""Seconds between the notices of an ending pod still waiting to deliver its reports."""


def encode(record: Record) -> str | None:
    """`record` as strict JSON; None, logged, where it has none: a NaN or an infinity, which
    JSON lacks and the API refuses, or an object that JSON cannot hold. Dropping it costs one
    record; sending it would cost every later one (its batch refused again and again)."""
    try:
        return json.dumps(record, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        logger.error("report record %s (%s) dropped: not JSON (%s)", record.get("seq"),
                     record.get("kind"), exc)
        return None


class MetricsSink(Protocol):
    def write(self, record: Record) -> None:
        """Accept one record; must return at once."""

    def flush(self, timeout: float = 0.0) -> bool:
        """Ask for delivery now; wait up to `timeout` seconds; True when nothing is pending."""

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is pending (waiting up to `timeout`; None: the sink's own bound) and
        release resources."""


class NullSink:
    def write(self, record: Record) -> None:
        pass

    def flush(self, timeout: float = 0.0) -> bool:
        return True

    def close(self, timeout: float | None = None) -> None:
        pass


class JsonlSink:
    """Every record as one JSON line, stamped with its pod; several processes may share a file."""

    def __init__(self, path: Path, pod: str, incarnation: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._stamp = {"pod": pod, "incarnation": incarnation}
        self.unserializable = 0
        """Records dropped because they had no JSON form."""
        # One os.write per line on an O_APPEND descriptor: lines of processes never interleave.
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, record: Record) -> None:
        line = encode({**self._stamp, **record})
        if line is None:
            self.unserializable += 1
            return
        os.write(self._fd, (line + "\n").encode())

    def flush(self, timeout: float = 0.0) -> bool:
        return True

    def close(self, timeout: float | None = None) -> None:
        os.close(self._fd)


class HeartbeatFile:
    """Touches a file at most once per `interval` while records flow: an age a probe can read.

    Kubernetes' readiness probe checks the file's age (the trainer serves no HTTP), so a pod is
    ready while it trains and reports, and not while it loads, heals or hangs.
    """

    def __init__(self, path: Path, interval: float = 1.0) -> None:
        self.path, self.interval = path, interval
        self._last: float | None = None
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: Record) -> None:
        now = time.monotonic()
        if self._last is not None and now - self._last < self.interval:
            return
        self._last = now
        try:
            self.path.touch()
        except OSError as exc:  # a probe failing beats a training step failing
            logger.warning("heartbeat file %s not touched: %s", self.path, exc)

    def flush(self, timeout: float = 0.0) -> bool:
        return True

    def close(self, timeout: float | None = None) -> None:
        pass


@dataclass(frozen=True)
class _Encoded:
    """A record waiting to be sent, in the JSON it is sent as."""

    seq: int
    kind: str
    text: str


@functools.cache
def trust() -> ssl.SSLContext:
    """The certificates a report client trusts, as httpx builds them by default (certifi, or
    SSL_CERT_FILE / SSL_CERT_DIR), built once per process: 30-60 ms each time on 2 cores. A
    standby builds it while it waits, not once it has become a pod its peers wait for."""
    return httpx.create_ssl_context()


class HttpSink:
    """Posts batches from a background thread; retries with backoff, buffers while unreachable.

    Records are encoded as they are written: one without a JSON form is dropped there (logged
    and counted), and nothing ends the thread, so later records are always delivered.
    """

    def __init__(self, url: str, token: str, pod: str, incarnation: str, *,
                 interval: float = 1.0, heartbeat_interval: float = 5.0, capacity: int = 50_000,
                 max_batch: int = 1_000, drain_seconds: float = 10.0,
                 client: httpx.Client | None = None) -> None:
        self.url, self.pod, self.incarnation = url, pod, incarnation
        self.drain_seconds = drain_seconds
        """How long `close` waits, by default, for the buffer to be delivered."""
        self.interval, self.heartbeat_interval = interval, heartbeat_interval
        self.capacity, self.max_batch = capacity, max_batch
        self._client = client or httpx.Client(
            timeout=httpx.Timeout(5.0), headers={"Authorization": f"Bearer {token}"},
            verify=trust())
        self._buffer: deque[_Encoded] = deque()
        self._lock = threading.Condition()
        self._wake = threading.Event()
        self._stopping = False
        self._dropped = 0
        self._last_post = 0.0
        self.delivered = 0
        self.finish_after_epoch: int | None = None
        """The epoch after which the control plane asked the job to finish early, from its
        replies (trainer.finish)."""
        self.unserializable = 0
        """Records dropped because they had no JSON form."""
        self._thread = threading.Thread(target=self._run, name="report-sender", daemon=True)
        self._thread.start()

    def write(self, record: Record) -> None:
        text = encode(record)
        with self._lock:
            if text is None:
                self.unserializable += 1
                return
            self._buffer.append(_Encoded(record["seq"], record["kind"], text))
            if len(self._buffer) > self.capacity:
                self._shed()

    def _shed(self) -> None:
        """Drop the oldest half of the metric records; events and checkpoints are never dropped."""
        metrics = sum(1 for r in self._buffer if r.kind == DROPPABLE)
        to_drop = max(metrics // 2, 1) if metrics else 0
        kept: deque[_Encoded] = deque()
        for record in self._buffer:
            if to_drop and record.kind == DROPPABLE:
                to_drop -= 1
                self._dropped += 1
                continue
            kept.append(record)
        self._buffer = kept
        logger.warning("report buffer full: %d metric records dropped so far", self._dropped)

    def flush(self, timeout: float = 0.0) -> bool:
        self._wake.set()
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._buffer and time.monotonic() < deadline:
                self._lock.wait(deadline - time.monotonic())
            return not self._buffer

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is buffered (waiting up to `timeout`, default `drain_seconds`, for an
        unreachable control plane, saying so every 30 s), then stop."""
        deadline = time.monotonic() + (self.drain_seconds if timeout is None else timeout)
        while not self.flush(min(DRAIN_NOTICE, max(deadline - time.monotonic(), 0.0))):
            if time.monotonic() >= deadline:
                logger.error("%d report records not delivered: the control plane did not take "
                             "them in time", len(self._buffer))
                break
            logger.warning("waiting up to %.0f s more for the control plane to take %d report "
                           "records", deadline - time.monotonic(), len(self._buffer))
        with self._lock:
            self._stopping = True
        self._wake.set()
        self._thread.join(timeout=1.0)
        self._client.close()

    def _run(self) -> None:
        backoff = 0.0
        while True:
            self._wake.wait(timeout=backoff or self.interval)
            self._wake.clear()
            try:
                after = self._send(backoff)
            except Exception:  # nothing may end this thread: the job would go on unheard
                logger.exception("reports not sent: unexpected error; will retry")
                after = min(max(backoff * 2, 0.2), 5.0)
            if after is None:
                return
            backoff = after

    def _send(self, backoff: float) -> float | None:
        """Post the next batch (or a heartbeat when due); the backoff before the next try, or
        None once the sink is closed."""
        with self._lock:
            if self._stopping:
                return None
            batch = [self._buffer[i] for i in range(min(len(self._buffer), self.max_batch))]
            dropped = self._dropped
        idle = time.monotonic() - self._last_post >= self.heartbeat_interval
        if not batch and not idle:
            return backoff
        outcome = self._post(batch, dropped)
        if outcome == "retry":
            return min(max(backoff * 2, 0.2), 5.0)
        self._last_post = time.monotonic()
        with self._lock:
            last_seq = batch[-1].seq if batch else None
            while last_seq is not None and self._buffer and self._buffer[0].seq <= last_seq:
                self._buffer.popleft()
            self._dropped -= dropped
            if outcome == "sent":
                self.delivered += len(batch)
            self._lock.notify_all()
        if self._buffer:
            self._wake.set()
        return 0.0

    def _post(self, batch: list[_Encoded], dropped: int) -> str:
        head = json.dumps({"pod": self.pod, "incarnation": self.incarnation,
                           "dropped": dropped}, separators=(",", ":"))
        body = f'{head[:-1]},"records":[{",".join(r.text for r in batch)}]}}'
        try:
            response = self._client.post(self.url, content=body.encode(),
                                         headers={"Content-Type": "application/json"})
        except httpx.HTTPError as exc:
            logger.debug("report post failed (%s); will retry", exc)
            return "retry"
        if response.is_success:
            self._read_reply(response)
            return "sent"
        if response.status_code in (408, 425, 429) or response.status_code >= 500:
            return "retry"
        if response.status_code == 413 and len(batch) > 1:
            self.max_batch = max(1, len(batch) // 2)
            return "retry"
        # Other 4xx (bad token, unknown job, invalid body) will not heal by retrying.
        logger.error("reports rejected with HTTP %d: %s; dropping %d records",
                     response.status_code, response.text[:200], len(batch))
        return "rejected"

    def _read_reply(self, response: httpx.Response) -> None:
        with contextlib.suppress(ValueError, AttributeError):  # a reply without one: no ask
            asked = response.json().get("finish_after_epoch")
            if isinstance(asked, int) and asked > 0:
                self.finish_after_epoch = asked


class Reporter:
    """Stamps records with (seq, kind, time) and hands them to every sink."""

    def __init__(self, pod: str, incarnation: str | None = None,
                 sinks: list[MetricsSink] | None = None) -> None:
        self.pod = pod
        self.incarnation = incarnation or uuid.uuid4().hex[:12]
        self.sinks: list[MetricsSink] = sinks or []
        self._seq = 0
        self._lock = threading.Lock()

    def emit(self, data: RecordData, at: float | None = None) -> None:
        """Hand `data` to the sinks, stamped with the time it happened (`at`, else now)."""
        payload = data.model_dump(mode="json")
        # Sinks get records in seq order even from several threads (the server drops a seq
        # below one it already stored as a duplicate); their write returns at once.
        with self._lock:
            self._seq += 1
            record = {"seq": self._seq, "kind": data.KIND,
                      "time": time.time() if at is None else at, "data": payload}
            for sink in self.sinks:
                sink.write(record)

    @property
    def finish_after_epoch(self) -> int | None:
        """The epoch after which the control plane asked the job to finish early, where one
        of the sinks heard it do so (trainer.finish)."""
        asked = [getattr(sink, "finish_after_epoch", None) for sink in self.sinks]
        return min((a for a in asked if a), default=None)

    def flush(self, timeout: float = 0.0) -> bool:
        return all([sink.flush(timeout) for sink in self.sinks])

    def close(self, timeout: float | None = None) -> None:
        for sink in self.sinks:
            sink.close(timeout)
