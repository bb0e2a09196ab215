"""A real uvicorn server on a free 127.0.0.1 port, in a thread of the test process."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from tests.support import free_port


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
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
