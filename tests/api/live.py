"""A real uvicorn server on a free 127.0.0.1 port, in a thread of the test process."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from tests.support import free_port, wait_for


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), what="the server to start",
             timeout=20, interval=0.01)
    assert server.started, "the server thread ended before it started"
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """Parse a text/event-stream response into {"id", "event", "data"} dicts."""
    event: dict[str, Any] = {}
    for line in response.iter_lines():
        if not line:
            if "data" in event:
                yield event
            event = {}
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            event[name] = json.loads(value) if name == "data" else value


def take(events: Iterator[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    return [next(events) for _ in range(count)]
