"""torchrun's world as the trainer joins it: two real worker processes, gloo on the CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import Processes
from tests.support import PEER_SECRET, free_port, has_ipv6_loopback

POD_ADDRESS = "127.0.0.2"  # any loopback address: not the one a host name resolves to
WORKER = """
import json, os, psutil, torch
import torch.distributed as dist
from trainer.distributed import Group
from trainer.model import DeviceChoice

group = Group(DeviceChoice(torch.device("cpu"), "gloo", None), os.environ,
              address=os.environ["POD_ADDRESS"], peer_secret=os.environ["PEER_SECRET"])
total = group.all_reduce_sum(torch.tensor([float(group.rank + 1)]))
# gRPC listens on an IPv6 socket bound to the IPv4-mapped address: the same address.
listening = sorted({(c.laddr.ip.removeprefix("::ffff:"), c.laddr.port)
                    for c in psutil.Process().net_connections("inet")
                    if c.status == psutil.CONN_LISTEN})
print(json.dumps({"sum": total.item(), "listening": listening}), flush=True)
dist.barrier()  # neither leaves before both have listed their sockets
"""


@pytest.mark.parametrize("address", [POD_ADDRESS, pytest.param("::1", marks=pytest.mark.skipif(
    not has_ipv6_loopback(), reason="no IPv6 loopback (::1) here"))])
def test_workers_listen_on_the_pod_address_only(address: str, tmp_path: Path,
                                                processes: Processes) -> None:
    port = free_port(address)
    # As torchrun's agents set it up with an unshared store: the lowest rank hosts the store.
    env = {"WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": address,
           "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "False",
           "POD_ADDRESS": address, "PEER_SECRET": PEER_SECRET, "OMP_NUM_THREADS": "1"}
    workers = [processes.start([sys.executable, "-c", WORKER], {**env, "RANK": str(rank)},
                               tmp_path / f"rank-{rank}.log") for rank in (0, 1)]
    for rank, worker in enumerate(workers):
        assert worker.wait(timeout=120) == 0, (tmp_path / f"rank-{rank}.log").read_text()
    reports = [json.loads((tmp_path / f"rank-{rank}.log").read_text().splitlines()[-1])
               for rank in (0, 1)]
    assert [r["sum"] for r in reports] == [3.0, 3.0]
    # Rank 0: the group's store (on MASTER_PORT: the job's own, for members only) and gloo's
    # listener; rank 1: gloo's.
    assert {ip for r in reports for ip, _ in r["listening"]} == {address}
    assert [address, port] in reports[0]["listening"]
    assert [len(r["listening"]) for r in reports] == [2, 1]
