"""torchft's listening pieces, bound to the pod's address and kept to the job's members.

A live pod listens on four things of torchft's besides its heal server (heal.py): the manager
server (quorum, commit and kill RPCs), the replica group's store, the store on which each new
quorum's process group meets, and gloo's connections. torchft opens the first three on the
wildcard address and gloo takes the host name's address; here each is bound to the pod's
address, and both stores are the job's own (trainer.fault_tolerance.kv_store), which answer only the
job's members, where torchft's TCPStores answer anyone: a replica group of one pod keeps its keys in
memory and listens for none.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torchft.manager
from torch.distributed.distributed_c10d import GroupName, Work
from torchft.process_group import (
    ProcessGroupGloo,
    ProcessGroupNCCL,
    ProcessGroupWrapper,
    ReconfigureOptions,
    _DummyWork,
    _rendezvous,
)

from trainer.fault_tolerance.kv_store import MemberStore, StoreServer
from trainer.listen import gloo_backend, url_host


@contextlib.contextmanager
def manager_server_on(address: str) -> Iterator[None]:
    """While torchft's Manager is built inside this block, its server listens on `address`.

    The Manager builds its ManagerServer with `bind="[::]:<port>"` written into its code, with
    no argument or environment variable to change it. The server itself takes any bind address,
    so the one constructor call the Manager makes is handed the pod's address instead. A pod
    builds one Manager, before training starts: nothing else builds a server meanwhile.
    """
    original = torchft.manager.ManagerServer

    def server_on_address(**kwargs: Any) -> Any:
        port = kwargs["bind"].rpartition(":")[2]
        return original(**{**kwargs, "bind": f"{url_host(address)}:{port}"})

    torchft.manager.ManagerServer = server_on_address
    try:
        yield
    finally:
        torchft.manager.ManagerServer = original


@contextlib.contextmanager
def manager_store(store: dist.Store) -> Iterator[None]:
    """While torchft's Manager is built inside this block, it keeps its replica group's keys
    (its manager's address and replica id) in `store` instead of a TCPStore client it opens."""
    original = torchft.manager.TCPStore

    def given_store(**kwargs: Any) -> dist.Store:
        return store

    torchft.manager.TCPStore = given_store
    try:
        yield
    finally:
        torchft.manager.TCPStore = original


class MemberGroup(ProcessGroupWrapper):
    """A torchft process group whose quorums meet in the job's own stores.

    torchft hosts the store a new quorum meets on on every interface, open to anyone, and names
    it by the host name, which the peers of a Kubernetes pod cannot resolve: here it is a
    StoreServer on the pod's address, and peers reach it as members (with `credential`).
    """

    def __init__(self, address: str, credential: str, timeout: timedelta) -> None:
        super().__init__(timeout=timeout)
        self._address, self._credential = address, credential
        self._member_store: StoreServer | None = None
        self._store_client: MemberStore | None = None

    def get_reconfigure_handle(self) -> str:
        if self._member_store is None:
            self._member_store = StoreServer(self._address, 0, self._credential)
        return json.dumps({"id": self._handle_id(),
                           "store": f"{url_host(self._address)}:{self._member_store.port}",
                           "global_rank": self._global_rank})

    def reconfigure(self, opts: ReconfigureOptions) -> Work:
        # torchft's own, except for the store client.
        rendezvous = _rendezvous(opts, self._handle_id())
        self._rank, self._uuid = rendezvous.rank, rendezvous.uuid
        self._global_ranks = rendezvous.global_ranks
        self.abort(errored=False)
        target, _, prefix = rendezvous.store_addr.partition("/")
        # Held here: the group holds only the C++ half of a store written in Python.
        self._store_client = MemberStore(target, self._credential, self._timeout)
        store = dist.PrefixStore(prefix, self._store_client)
        self._pg = self._create_pg(store, rendezvous.rank, rendezvous.world_size)
        return _DummyWork(None)


class PodGloo(MemberGroup, ProcessGroupGloo):
    """torchft's reconfigurable gloo group, listening on the pod's address."""

    def _create_pg(self, store: dist.Store, rank: int, world_size: int) -> dist.ProcessGroup:
        # torchft's own, except for the device gloo listens on.
        pg = dist.ProcessGroup(store, rank, world_size)
        gloo = dist.ProcessGroup.BackendType.GLOO
        pg._set_default_backend(gloo)
        backend = gloo_backend(store, rank, world_size, self._timeout, self._address)
        backend._set_sequence_number_for_group()
        if self._global_ranks:
            backend.options.global_ranks_in_group = self._global_ranks
        if self._group_rank and self._group_world_size:
            backend.options.group_name = GroupName(
                f"torchft_{self._uuid}_rank_{self._group_rank % self._group_world_size}")
        pg._register_backend(torch.device("cpu"), gloo, backend)
        if torch.cuda.is_available():
            pg._register_backend(torch.device("cuda"), gloo, backend)
        return pg


class PodNccl(MemberGroup, ProcessGroupNCCL):
    """torchft's reconfigurable NCCL group, meeting its peers on the pod's address.

    NCCL's own bootstrap sockets listen on the interface NCCL picks (NCCL_SOCKET_IFNAME).
    """
