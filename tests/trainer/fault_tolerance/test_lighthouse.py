"""The lighthouse: torchft's quorum rules, served to torchft's own client, and Leave."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from torchft._torchft import LighthouseClient

from tests.conftest import Processes
from tests.support import PEER_SECRET, accepts, start_lighthouse
from trainer.contract.credentials import member_id
from trainer.fault_tolerance.lighthouse import (
    Joined,
    LeaveRequest,
    Membership,
    Options,
    Quorum,
    QuorumMember,
    QuorumResponse,
    compile_protocol,
    leave,
)


def member(replica: str, shrink_only: bool = False, step: int = 3) -> QuorumMember:
    return QuorumMember(replica_id=replica, address=f"http://{replica}", step=step,
                        world_size=1, shrink_only=shrink_only)


def membership(previous: list[str] | None, beating: list[str], asking: list[str],
               joined_at: float = 10.0, **options: float) -> Membership:
    state = Membership(Options(**options), previous=previous)
    state.heartbeats = {r: 10.0 for r in beating}
    state.arrived = {r: 0.0 for r in beating}  # heard from long ago: no newcomers
    state.joined = {r: Joined(joined_at, member(r)) for r in asking}
    return state


def ids(members: list[QuorumMember] | None) -> list[str] | None:
    return None if members is None else [m.replica_id for m in members]


def test_a_quorum_forms_at_once_when_every_previous_member_asks() -> None:
    state = membership(["b", "a"], beating=["a", "b", "c"], asking=["b", "a"])
    members, reason = state.decide(now=10.1)
    assert ids(members) == ["a", "b"] and reason.startswith("fast quorum")


def test_a_newcomer_heard_from_moments_ago_is_waited_for_up_to_the_join_timeout() -> None:
    """c (a recreated pod) heartbeats and is about to ask: the previous members' quorum waits
    for it rather than leave it a step to wait; if it does not ask, not for long."""
    state = membership(["a", "b"], beating=["a", "b", "c"], asking=["a", "b"], join_timeout=1.0,
                       heartbeat_timeout=5.0)
    state.arrived["c"] = 9.9
    members, reason = state.decide(now=10.1)
    assert members is None and "newcomer" in reason
    state.joined["c"] = Joined(10.2, member("c"))
    assert ids(state.decide(now=10.2)[0]) == ["a", "b", "c"]
    del state.joined["c"]
    members, reason = state.decide(now=10.9)  # c arrived over the join timeout ago
    assert ids(members) == ["a", "b"] and reason.startswith("fast quorum")


def test_a_dead_replicas_replacement_is_waited_for_before_it_is_heard_from() -> None:
    """b died and its supervisor handed its place to a warm standby (c): the survivors' next
    quorum waits for c, not yet heard from, and takes it in, so c does not wait out their
    next step. A replacement that does not come is not waited for past the join timeout."""
    def survivors() -> Membership:
        return membership(["a", "b", "x"], beating=["a", "b", "x"], asking=["a", "x"],
                          join_timeout=1.0, heartbeat_timeout=5.0)

    state = survivors()
    state.gone("b", now=10.0, replaced=True)
    members, reason = state.decide(now=10.1)
    assert members is None and "replacement" in reason
    state.beat("c", 10.3)  # c starts heartbeating: a newcomer now
    members, reason = state.decide(now=10.4)
    assert members is None and "newcomer" in reason
    state.joined["c"] = Joined(10.5, member("c"))
    assert ids(state.decide(now=10.5)[0]) == ["a", "c", "x"]

    state = survivors()
    state.gone("b", now=10.0, replaced=True)
    assert state.decide(now=10.9)[0] is None
    members, reason = state.decide(now=11.0)
    assert ids(members) == ["a", "x"] and reason.startswith("fast quorum")

    state = survivors()
    state.gone("b", now=10.0, replaced=False)  # recreated after a backoff: not waited for
    assert ids(state.decide(now=10.0)[0]) == ["a", "x"]


def test_the_jobs_first_quorum_waits_for_its_replicas_up_to_the_start_timeout() -> None:
    """A pod is heard from once it has loaded: at the job's start the first pod loaded is the
    only replica heartbeating, and would form a quorum alone without this rule."""
    state = membership(None, beating=["a"], asking=[], replicas=3, start_timeout=30.0,
                       heartbeat_timeout=100.0)
    state.joined["a"] = Joined(10.0, member("a", step=0))
    members, reason = state.decide(now=12.0)
    assert members is None and "the job's 3 replicas to start" in reason
    for replica, at in (("b", 13.0), ("c", 14.0)):
        state.beat(replica, at)
        state.joined[replica] = Joined(at, member(replica, step=0))
    assert ids(state.decide(now=14.0)[0]) == ["a", "b", "c"]
    del state.joined["c"], state.heartbeats["c"]  # c never came: not waited for past the timeout
    assert state.decide(now=39.9)[0] is None
    assert ids(state.decide(now=40.0)[0]) == ["a", "b"]


def test_a_restarted_lighthouse_waits_for_no_replica_that_is_past_step_0() -> None:
    """The job ran already (scaled down since, say): its replicas' quorum forms at once."""
    state = membership(None, beating=["a", "b"], asking=["a", "b"], replicas=3,
                       start_timeout=30.0)
    assert ids(state.decide(now=10.1)[0]) == ["a", "b"]
    state = membership(None, beating=["a", "b"], asking=[], replicas=3, start_timeout=30.0,
                       heartbeat_timeout=100.0)
    state.joined = {r: Joined(10.0, member(r, step=0)) for r in ("a", "b")}
    assert state.decide(now=10.1)[0] is None  # the same replicas at step 0: the job's start


def test_a_missing_member_is_waited_for_until_its_heartbeats_stop() -> None:
    state = membership(["a", "b", "c"], beating=["a", "b", "c"], asking=["a", "b"],
                       join_timeout=60.0, heartbeat_timeout=0.5)
    assert state.decide(now=10.1)[0] is None  # c still heartbeats: it may yet ask
    state.heartbeats |= {"a": 10.5, "b": 10.5}
    assert ids(state.decide(now=10.6)[0]) == ["a", "b"]  # c's heartbeats stopped


def test_a_member_that_left_is_not_waited_for() -> None:
    state = membership(["a", "b", "c"], beating=["a", "b", "c"], asking=["a", "b"],
                       join_timeout=60.0)
    state.left.add("c")
    members, reason = state.decide(now=10.1)
    assert ids(members) == ["a", "b"] and reason.startswith("fast quorum")


def test_stragglers_are_waited_for_up_to_the_join_timeout() -> None:
    state = membership(None, beating=["a", "b", "c"], asking=["a", "b"], join_timeout=1.0,
                       heartbeat_timeout=5.0)
    assert state.decide(now=10.5)[0] is None
    assert ids(state.decide(now=11.1)[0]) == ["a", "b"]


def test_a_replica_left_out_of_a_quorum_does_not_start_the_join_timeout_alone() -> None:
    """b was left out of the last quorum and asked a step early: the next quorum still waits
    up to the join timeout from a's ask, which made it possible, so c, a moment behind a, is
    in it; counted from b's ask, the quorum would close on a and b and leave c out."""
    state = membership(["a", "c"], beating=["a", "b", "c"], asking=["b"], join_timeout=1.0,
                       heartbeat_timeout=5.0)
    assert state.decide(now=11.5)[0] is None  # b alone: not more than half
    state.joined["a"] = Joined(11.5, member("a"))
    members, reason = state.decide(now=11.6)
    assert members is None and "join timeout" in reason
    state.joined["c"] = Joined(11.7, member("c"))
    assert ids(state.decide(now=11.7)[0]) == ["a", "b", "c"]
    del state.joined["c"]  # had c not come, a and b would go on without it
    assert ids(state.decide(now=12.6)[0]) == ["a", "b"]


def test_no_quorum_without_more_than_half_of_the_heartbeating_replicas() -> None:
    state = membership(None, beating=["a", "b", "c", "d"], asking=["a", "b"], join_timeout=0)
    members, reason = state.decide(now=10.1)
    assert members is None and "more than half" in reason


def test_shrink_only_keeps_newcomers_out() -> None:
    state = membership(["a", "b"], beating=["a", "b", "c"], asking=["a", "b", "c"])
    state.joined["a"].member.shrink_only = True
    assert ids(state.decide(now=10.1)[0]) == ["a", "b"]


def test_the_messages_are_torchfts_on_the_wire() -> None:
    # torchft's Rust managers decode these bytes: the field numbers and types of its
    # proto/torchft.proto.
    joined = QuorumMember(replica_id="a", address="b", store_address="c", step=3, world_size=2,
                          shrink_only=True, data="{}", commit_failures=1)
    quorum = Quorum(quorum_id=7, participants=[joined, joined])
    quorum.created.seconds = 5
    assert QuorumResponse(quorum=quorum).SerializeToString().hex() == (
        "0a34080712150a01611201621a01632003280230013a027b7d400112150a01611201621a0163200328023001"
        "3a027b7d40011a020805")
    assert LeaveRequest(replica_id="x").SerializeToString() == b"\n\x01x"  # a heartbeat's
    assert LeaveRequest(replica_id="x", replaced=True).SerializeToString() == b"\n\x01x\x10\x01"


def test_a_member_field_newer_than_the_protocol_reaches_the_peers() -> None:
    # Newer torchft managers send fields torchft.proto lacks (reconfigure_handles): the quorum
    # the lighthouse sends back must carry them to every peer.
    newer = QuorumMember(replica_id="a").SerializeToString() + bytes.fromhex("4a02") + b"hi"
    quorum = Quorum(quorum_id=1, participants=[QuorumMember.FromString(newer)])
    received = Quorum.FromString(quorum.SerializeToString()).participants[0]
    assert received.SerializeToString() == newer


def test_a_protocol_that_does_not_compile_fails_loudly(tmp_path: Path) -> None:
    broken = tmp_path / "broken.proto"
    broken.write_text('syntax = "proto3";\nmessage Unfinished {\n')
    with pytest.raises(RuntimeError, match=r"could not compile .*broken\.proto"):
        compile_protocol(broken)


@pytest.fixture
def lighthouse(processes: Processes, tmp_path: Path) -> str:
    """A lighthouse that would wait a minute for a member that stopped asking."""
    return start_lighthouse(processes, tmp_path / "lighthouse.log", 1, join_timeout_ms=60_000,
                            heartbeat_timeout_ms=60_000)


def replica_of(pod: str) -> str:
    """A pod's replica id as torchft's manager sends it: its member id and a uuid."""
    return f"{member_id(PEER_SECRET, pod)}:0f0e0d0c-uuid"


def pods(replica_ids: list[str]) -> list[str]:
    return [r.split("~")[0] for r in replica_ids]


def quorums(address: str, replicas: list[str], step: int) -> dict[str, tuple[int, list[str]]]:
    """Every pod asks for a quorum at once (as torchft's managers do) under its member id;
    what each got, by pod (a failed request raises here)."""

    def ask(replica: str) -> tuple[int, list[str]]:
        client = LighthouseClient(address, timedelta(seconds=10))
        quorum = client.quorum(replica_id=replica_of(replica), timeout=timedelta(seconds=5),
                               address=f"http://{replica}", store_address="store", step=step,
                               world_size=1)
        return quorum.quorum_id, pods([m.replica_id for m in quorum.participants])

    with ThreadPoolExecutor(len(replicas)) as pool:
        return dict(zip(replicas, pool.map(ask, replicas), strict=True))


def test_torchfts_client_gets_quorums_and_a_replica_that_left_is_not_waited_for(
        lighthouse: str) -> None:
    client = LighthouseClient(lighthouse, timedelta(seconds=10))
    for replica in ("a", "b", "c"):  # every one heartbeats before anyone asks
        client.heartbeat(replica_of(replica))
    first = quorums(lighthouse, ["a", "b", "c"], step=0)
    assert {r: q[1] for r, q in first.items()} == {r: ["a", "b", "c"] for r in "abc"}

    # c says it leaves, yet still heartbeats (its process has not ended): a and b are not kept
    # waiting for it, though this lighthouse would wait a minute for a silent member.
    leave(lighthouse, replica_of("c"))
    client.heartbeat(replica_of("c"))
    second = quorums(lighthouse, ["a", "b"], step=1)
    assert {r: q[1] for r, q in second.items()} == {"a": ["a", "b"], "b": ["a", "b"]}
    assert second["a"][0] == first["a"][0] + 1  # a new quorum id: peers reconfigure

    with pytest.raises(RuntimeError, match="has left"):  # c may not come back
        LighthouseClient(lighthouse, timedelta(seconds=10)).quorum(
            replica_id=replica_of("c"), timeout=timedelta(seconds=5), address="x",
            store_address="s", step=1, world_size=1)


STRANGERS = {
    "a stock client": "a:0f0e0d0c-uuid",  # a pod's name, as a stock torchft manager sends it
    "a made-up tag": "a~AAAAAAAAAAAAAAAAAAAAAAAA:0f0e0d0c-uuid",
    "another job's member id": f"{member_id('secret-of-another-job', 'a')}:0f0e0d0c-uuid",
    "a tag moved to another pod": f"b~{member_id(PEER_SECRET, 'a').split('~')[1]}:uuid",
}


@pytest.mark.parametrize("stranger", STRANGERS.values(), ids=STRANGERS.keys())
def test_a_stranger_can_neither_join_nor_heartbeat_nor_evict(lighthouse: str,
                                                               stranger: str) -> None:
    client = LighthouseClient(lighthouse, timedelta(seconds=10))
    client.heartbeat(replica_of("a"))
    assert quorums(lighthouse, ["a"], step=0)["a"][1] == ["a"]
    # A quorum request with a step far ahead of the job's: were it heard, every pod would
    # heal from the stranger's address.
    with pytest.raises(RuntimeError, match="not a member"):
        client.quorum(replica_id=stranger, timeout=timedelta(seconds=5),
                      address="http://127.0.0.1:1", store_address="s", step=10**9,
                      world_size=1)
    with pytest.raises(RuntimeError, match="not a member"):
        client.heartbeat(stranger)
    with pytest.raises(grpc.RpcError) as refused:
        leave(lighthouse, stranger)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # The member is neither evicted nor joined by anyone: its next quorum is its own alone.
    assert quorums(lighthouse, ["a"], step=1)["a"][1] == ["a"]


def test_raw_connections_leave_the_lighthouse_serving(lighthouse: str) -> None:
    port = int(lighthouse.rpartition(":")[2])
    for garbage in (b"", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", bytes(range(256)) * 64):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.sendall(garbage)
    assert accepts(port)
    LighthouseClient(lighthouse, timedelta(seconds=10)).heartbeat(replica_of("a"))
    assert quorums(lighthouse, ["a"], step=0)["a"][1] == ["a"]
