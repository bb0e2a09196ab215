"""The heal transport: on the pod's address only; both ends prove they belong to the job, the
secret never travels, and nothing a source sends is unpickled."""

from __future__ import annotations

import os
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from typing import Any

import psutil
import pytest
import torch
from torch.distributed._serialization import _streaming_save

from trainer.contract import credentials
from trainer.fault_tolerance import heal
from trainer.fault_tolerance.heal import (
    NONCE,
    REPLY_PROOF,
    REQUEST_PROOF,
    SCHEME,
    Transport,
    UntrustedSource,
    deferred_in,
)

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


def fetch(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=10) as response:
            return int(response.status), dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), b""


def signed(secret: str, url: str, nonce: str = "n0nce") -> dict[str, str]:
    path = urllib.parse.urlsplit(url).path
    return {NONCE: nonce, REQUEST_PROOF: SCHEME + credentials.sign(secret, "heal", nonce, path)}


def test_a_heal_needs_the_jobs_secret_and_never_sends_it(
        transports: Callable[[str, str], Transport]) -> None:
    source = transports(POD_ADDRESS, "secret-of-job-a")
    state = {"trainer": {"weight": torch.arange(6.0).reshape(2, 3), "step": 7}}
    source.send_checkpoint(dst_ranks=[1], step=7, state_dict=state, timeout=TIMEOUT)
    url = f"{source.metadata()}7/full"
    assert url.startswith(f"http://{POD_ADDRESS}:")

    assert fetch(url, {})[0] == 403
    assert fetch(url, {"Authorization": "Bearer secret-of-job-a"})[0] == 403  # the old way
    assert fetch(url, signed("secret-of-job-b", url))[0] == 403
    # A proof of another path (replayed from another step's heal) proves nothing here.
    assert fetch(url, signed("secret-of-job-a", f"{source.metadata()}6/full"))[0] == 403
    status, headers, _ = fetch(url, signed("secret-of-job-a", url, nonce="abc"))
    assert status == 200
    # The server proves it holds the secret too, for this very request.
    path = urllib.parse.urlsplit(url).path
    assert headers[REPLY_PROOF] == credentials.sign("secret-of-job-a", "healed", "abc", path)

    # A pod of the same job heals; a pod of another job, asking the same way, is refused.
    healed = transports(POD_ADDRESS, "secret-of-job-a").recv_checkpoint(
        src_rank=0, metadata=source.metadata(), step=7, timeout=TIMEOUT)
    assert torch.equal(healed["trainer"]["weight"], state["trainer"]["weight"])
    assert healed["trainer"]["step"] == 7
    with pytest.raises(urllib.error.HTTPError) as refused:
        transports(POD_ADDRESS, "secret-of-job-b").recv_checkpoint(
            src_rank=0, metadata=source.metadata(), step=7, timeout=TIMEOUT)
    assert refused.value.code == 403


class Stranger(ThreadingHTTPServer):
    """An HTTP server that answers every heal with `body`, as a process that reached a
    job's quorum might: it records what it was sent. Its reply carries `proof`, or, given the
    job's `secret`, the real proof (a member of the job)."""

    def __init__(self, body: bytes, proof: str | None = None, secret: str | None = None) -> None:
        self.body, self.proof, self.secret = body, proof, secret
        self.requests: list[dict[str, str]] = []
        super().__init__(("127.0.0.1", 0), StrangerHandler)
        Thread(target=self.serve_forever, daemon=True).start()

    @property
    def metadata(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/checkpoint/"


class StrangerHandler(BaseHTTPRequestHandler):
    server: Stranger

    def do_GET(self) -> None:
        self.server.requests.append(dict(self.headers))
        self.send_response(200)
        if self.server.secret is not None:
            self.send_header(REPLY_PROOF, credentials.sign(
                self.server.secret, "healed", self.headers[NONCE],
                urllib.parse.urlsplit(self.path).path))
        elif self.server.proof is not None:
            self.send_header(REPLY_PROOF, self.server.proof)
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Payload:
    """What a hostile source would serve: unpickling it runs code (here: creates a file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def saved(state: object) -> bytes:
    import io

    buffer = io.BytesIO()
    _streaming_save(state, buffer)
    return buffer.getvalue()


def test_a_source_that_cannot_prove_it_belongs_to_the_job_is_never_read(
        transports: Callable[[str, str], Transport], tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    stranger = Stranger(saved({"trainer": Payload(marker)}), proof="made-up")
    try:
        healing = transports(POD_ADDRESS, "secret-of-job-a")
        with pytest.raises(UntrustedSource, match="did not prove"):
            healing.recv_checkpoint(src_rank=0, metadata=stranger.metadata, step=7,
                                    timeout=TIMEOUT)
    finally:
        stranger.shutdown()
    assert not marker.exists()
    # What the stranger learnt: a nonce and a proof for that nonce, never the secret.
    [request] = stranger.requests
    assert "secret-of-job-a" not in str(request)
    assert request[REQUEST_PROOF].startswith(SCHEME)


def test_a_pickle_payload_is_never_executed_even_from_a_source_that_proves_itself(
        transports: Callable[[str, str], Transport], tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    source = transports(POD_ADDRESS, "secret-of-job-a")
    # A member of the job gone rogue (or a bug): its staged state holds an arbitrary object.
    source.send_checkpoint(dst_ranks=[1], step=3, timeout=TIMEOUT,
                           state_dict={"trainer": {"weight": torch.ones(2),
                                                   "extra": Payload(marker)}})
    with pytest.raises(Exception, match=r"Unsupported global"):
        transports(POD_ADDRESS, "secret-of-job-a").recv_checkpoint(
            src_rank=0, metadata=source.metadata(), step=3, timeout=TIMEOUT)
    assert not marker.exists()


def live_state(moment: torch.Tensor) -> dict[str, Any]:
    """torchft's state dict of a live pod (trainer.train's live state under "user")."""
    return {"user": {"trainer": {
        "model": {"weight": torch.arange(4.0)},
        "trainer": {"optimizer": {"state": {0: {"step": torch.tensor(7.0), "exp_avg": moment}},
                                  "param_groups": [{"lr": 0.1, "params": [0]}]},
                    "progress": {"step": 7}},
        "pod": "job-0"}}, "torchft": {"step": 7, "batches_committed": 14}}


def test_the_optimizers_state_arrives_after_the_rest_and_is_of_the_same_step(
        transports: Callable[[str, str], Transport]) -> None:
    """A healing pod gets the rest at once and the optimizer's state while it computes. The
    source's step commits (and its update changes the moments in place) only once that part
    is sent: the pod gets the staged step's moments, not the next step's."""
    moment = torch.full((16 * 2**20,), 1.0)  # 64 MB: sent over many writes
    source, healing = (transports(POD_ADDRESS, "secret-of-job-a") for _ in range(2))
    source.send_checkpoint(dst_ranks=[1], step=7, state_dict=live_state(moment), timeout=TIMEOUT)
    healed = healing.recv_checkpoint(src_rank=0, metadata=source.metadata(), step=7,
                                     timeout=TIMEOUT)
    assert torch.equal(healed["user"]["trainer"]["model"]["weight"], torch.arange(4.0))
    assert healed["user"]["trainer"]["trainer"]["progress"] == {"step": 7}
    assert healed["torchft"] == {"step": 7, "batches_committed": 14}
    found, arriving = deferred_in(healed)
    assert found and arriving is healed["user"]["trainer"]["trainer"]["optimizer"]["state"]
    source.disallow_checkpoint()  # the source's should_commit, then its update:
    moment.fill_(2.0)
    optimizer = arriving.result(timeout=30)
    assert torch.equal(optimizer[0]["exp_avg"], torch.full((16 * 2**20,), 1.0))
    assert optimizer[0]["step"] == 7.0
    # The heal's report counts the bytes the pod waited for: the weights' 16, not the moments.
    assert healing.last_heal is not None and healing.last_heal["bytes"] == 16


def test_a_pickle_payload_in_the_optimizers_state_is_never_executed(
        transports: Callable[[str, str], Transport], tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    source = transports(POD_ADDRESS, "secret-of-job-a")
    state = live_state(torch.ones(2))
    state["user"]["trainer"]["trainer"]["optimizer"]["state"] = {0: Payload(marker)}
    source.send_checkpoint(dst_ranks=[1], step=7, state_dict=state, timeout=TIMEOUT)
    healed = transports(POD_ADDRESS, "secret-of-job-a").recv_checkpoint(
        src_rank=0, metadata=source.metadata(), step=7, timeout=TIMEOUT)
    with pytest.raises(Exception, match=r"Unsupported global"):
        deferred_in(healed)[1].result(timeout=30)
    assert not marker.exists()


def test_the_server_listens_on_the_pod_address_only(
        transports: Callable[[str, str], Transport]) -> None:
    transport = transports(POD_ADDRESS, "s")
    port = transport._server.socket.getsockname()[1]
    listening = [c.laddr for c in psutil.Process().net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert [(a.ip, a.port) for a in listening] == [(POD_ADDRESS, port)]


def test_a_pod_without_a_peer_secret_does_not_start() -> None:
    with pytest.raises(credentials.MissingSecret, match="PEER_SECRET"):
        Transport(POD_ADDRESS, "", TIMEOUT)


def test_shutdown_stops_listening() -> None:
    transport = Transport(POD_ADDRESS, "secret", TIMEOUT)
    port = int(transport.address().rsplit(":", 1)[1].split("/")[0])
    transport.shutdown(wait=True)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((POD_ADDRESS, port), timeout=5).close()


def test_the_weights_are_read_into_the_pods_own_tensors_where_they_fit(
        transports: Callable[[str, str], Transport]) -> None:
    source, healing = (transports(POD_ADDRESS, "secret-of-job-a") for _ in range(2))
    state = live_state(torch.ones(2))
    state["user"]["trainer"]["model"]["bias"] = torch.full((3,), 5.0)
    source.send_checkpoint(dst_ranks=[1], step=7, state_dict=state, timeout=TIMEOUT)
    weight, bias = torch.zeros(4), torch.zeros(2)  # the bias does not fit: another shape
    moment = torch.zeros(2)  # the optimizer's, from an earlier step of this pod
    healing.own_state = lambda: {"user": {"trainer": {
        "model": {"weight": weight, "bias": bias},
        "trainer": {"optimizer": {"state": {0: {"exp_avg": moment}}}}}}}
    healed = healing.recv_checkpoint(src_rank=0, metadata=source.metadata(), step=7,
                                     timeout=TIMEOUT)
    model = healed["user"]["trainer"]["model"]
    assert model["weight"] is weight and torch.equal(weight, torch.arange(4.0))
    assert model["bias"] is not bias and torch.equal(model["bias"], torch.full((3,), 5.0))
    assert torch.equal(bias, torch.zeros(2))
    assert healed["user"]["trainer"]["trainer"]["progress"] == {"step": 7}
    optimizer = deferred_in(healed)[1].result(timeout=30)
    assert optimizer[0]["exp_avg"] is moment and torch.equal(moment, torch.ones(2))
    assert torch.equal(optimizer[0]["step"], torch.tensor(7.0))
    assert not healing.damaged


@pytest.mark.parametrize("fits", [True, False])
def test_a_heal_that_breaks_off_in_the_pods_own_weights_leaves_it_damaged(
        transports: Callable[[str, str], Transport], fits: bool) -> None:
    """Half the weight's bytes, then the end: a pod whose own weight took them must end."""
    skeleton = {"user": {"trainer": {"model": {"weight": torch.empty(4, device="meta")}}}}
    # A member of the job (it proves itself) whose heal breaks off.
    source = Stranger(saved(skeleton) + torch.arange(2.0).numpy().tobytes(), secret="secret-a")
    try:
        healing = transports(POD_ADDRESS, "secret-a")
        weight = torch.zeros(4 if fits else 5)
        healing.own_state = lambda: {"user": {"trainer": {"model": {"weight": weight}}}}
        with pytest.raises(ConnectionError, match="8 bytes short"):
            healing.recv_checkpoint(src_rank=0, metadata=source.metadata, step=7,
                                    timeout=TIMEOUT)
    finally:
        source.shutdown()
    assert healing.damaged is fits
    if fits:  # written in place up to the break
        assert torch.equal(weight, torch.tensor([0.0, 1.0, 0.0, 0.0]))


def test_the_optimizers_state_travels_below_the_steps_threads(
        transports: Callable[[str, str], Transport], monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ends move the optimizer's part in threads of a lower priority (a higher niceness)
    than the threads that compute the step; the rest goes first at the usual one, and the
    process's own threads stay as they were."""
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    sent_at: list[int] = []

    def send_part(state: Any, f: Any) -> None:
        sent_at.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        sends(state, f)

    sends = heal.send_part
    monkeypatch.setattr(heal, "send_part", send_part)
    source, healing = (transports(POD_ADDRESS, "secret-of-job-a") for _ in range(2))
    source.send_checkpoint(dst_ranks=[1], step=7, state_dict=live_state(torch.ones(4)),
                           timeout=TIMEOUT)
    healed = healing.recv_checkpoint(src_rank=0, metadata=source.metadata(), step=7,
                                     timeout=TIMEOUT)
    deferred_in(healed)[1].result(timeout=30)
    assert sent_at == [own, min(own + heal.BACKGROUND_NICENESS, 19)]  # the rest, the optimizer's
    receiver = next(t for t in threading.enumerate() if t.name.startswith("heal-deferred"))
    assert receiver.native_id is not None
    assert (os.getpriority(os.PRIO_PROCESS, receiver.native_id)
            == min(own + heal.BACKGROUND_NICENESS, 19))
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own
