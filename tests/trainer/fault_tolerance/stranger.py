"""A stranger to a live job: a stock torchft replica that asks the job's lighthouse for a quorum
with a step far ahead of the job's, and serves, to whoever would heal from it, a state whose
unpickling runs code (it creates `--marker`). It also tries to evict `--victim` with Leave.

Run as `python -m tests.trainer.fault_tolerance.stranger --lighthouse http://... --marker PATH
--victim POD --result PATH`: it writes what happened to each attempt to `--result` (JSON).
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch.distributed import TCPStore
from torchft.checkpointing.http_transport import HTTPTransport
from torchft.manager import Manager
from torchft.process_group import ProcessGroupGloo

from trainer.fault_tolerance.lighthouse import leave


class Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.marker),))


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--lighthouse", "--marker", "--victim", "--result"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    result: dict[str, str] = {}
    state = {"weight": torch.zeros(2), "payload": Payload(args.marker)}
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=ProcessGroupGloo(), load_state_dict=lambda s: None,
                      state_dict=lambda: state, min_replica_size=1, replica_id=args.victim,
                      lighthouse_addr=args.lighthouse, store_addr="127.0.0.1",
                      store_port=store.port, rank=0, world_size=1, quorum_retries=0,
                      timeout=timedelta(seconds=5), quorum_timeout=timedelta(seconds=10),
                      connect_timeout=timedelta(seconds=5), hostname="127.0.0.1",
                      checkpoint_transport=HTTPTransport(timeout=timedelta(seconds=5),
                                                         num_chunks=0))
    manager.load_state_dict({"step": 10**9, "batches_committed": 10**9})
    try:
        manager.start_quorum()
        manager.wait_quorum()
        result["join"] = f"joined with {manager.num_participants()} participants"
    except Exception as exc:  # what the stock client makes of the lighthouse's answer
        result["join"] = f"refused: {exc}"
    for victim in (args.victim, f"{args.victim}:{'0' * 8}"):
        try:
            leave(args.lighthouse, victim)
            result[f"leave {victim}"] = "accepted"
        except Exception as exc:
            result[f"leave {victim}"] = f"refused: {exc}"
    Path(args.result).write_text(json.dumps(result))
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
