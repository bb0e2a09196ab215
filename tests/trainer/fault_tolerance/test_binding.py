"""A live pod's torchft pieces listen on the pod's address only (a lighthouse in this process)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import torch
from torchft._torchft import LighthouseServer

from trainer.fault_tolerance.live import HealBrokeOff, LiveGroup
from trainer.model import DeviceChoice

# Any loopback address but 127.0.0.1: neither the host name's address nor a wildcard's.
POD_ADDRESS = "127.0.0.2"


def listening() -> set[tuple[str, int]]:
    # gRPC servers listen on an IPv6 socket bound to the IPv4-mapped address: the same address.
    return {(c.laddr.ip.removeprefix("::ffff:"), c.laddr.port)
            for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


@pytest.fixture
def lighthouse() -> Iterator[str]:
    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=100,
                              quorum_tick_ms=10)
    yield f"http://127.0.0.1:{server.address().rpartition(':')[2]}"
    server.shutdown()


@pytest.fixture
def pod(lighthouse: str) -> Iterator[tuple[LiveGroup, dict[str, Any]]]:
    """A live pod's group, alone under the lighthouse, and the state it registered."""
    group = LiveGroup(DeviceChoice(torch.device("cpu"), "gloo", None), pod="pod-0",
                      lighthouse=lighthouse, address=POD_ADDRESS, peer_secret="s3cret",
                      quorum_retries=0)
    state: dict[str, Any] = {"weight": torch.zeros(2)}
    group.register_state(lambda loaded: state.update(loaded), lambda: state)
    yield group, state
    group.close()


def test_every_socket_of_a_live_pod_is_on_its_address(lighthouse: str) -> None:
    before = listening()  # before the pod starts
    group = LiveGroup(DeviceChoice(torch.device("cpu"), "gloo", None), pod="pod-0",
                      lighthouse=lighthouse, address=POD_ADDRESS, peer_secret="s3cret",
                      quorum_retries=0)
    try:
        group.start_step()  # the first quorum: its process group's store and gloo's listener
        assert group.participants == 1
        opened = listening() - before
    finally:
        group.close()
    # The manager server, the heal server, the process group's store, gloo; the replica
    # group's store, which only this process uses, is in memory.
    assert {ip for ip, _ in opened} == {POD_ADDRESS}
    assert len(opened) == 4, opened


def test_a_heal_reads_into_the_registered_state_and_a_broken_one_ends_the_pod(
        pod: tuple[LiveGroup, dict[str, Any]]) -> None:
    group, state = pod
    own = group._transport.own_state()  # where torchft's heal puts the trainer's state
    assert own["user"]["trainer"]["weight"] is state["weight"]
    group.start_step()
    group._transport.damaged = True  # as a heal that broke off in the weights leaves it
    with pytest.raises(HealBrokeOff, match="recreated and heal again"):
        group.start_step()
