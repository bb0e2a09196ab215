"""The one way to append events: each job's stream sees them in id order, none skipped.

A stream replays from the database and then follows the broker, skipping ids at or below the
last one it sent; so no event may be published after one with a higher id. Every writer of
events goes through `EventLog`: the insert, the commit and the publish happen under one lock and
take milliseconds. Slow work (a backend call, reading logs) happens before, outside the lock.

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


class EventLog:
    def __init__(self, publish: Publish) -> None:
        self.publish = publish
        self._lock = threading.Lock()

    def commit(self, session: Session, events: Sequence[Event],
               guard: Callable[[], bool] | None = None) -> bool:
        """Commit the session's changes with `events`, then publish them.

        `guard` runs first, under the lock: when it says no (the state it decided on changed
        meanwhile, say a cancel finished the job), everything is rolled back and False returned.
        """
        with self._lock:
            if guard is not None and not guard():
                session.rollback()
                return False
            self._commit(session, events)
        return True

    @contextmanager
    def transaction(self, session: Session) -> Iterator[list[Event]]:
        """For writes that must be flushed in order (a new job's row before its pods): write
        them in the block, append events to the list; all is committed and published at its
        end, or rolled back on an error."""
        with self._lock:
            events: list[Event] = []
            try:
                yield events
            except BaseException:
                session.rollback()
                raise
            self._commit(session, events)

    @contextmanager
    def batch(self) -> Iterator[Publish]:
        """For a writer that inserts events itself (the report writer): hold the lock from its
        first write to its publish, and publish with what this yields."""
        with self._lock:
            yield self.publish

    def _commit(self, session: Session, events: Sequence[Event]) -> None:
        session.add_all(events)
        session.commit()
        by_job: dict[str, list[Item]] = {}
        for event in events:
            by_job.setdefault(event.job_id, []).append(event_item(event))
        for job_id, items in by_job.items():
            self.publish(job_id, items)
