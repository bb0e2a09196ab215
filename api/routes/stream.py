"""Server-sent events of a job: history from Last-Event-ID, then live. An EventSource sends no
headers: it opens the stream with a signed link from `POST .../stream-link`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query
from fastapi.sse import EventSourceResponse, ServerSentEvent
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool

from api.auth import Expires, LinkRoute, Signature
from api.db import session_scope
from api.deps import BrokerDep, EngineDep
from api.errors import error_responses
from api.routes import API_PREFIX
from api.services.events import event_item, event_page
from api.services.jobs import get_job
from trainer.contract.spec import MAX_INT


def job_exists(job_id: str, engine: EngineDep) -> None:
    """Checked before the response starts, so an unknown job is a 404, not an empty stream."""
    with session_scope(engine) as session:
        get_job(session, job_id)


router = APIRouter(prefix=API_PREFIX + "/jobs/{job_id}/stream", tags=["stream"],
                   dependencies=[Depends(job_exists)], route_class=LinkRoute,
                   responses=error_responses(401, 403, 404, 422))

REPLAY_PAGE = 1000


def _page(engine: Engine, job_id: str, after: int) -> tuple[list[dict[str, Any]], bool]:
    """A page of the job's history after `after`, and whether more follows."""
    with session_scope(engine) as session:
        events, next_after = event_page(session, job_id, after, REPLAY_PAGE)
        return [event_item(e) for e in events], next_after is not None


def _sse(item: dict[str, Any]) -> ServerSentEvent:
    return ServerSentEvent(id=str(item["id"]), event=item["type"],
                           data={"time": item["time"], **item["data"]})


@router.get("", response_class=EventSourceResponse)
async def stream(job_id: str, engine: EngineDep, broker: BrokerDep,
                 last_event_id: Annotated[str | None, Header()] = None,
                 after: Annotated[int | None, Query(ge=0, le=MAX_INT)] = None,
                 expires: Expires = None, signature: Signature = None,
                 ) -> AsyncIterator[ServerSentEvent]:
    last = after or 0
    if last_event_id is not None and last_event_id.strip().isdigit():
        last = int(last_event_id.strip())
    subscription = broker.subscribe(job_id)  # before the replay, so nothing falls in between
    try:
        replay = True
        while True:
            while replay:
                page, replay = await run_in_threadpool(_page, engine, job_id, last)
                for item in page:
                    yield _sse(item)
                    last = item["id"]
            received = await subscription.queue.get()
            if received is None:
                return
            item = received
            if item.get("lagged"):
                subscription.lagged, replay = False, True  # fell behind: catch up from the db
                continue
            if item["id"] > last:
                yield _sse(item)
                last = item["id"]
    finally:
        broker.unsubscribe(subscription)
