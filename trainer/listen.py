"""Servers of a pod listen on the pod's address only, never on every interface.

Peers reach a pod at its address (POD_ADDRESS: the pod IP on Kubernetes, 127.0.0.1 on the local
backend), so nothing else needs to be open. The libraries default wider: a TCPStore server binds
every interface whatever host it is given, and gloo binds whatever the host name resolves to.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch.distributed as dist

from trainer.contract.runtime import url_host as url_host  # where this module's users find it

STORE_TIMEOUT = timedelta(seconds=300)
"""TCPStore's own default: how long a client waits for the server and for keys."""


def listening_socket(host: str, port: int = 0) -> socket.socket:
    """A TCP socket listening on `host:port` only (port 0: a free one)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family)


def bound_store(host: str, port: int = 0, world_size: int | None = None,
                timeout: timedelta = STORE_TIMEOUT) -> dist.TCPStore:
    """A TCPStore server listening on `host` only.

    Its server would bind the wildcard address; it listens on a socket bound here instead.
    """
    sock = listening_socket(host, port)
    # The store owns the descriptor from now on: the socket object must not close it.
    bound_port: int = sock.getsockname()[1]
    return dist.TCPStore(host, bound_port, world_size, is_master=True, timeout=timeout,
                         wait_for_workers=False, master_listen_fd=sock.detach())


def gloo_backend(store: dist.Store, rank: int, world_size: int, timeout: timedelta,
                 host: str) -> dist.ProcessGroupGloo:
    """A gloo backend whose connections listen on `host` (by default: the host name's address)."""
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    options._timeout = timeout
    options._threads = 2  # what gloo's default constructor gives one device
    return dist.ProcessGroupGloo(store, rank, world_size, options)
