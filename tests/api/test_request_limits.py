"""Authentication before any body is read, and bodies capped, against a real server."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from fastapi import FastAPI

from api.app import create_app
from api.settings import Settings
from tests.api.conftest import AUTH
from tests.api.fakes import FakeBackend
from tests.api.live import serve

MEGABYTE = 1024 * 1024


@pytest.fixture
def server(settings: Settings) -> Iterator[tuple[str, int]]:
    app: FastAPI = create_app(settings, FakeBackend())
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
