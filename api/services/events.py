"""The one way to append events: each job's stream sees them in id order, none skipped.

A stream replays from the database and then follows the broker, skipping ids at or below the
last one it sent; so no event may be published after one with a higher id. Every writer of
events goes through `EventLog`: the insert, the commit and the publish happen under one lock and
take milliseconds. Slow work (a backend call, reading logs) happens before, outside the lock.

Writers must not flush a session before they append (sessions here do not autoflush): a
transaction that wrote outside the lock would hold the database's write lock while it waits for
ours, and the report writer, inside ours, waits for that one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlmodel import Session

from api.models import Event

Item = dict[str, Any]
Publish = Callable[[str, list[Item]], None]


def new_event(job_id: str, type_: str, **data: Any) -> Event:
    """An event to append (not yet added to any session)."""
    return Event(job_id=job_id, type=type_, time=time.time(), data=data)


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
