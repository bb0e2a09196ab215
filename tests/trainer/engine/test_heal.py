"""The heal transport: on the pod's address only, serving only holders of the job's secret."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta

import psutil
import pytest
import torch

from trainer.engine.heal import Transport

TIMEOUT = timedelta(seconds=5)
POD_ADDRESS = "127.0.0.2"  # any loopback address: not the one a host name resolves to


@pytest.fixture
def transports() -> Iterator[Callable[[str, str], Transport]]:
    started: list[Transport] = []

    def start(host: str, secret: str) -> Transport:
        started.append(Transport(host, secret, TIMEOUT))
        return started[-1]

    yield start
    for transport in started:
        transport.shutdown(wait=True)


def status_of(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_heal_needs_the_jobs_secret(transports: Callable[[str, str], Transport]) -> None:
    source = transports(POD_ADDRESS, "secret-of-job-a")
    state = {"trainer": {"weight": torch.arange(6.0).reshape(2, 3), "step": 7}}
    source.send_checkpoint(dst_ranks=[1], step=7, state_dict=state, timeout=TIMEOUT)
    url = f"{source.metadata()}7/full"
    assert url.startswith(f"http://{POD_ADDRESS}:")

    assert status_of(url, {}) == 403
    assert status_of(url, {"Authorization": "Bearer secret-of-job-b"}) == 403
    assert status_of(url, {"Authorization": "secret-of-job-a"}) == 403  # not as a bearer token
    assert status_of(url, {"Authorization": "Bearer secret-of-job-a"}) == 200

    # A pod of the same job heals; a pod of another job, asking the same way, is refused.
    healed = transports(POD_ADDRESS, "secret-of-job-a").recv_checkpoint(
        src_rank=0, metadata=source.metadata(), step=7, timeout=TIMEOUT)
    assert torch.equal(healed["trainer"]["weight"], state["trainer"]["weight"])
    assert healed["trainer"]["step"] == 7
    with pytest.raises(urllib.error.HTTPError) as refused:
        transports(POD_ADDRESS, "secret-of-job-b").recv_checkpoint(
            src_rank=0, metadata=source.metadata(), step=7, timeout=TIMEOUT)
    assert refused.value.code == 403


def test_the_server_listens_on_the_pod_address_only(
        transports: Callable[[str, str], Transport]) -> None:
    transport = transports(POD_ADDRESS, "s")
    port = transport._server.socket.getsockname()[1]
    listening = [c.laddr for c in psutil.Process().net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert [(a.ip, a.port) for a in listening] == [(POD_ADDRESS, port)]


def test_a_pod_without_a_heal_secret_does_not_start() -> None:
    with pytest.raises(ValueError, match="HEAL_SECRET"):
        Transport(POD_ADDRESS, "", TIMEOUT)


def test_shutdown_stops_listening() -> None:
    transport = Transport(POD_ADDRESS, "secret", TIMEOUT)
    port = int(transport.address().rsplit(":", 1)[1].split("/")[0])
    transport.shutdown(wait=True)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((POD_ADDRESS, port), timeout=5).close()
