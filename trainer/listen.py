"""Servers of a pod listen on the pod's address only, never on every interface.

Peers reach a pod at its address (POD_ADDRESS: the pod IP on Kubernetes, 127.0.0.1 on the local
backend), so nothing else needs to be open. The libraries default wider: gloo binds whatever the
host name resolves to (and a TCPStore server every interface: the job's stores are its own,
trainer.fault_tolerance.kv_store).
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from trainer.contract.runtime import url_host as url_host  # where this module's users find it

STORE_TIMEOUT = timedelta(seconds=300)
"""TCPStore's own default: how long a client waits for the server and for keys."""


def gloo_backend(store: dist.Store, rank: int, world_size: int, timeout: timedelta,
                 host: str) -> dist.ProcessGroupGloo:
    """A gloo backend whose connections listen on `host` (by default: the host name's address)."""
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    options._timeout = timeout
    options._threads = 2  # what gloo's default constructor gives one device
    return dist.ProcessGroupGloo(store, rank, world_size, options)
