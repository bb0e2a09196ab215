"""Authentication before any body is read, and bodies capped, against a real server."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest
from fastapi import FastAPI

from api.app import create_app
from api.settings import Settings
from tests.api.conftest import AUTH
from tests.api.fakes import FakeBackend
from tests.api.live import serve
from tests.support import wait_for

MEGABYTE = 1024 * 1024


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def server(settings: Settings, backend: FakeBackend) -> Iterator[tuple[str, int]]:
    app: FastAPI = create_app(settings, backend)
    with serve(app) as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


def status_of_an_endless_body(address: tuple[str, int], path: str, headers: str) -> bytes:
    """Send a chunked body that never ends: only a server that answers before reading the
    body answers at all."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     f"Transfer-Encoding: chunked\r\n{headers}\r\n".encode())
        chunk = b"[" * 65536
        sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        try:
            return sock.recv(4096).split(b"\r\n", 1)[0]
        except TimeoutError:
            return b"no answer: the server waits for the body"


def test_a_stranger_gets_401_before_the_body_is_read(server: tuple[str, int]) -> None:
    assert status_of_an_endless_body(server, "/api/v1/jobs", "") == b"HTTP/1.1 401 Unauthorized"
    wrong = "Authorization: Bearer wrong-token\r\n"
    assert status_of_an_endless_body(server, "/api/v1/jobs", wrong) == b"HTTP/1.1 403 Forbidden"
    reports = "/api/v1/jobs/job-12345678/reports"
    assert status_of_an_endless_body(server, reports, wrong) == b"HTTP/1.1 403 Forbidden"


def test_bodies_are_capped(server: tuple[str, int]) -> None:
    import httpx

    base = f"http://{server[0]}:{server[1]}"
    big = b'{"name": "' + b"x" * (2 * MEGABYTE) + b'"}'
    declared = httpx.post(f"{base}/api/v1/jobs", content=big, headers=AUTH)
    assert declared.status_code == 413  # refused from its Content-Length, unread

    def streamed() -> Iterator[bytes]:
        yield big

    counted = httpx.post(f"{base}/api/v1/jobs", content=streamed(), headers=AUTH)
    assert counted.status_code == 413 and counted.json()["error"] == "payload_too_large"
    # Reports may be larger: 4 MiB (the job's token is checked first, so a stranger gets 403).
    report = httpx.post(f"{base}/api/v1/jobs/job-12345678/reports", content=big,
                        headers={"Authorization": "Bearer x"})
    assert report.status_code == 403


def test_a_client_that_goes_away_mid_body_is_no_error(
        server: tuple[str, int], backend: FakeBackend, caplog: pytest.LogCaptureFixture) -> None:
    """A pod SIGKILLed while it posts a report leaves half a body: nothing to answer, nothing
    to log as a failure."""
    import httpx

    caplog.set_level(logging.INFO)
    base = f"http://{server[0]}:{server[1]}"
    created = httpx.post(f"{base}/api/v1/jobs", json={"replicas": 1}, headers=AUTH)
    assert created.status_code == 201, created.text
    job_id, token = created.json()["id"], backend.launches[-1].report_token
    with socket.create_connection(server, timeout=10) as sock:
        sock.sendall(f"POST /api/v1/jobs/{job_id}/reports HTTP/1.1\r\nHost: test\r\n"
                     f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: 1000\r\n\r\n{{\"pod\": ".encode())
    wait_for(lambda: "the client went away" in caplog.text, timeout=10,
             what="the server to see the client go")
    assert "unhandled error" not in caplog.text and "Traceback" not in caplog.text
    assert httpx.get(f"{base}/api/v1/jobs/{job_id}", headers=AUTH).status_code == 200
