"""The job's stores: torch's Store semantics for members, nothing for anyone else."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.conftest import Processes
from tests.support import PEER_SECRET, accepts, free_port, wait_for
from trainer.contract.credentials import SECRET_ENV, store_credential
from trainer.fault_tolerance.kv_store import MemberStore, StoreServer

CREDENTIAL = store_credential(PEER_SECRET)
SHORT = timedelta(seconds=2)


@pytest.fixture
def server() -> Iterator[StoreServer]:
    server = StoreServer("127.0.0.1", 0, CREDENTIAL)
    yield server
    server.stop()


def client(server: StoreServer, credential: str = CREDENTIAL,
           timeout: timedelta = SHORT) -> MemberStore:
    return MemberStore(f"127.0.0.1:{server.port}", credential, timeout)


def test_a_member_gets_torchs_store_semantics(server: StoreServer) -> None:
    store = client(server)
    store.set("a", b"1")
    assert store.get("a") == b"1"
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5
    # compare_set as TCPStore does it: a missing key counts as empty.
    assert store.compare_set("k", "", "v1") == b"v1"
    assert store.compare_set("k", "wrong", "v2") == b"v1"
    assert store.compare_set("k", "v1", "v2") == b"v2"
    assert store.compare_set("missing", "x", "y") == b"x"
    assert store.check(["a", "k"]) and not store.check(["a", "nope"])
    assert store.num_keys() == 3
    assert store.delete_key("a") and not store.delete_key("a")
    # Through a PrefixStore, as torchrun and gloo use it; multi_get/multi_set included.
    prefixed = dist.PrefixStore("round-1", store)
    prefixed.multi_set(["x", "y"], ["1", "2"])
    assert prefixed.multi_get(["x", "y"]) == [b"1", b"2"]
    assert store.get("round-1/x") == b"1"


def test_get_and_wait_block_until_the_key_is_set_or_time_out(server: StoreServer) -> None:
    store = client(server)
    threading.Timer(0.3, lambda: client(server).set("late", "here")).start()
    started = time.monotonic()
    assert store.get("late") == b"here" and time.monotonic() - started >= 0.25
    with pytest.raises(dist.DistStoreError, match="timeout"):
        store.wait(["never"], timedelta(seconds=0.3))
    with pytest.raises(dist.DistStoreError, match="timeout"):
        client(server, timeout=timedelta(seconds=0.3)).get("never")


def test_a_client_waits_for_a_server_that_starts_later() -> None:
    port = free_port()
    store = MemberStore(f"127.0.0.1:{port}", CREDENTIAL, timedelta(seconds=10))
    servers: list[StoreServer] = []
    threading.Timer(0.5, lambda: servers.append(StoreServer("127.0.0.1", port, CREDENTIAL)),
                    ).start()
    try:
        store.set("a", "1")
        assert store.get("a") == b"1"
    finally:
        wait_for(lambda: servers, what="the server to start")
        servers[0].stop()


def test_a_stranger_can_neither_read_nor_write_nor_list(server: StoreServer) -> None:
    client(server).set("torch.rendezvous.job", b"the round's state")
    for credential in ("", "wrong", store_credential("secret-of-another-job")):
        stranger = client(server, credential=credential)
        with pytest.raises(dist.DistStoreError, match="not a member"):
            stranger.get("torch.rendezvous.job")
        with pytest.raises(dist.DistStoreError, match="not a member"):
            stranger.set("torch.rendezvous.job", b"hijacked")
        with pytest.raises(dist.DistStoreError, match="not a member"):
            stranger.num_keys()
    assert client(server).get("torch.rendezvous.job") == b"the round's state"


def test_a_stock_tcpstore_client_and_raw_bytes_get_nothing(server: StoreServer) -> None:
    client(server).set("key", b"value")
    with pytest.raises((dist.DistError, RuntimeError)):
        dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                      timeout=timedelta(seconds=2)).get("key")
    for garbage in (b"", b"\x00" * 64, bytes(range(256)) * 16):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
            raw.sendall(garbage)
    assert client(server).get("key") == b"value"


def test_a_stock_torchrun_agent_cannot_join_the_jobs_rendezvous(
        processes: Processes, tmp_path: Path) -> None:
    """torchrun's own c10d rendezvous pointed at a restart-mode job's store, with the job's
    run id: it never gets into a round, and the store keeps serving the job."""
    from api.backends.programs import store_argv

    port = free_port()
    processes.start(store_argv(port, python=sys.executable), {SECRET_ENV: PEER_SECRET},
                    tmp_path / "store.log")
    wait_for(lambda: accepts(port), what="the store to listen", timeout=30)
    stranger = processes.start(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=1",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=the-job",
         "--rdzv-conf=is_host=false,join_timeout=5,read_timeout=2", "-m", "json.tool",
         "--help"], {}, tmp_path / "stranger.log")
    assert stranger.wait(timeout=120) != 0
    assert "the-job" not in (tmp_path / "store.log").read_text()
    member = MemberStore(f"127.0.0.1:{port}", CREDENTIAL, SHORT)
    member.set("torch.rendezvous.the-job", b"state")
    assert member.get("torch.rendezvous.the-job") == b"state"
    assert member.num_keys() == 1  # the stranger wrote nothing


def test_the_store_process_refuses_to_start_without_the_secret(
        processes: Processes, tmp_path: Path) -> None:
    from api.backends.programs import store_argv

    process = processes.start(store_argv(free_port(), python=sys.executable),
                              {SECRET_ENV: ""}, tmp_path / "store.log")
    assert process.wait(timeout=60) == 2
    assert "PEER_SECRET" in (tmp_path / "store.log").read_text()


NODE = """
import os, sys, time
from torch.distributed.elastic.rendezvous import RendezvousParameters
from trainer.fault_tolerance.elastic import member_rendezvous
params = RendezvousParameters(backend="livemigrator", endpoint=sys.argv[1], run_id="the-job",
                              min_nodes=1, max_nodes=2, local_addr="127.0.0.1",
                              keep_alive_interval=1, keep_alive_max_attempt=600,
                              last_call_timeout=1, join_timeout=60)
member_rendezvous(params).next_rendezvous()
print("in round", flush=True)
time.sleep(600)
"""


def test_a_node_the_store_is_told_has_ended_leaves_the_rendezvous_at_once(
        server: StoreServer, processes: Processes, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's rendezvous in the job's store, its keep-alives expiring after 10 minutes: a
    round holds one node, SIGKILLed; told that its process ended, the store has the next
    node to sync drop it, and a new node's round completes (in seconds, not 10 minutes)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    from trainer.fault_tolerance import store_wire
    from trainer.fault_tolerance.elastic import member_rendezvous

    monkeypatch.setenv(SECRET_ENV, PEER_SECRET)
    endpoint = f"127.0.0.1:{server.port}"
    log = tmp_path / "node.log"
    node = processes.start([sys.executable, "-c", NODE, endpoint], {SECRET_ENV: PEER_SECRET},
                           log)
    wait_for(lambda: "in round" in log.read_text(), what="the first node's round",
             timeout=120)
    # No such node, or not this run's: nothing changes.
    assert store_wire.call(endpoint, CREDENTIAL, "forget_node", 5.0, run_id="the-job",
                           pid=node.pid + 1, addr="127.0.0.1") == {"count": 0}
    assert store_wire.call(endpoint, CREDENTIAL, "forget_node", 5.0, run_id="another-job",
                           pid=node.pid, addr="127.0.0.1") == {"count": 0}
    node.kill()
    node.wait(timeout=30)
    reply = store_wire.call(endpoint, CREDENTIAL, "forget_node", 5.0, run_id="the-job",
                            pid=node.pid, addr="127.0.0.1")
    assert reply == {"count": 1}
    params = RendezvousParameters(backend="livemigrator", endpoint=endpoint, run_id="the-job",
                                  min_nodes=1, max_nodes=2, local_addr="127.0.0.1",
                                  keep_alive_interval=1, keep_alive_max_attempt=600,
                                  last_call_timeout=1, join_timeout=60)
    handler = member_rendezvous(params)
    try:
        info = handler.next_rendezvous()  # a RendezvousTimeoutError after 60 s otherwise
        assert (info.rank, info.world_size) == (0, 1)
    finally:
        handler.shutdown()


def test_the_store_reads_no_class_but_a_rendezvous_states(server: StoreServer,
                                                           tmp_path: Path) -> None:
    """A member-written value under a rendezvous key whose unpickling would call a function
    (here os.mkdir) is refused, never run, and left alone."""
    import base64
    import os
    import pickle

    from trainer.fault_tolerance import store_wire

    marker = tmp_path / "ran"

    class Planted:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return os.mkdir, (str(marker),)

    planted = base64.b64encode(pickle.dumps(Planted()))
    client(server).set("torch.rendezvous.the-job", planted)
    reply = store_wire.call(f"127.0.0.1:{server.port}", CREDENTIAL, "forget_node", 5.0,
                            run_id="the-job", pid=1, addr="127.0.0.1")
    assert reply == {"count": 0}
    assert not marker.exists()  # a plain pickle.loads would have made it
    assert client(server).get("torch.rendezvous.the-job") == planted


def test_a_store_restarted_with_its_state_file_serves_what_was_written_before(
        processes: Processes, tmp_path: Path) -> None:
    """The restart-mode store process, SIGKILLed and started again on its port with the same
    state file, as its supervisor does: a member's keys (a rendezvous state among them) are
    there again, so no agent waits for a key that was lost."""
    from api.backends.programs import store_argv

    port, state = free_port(), tmp_path / "store.json"
    argv = store_argv(port, python=sys.executable, state_file=state)
    first = processes.start(argv, {SECRET_ENV: PEER_SECRET}, tmp_path / "store.log")
    wait_for(lambda: accepts(port), what="the store to listen", timeout=30)
    member = MemberStore(f"127.0.0.1:{port}", CREDENTIAL, SHORT)
    member.set("torch.rendezvous.the-job", b"state")
    assert member.compare_set("torch.rendezvous.the-job", "state", "state-2") == b"state-2"
    assert member.add("counter", 3) == 3
    member.set("gone", b"x")
    assert member.delete_key("gone")
    first.kill()
    first.wait(timeout=30)
    processes.start(argv, {SECRET_ENV: PEER_SECRET}, tmp_path / "store-2.log")
    wait_for(lambda: accepts(port), what="the store to listen again", timeout=30)
    assert member.get("torch.rendezvous.the-job") == b"state-2"
    assert member.add("counter", 1) == 4
    assert not member.check(["gone"])
    assert member.num_keys() == 2
