"""torchft's listening pieces, bound to the pod's address instead of every interface.

A live pod listens on four things of torchft's besides its heal server (heal.py): the manager
server (quorum, commit and kill RPCs), the replica group's store, the store on which each new
quorum's process group meets, and gloo's connections. torchft opens the first three on the
wildcard address and gloo takes the host name's address; each is bound to the pod's address
here (the replica group's store, which only this process uses, to the loopback address).
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
from torch.distributed.distributed_c10d import GroupName
from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

from trainer.listen import bound_store, gloo_backend, url_host


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


def reconfigure_handle(group: Any, address: str) -> str:
    """What torchft's get_reconfigure_handle says, with the store on and named by `address`.

    torchft hosts this store on every interface and names it by the host name, which the peers
    of a Kubernetes pod cannot resolve.
    """
    if group._rendezvous_store is None:
        group._rendezvous_store = bound_store(address)
    return json.dumps({"id": group._handle_id(),
                       "store": f"{url_host(address)}:{group._rendezvous_store.port}",
                       "global_rank": group._global_rank})


class PodGloo(ProcessGroupGloo):
    """torchft's reconfigurable gloo group, listening on the pod's address."""

    def __init__(self, address: str, timeout: timedelta) -> None:
        super().__init__(timeout=timeout)
        self._address = address

    def get_reconfigure_handle(self) -> str:
        return reconfigure_handle(self, self._address)

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


class PodNccl(ProcessGroupNCCL):
    """torchft's reconfigurable NCCL group, meeting its peers on the pod's address.

    NCCL's own bootstrap sockets listen on the interface NCCL picks (NCCL_SOCKET_IFNAME).
    """

    def __init__(self, address: str, timeout: timedelta) -> None:
        super().__init__(timeout=timeout)
        self._address = address

    def get_reconfigure_handle(self) -> str:
        return reconfigure_handle(self, self._address)
