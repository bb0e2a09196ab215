"""A job's chart series: read from the metric points' own columns, one row a step, and cut to a
bounded number of points whatever the history's length, so a job page loads in the same time
after ten steps or a million."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from sqlalchemy import ColumnElement
from sqlalchemy import select as sql_select
from sqlmodel import Session, col, func, select

from api.models import Event, SeriesPublic
from api.services.jobs import get_job

Point = tuple[int, float, float | None, float | None, int | None]
"""(step, time, loss, samples/s, participants)."""
KEPT_PER_SPAN = 5
"""Points a span of steps keeps at most: its lowest and highest loss and samples/s, and its
fewest participants (a failure's dip)."""


def job_series(session: Session, job_id: str, limit: int) -> SeriesPublic:
    get_job(session, job_id)
    last_id = session.exec(select(func.max(Event.id)).where(Event.job_id == job_id)).one() or 0
    mine = (col(Event.job_id) == job_id, col(Event.id) <= last_id, col(Event.step).is_not(None))
    every = _per_step(session, mine)
    newest = session.exec(select(Event.time, Event.data).where(*mine)
                          .order_by(col(Event.id).desc()).limit(1)).first()
    latest = {"time": newest[0], **newest[1]} if newest is not None else None
    return SeriesPublic(last_id=last_id, steps=len(every), latest=latest,
                        points=downsample(every, limit))


def _per_step(session: Session, mine: tuple[ColumnElement[bool], ...]) -> Sequence[Point]:
    """One point a step, the pods' reports of it combined, read straight off the connection
    (no ORM rows: a long history has a hundred thousand steps)."""
    step = col(Event.step)
    rows = session.connection().execute(
        sql_select(step, func.min(Event.time), func.avg(Event.loss), func.avg(Event.rate),
                   func.max(Event.participants)).where(*mine).group_by(step).order_by(step))
    return cast("Sequence[Point]", rows.all())


def downsample(points: Sequence[Point], limit: int) -> list[Point]:
    """`points` (by step) when they are at most `limit`; else spans of consecutive steps, each
    cut to its extremes, and the first and last point: at most `limit` + 2 points."""
    if len(points) <= limit:
        return list(points)
    spans = max(1, limit // KEPT_PER_SPAN)
    width = -(-len(points) // spans)
    kept = {0, len(points) - 1}
    for field, ends in ((2, True), (3, True), (4, False)):  # participants: the dips alone
        values = [p[field] for p in points]
        for start in range(0, len(points), width):
            known = [(value, i) for i, value in enumerate(values[start:start + width], start)
                     if value is not None]
            if known:
                kept.add(min(known)[1])
                if ends:
                    kept.add(max(known)[1])
    return [points[i] for i in sorted(kept)]
