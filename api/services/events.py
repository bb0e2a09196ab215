"""The one way to append events: each job's stream sees them in id order, none skipped.

A stream replays from the database and then follows the broker, skipping ids at or below the
last one it sent; so no event may be published before it is committed (a replay would miss it)
nor after one of its job with a higher id (a stream would skip it). Every writer of events goes
through `EventLog.append`, which holds that rule: the insert, the commit and the publish happen
under one lock and take milliseconds, and an append whose ids would go back in its job's stream
is refused before it commits (EventOrderError). Slow work (a backend call, reading logs) happens
before, outside the lock.

Writers must not flush a session before they append (sessions here do not autoflush): a
transaction that wrote outside the lock would hold the database's write lock while it waits for
ours, and the report writer, inside ours, waits for that one.

Readers take events in pages bounded in rows and in bytes (each event's `size`), so that no
page, of the events list or of a stream's replay, reads a job's history whole.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pydantic_core import to_json
from sqlalchemy import ColumnElement
from sqlmodel import Session, col, select

from api.models import Event

Item = dict[str, Any]
Publish = Callable[[str, list[Item]], None]

PAGE_BYTES = 1024 * 1024
"""Bytes of event data a page holds at most (but for its first event, which it always holds)."""


def json_size(data: Any) -> int:
    """Bytes of `data` as compact JSON: an event's `size`."""
    return len(to_json(data))


def new_event(job_id: str, type_: str, **data: Any) -> Event:
    """An event to append (not yet added to any session)."""
    return Event(job_id=job_id, type=type_, time=time.time(), data=data, size=json_size(data))


def event_page(session: Session, job_id: str, after: int, limit: int,
               types: Sequence[str] | None = None, budget: int = PAGE_BYTES,
               before: int | None = None, points: bool = True, newest: bool = False,
               ) -> tuple[list[Event], int | None]:
    """The job's events after id `after` (of `types`, and before id `before`, if given; without
    metric points unless `points`): at most `limit` of them and `budget` bytes, the oldest ones
    (the newest with `newest`), listed oldest first; and the `after` of the next page (the
    `before` of the previous one with `newest`), None when this one is the last."""
    where: list[ColumnElement[bool]] = [col(Event.job_id) == job_id, col(Event.id) > after]
    if types:
        where.append(col(Event.type).in_(types))
    if before is not None:
        where.append(col(Event.id) < before)
    if not points:
        where.append(col(Event.step).is_(None))
    # Sizes first, so that a page reads no more data than it returns.
    order = col(Event.id).desc() if newest else col(Event.id)
    sizes = session.exec(select(Event.id, Event.size).where(*where)
                         .order_by(order).limit(limit + 1)).all()
    taken, total = 0, 0
    for _, size in sizes[:limit]:
        if taken and total + size > budget:
            break
        taken, total = taken + 1, total + size
    if not taken:
        return [], None
    edge = sizes[taken - 1][0]
    within = col(Event.id) >= edge if newest else col(Event.id) <= edge
    events = session.exec(select(Event).where(*where, within).order_by(col(Event.id))).all()
    return list(events), edge if len(sizes) > taken else None


def completions(session: Session, job_id: str) -> list[tuple[str | None, float]]:
    """(pod, time) of the job's `completed` events, read by (job, type) and nothing else."""
    data = col(Event.data)
    return [(pod, time_) for pod, time_ in session.exec(
        select(data["pod"].as_string(), Event.time).where(
            Event.job_id == job_id, Event.type == "job",
            data["type"].as_string() == "completed"))]


def event_item(event: Event) -> Item:
    """The broker/SSE form of a stored event."""
    return {"id": event.id, "type": event.type, "time": event.time, "data": event.data}


class EventOrderError(RuntimeError):
    """An append would publish an event at or below one its job's stream was already sent: a
    stream following the broker would skip it. Nothing of that append is committed."""


class Appending:
    """What one `EventLog.append` writes: events to add, and rows a writer inserted itself."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.inserted: dict[str, list[Item]] = {}
        self.committed = False
        """Set once the append committed (False: its guard said no, everything rolled back)."""

    def add(self, *events: Event) -> None:
        self.events.extend(events)

    def add_inserted(self, job_id: str, items: list[Item]) -> None:
        """Rows inserted in the append's transaction by the writer itself (Core, for speed),
        as stream items with their ids."""
        self.inserted.setdefault(job_id, []).extend(items)

    def by_job(self) -> dict[str, list[Item]]:
        """Every event of the append as stream items, per job (ids known: flushed)."""
        by_job = {job_id: list(items) for job_id, items in self.inserted.items()}
        for event in self.events:
            by_job.setdefault(event.job_id, []).append(event_item(event))
        return by_job


class EventLog:
    """The one way to append events (see the module's docstring)."""

    def __init__(self, publish: Publish) -> None:
        self._publish = publish
        self._lock = threading.Lock()
        self._published: dict[str, int] = {}
        """The highest event id published per job."""

    @contextmanager
    def append(self, session: Session,
               guard: Callable[[], bool] | None = None) -> Iterator[Appending]:
        """Append events: write in the block (flushes in order, a Core insert of event rows),
        `add` the events; at its end, under one lock, `guard` runs (when it says no, the state
        it decided on changed meanwhile, say a cancel finished the job: everything is rolled
        back), then the events are flushed, checked, committed and only then published, each
        job's in id order. An error in the block rolls everything back.

        Raises EventOrderError, with everything rolled back, where an event's id is not above
        every id its job's stream was already sent.
        """
        with self._lock:
            appending = Appending()
            try:
                yield appending
                if guard is not None and not guard():
                    session.rollback()
                    return
                session.add_all(appending.events)
                session.flush()
                by_job = appending.by_job()
                for job_id, items in by_job.items():
                    self._check_order(job_id, items)
                session.commit()
            except BaseException:
                session.rollback()
                raise
            appending.committed = True
            for job_id, items in by_job.items():
                if items:
                    self._publish(job_id, items)
                    self._published[job_id] = items[-1]["id"]

    def _check_order(self, job_id: str, items: list[Item]) -> None:
        last = self._published.get(job_id, 0)
        for item in items:
            if item["id"] is None or item["id"] <= last:
                raise EventOrderError(
                    f"job {job_id}: event {item['id']} would be published after event {last}")
            last = item["id"]
