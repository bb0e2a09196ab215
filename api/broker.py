"""In-process pub/sub for the event stream: one bounded queue per SSE client.

A client whose queue fills up is not waited for: its queue is cleared and flagged, and its stream
catches up from the database, so a slow client never slows ingestion or other clients.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

Item = dict[str, Any]


@dataclass(eq=False)
class Subscription:
    job_id: str
    queue: asyncio.Queue[Item | None]
    lagged: bool = False
    """Events were discarded for this client; it must re-read from the database."""


class Broker:
    def __init__(self, queue_size: int) -> None:
        self.queue_size = queue_size
        """Events a client may have in flight before it is flagged to catch up from the
        database (settings.stream_queue_size)."""
        self._subscriptions: dict[str, set[Subscription]] = defaultdict(set)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    @property
    def clients(self) -> int:
        with self._lock:
            return sum(len(subs) for subs in self._subscriptions.values())

    def subscribe(self, job_id: str) -> Subscription:
        subscription = Subscription(job_id, asyncio.Queue(self.queue_size))
        with self._lock:
            self._subscriptions[job_id].add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            self._subscriptions[subscription.job_id].discard(subscription)
            if not self._subscriptions[subscription.job_id]:
                del self._subscriptions[subscription.job_id]

    def publish(self, job_id: str, items: list[Item]) -> None:
        """Deliver items to the job's subscribers; safe to call from any thread."""
        if not items or self._loop is None or self._loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._deliver(job_id, items)
        else:
            self._loop.call_soon_threadsafe(self._deliver, job_id, items)

    def _deliver(self, job_id: str, items: list[Item]) -> None:
        with self._lock:
            subscriptions = list(self._subscriptions.get(job_id, ()))
        for subscription in subscriptions:
            if subscription.lagged:
                continue
            for item in items:
                try:
                    subscription.queue.put_nowait(item)
                except asyncio.QueueFull:
                    self._mark_lagged(subscription)
                    break

    @staticmethod
    def _mark_lagged(subscription: Subscription) -> None:
        while not subscription.queue.empty():
            subscription.queue.get_nowait()
        subscription.lagged = True
        subscription.queue.put_nowait({"lagged": True})

    def close(self) -> None:
        """End every stream (server shutdown)."""
        with self._lock:
            subscriptions = [s for subs in self._subscriptions.values() for s in subs]
        for subscription in subscriptions:
            try:
                subscription.queue.put_nowait(None)
            except asyncio.QueueFull:
                self._mark_lagged(subscription)
                subscription.queue.get_nowait()
                subscription.queue.put_nowait(None)
