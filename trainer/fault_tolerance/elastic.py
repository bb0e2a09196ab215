"""Restart mode's pod entry point: torchrun's elastic agent, except that bad input is final.

Takes torchrun's own flags (`python -m trainer.fault_tolerance.elastic --nnodes 1:3 ... -m
trainer`). When a peer dies the survivors' workers fail their collective, write an emergency
checkpoint, and the agents restart them in a new rendezvous round from the newest complete
checkpoint; a recreated pod joining makes them restart once more. A worker exiting with the
trainer's bad-input code ends the pod at once with that code: no retry fixes a missing dataset. A
round's worker is a warm one where it can be (trainer.fault_tolerance.warm_worker): a restart then
costs the rendezvous and the checkpoint load, not a Python start-up and a model load.

The agents meet in the job's own store (trainer.fault_tolerance.kv_store), which answers only
holders of the job's peer secret: torchrun's `c10d` rendezvous, over a MemberStore instead of a
TCPStore (`--rdzv-backend=livemigrator`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from torch.distributed import run as torchrun
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousParameters,
    dynamic_rendezvous,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
from torch.distributed.launcher import api as launcher_api

from trainer.contract import credentials
from trainer.contract.checkpoints import EXPORTED
from trainer.contract.process import ExitCode
from trainer.contract.runtime import RENDEZVOUS_BACKEND, SPEC_ENV, Runtime
from trainer.contract.spec import JobSpec
from trainer.fault_tolerance import warm_worker
from trainer.fault_tolerance.kv_store import MemberStore
from trainer.fault_tolerance.warm_worker import WarmWorker
from trainer.forkclient import ForkClient

logger = logging.getLogger(__name__)


class MemberRendezvous(C10dRendezvousBackend):
    """torchrun's c10d rendezvous, under the name the pods ask for."""

    @property
    def name(self) -> str:
        return RENDEZVOUS_BACKEND


def member_rendezvous(params: RendezvousParameters) -> RendezvousHandler:
    """torchrun's c10d rendezvous in the job's store, as a member (PEER_SECRET)."""
    secret = credentials.require(os.environ.get(credentials.SECRET_ENV, ""),
                                 "a restart-mode pod")
    store = MemberStore(params.endpoint, credentials.store_credential(secret),
                        timedelta(seconds=params.get_as_int("read_timeout", 60) or 60))
    return create_handler(store, MemberRendezvous(store, params.run_id), params)


class PodAgent(LocalElasticAgent):
    """Torchrun's agent; a worker failure with the bad-input exit code leaves no restarts, and
    a round's worker is the warm one (trainer.fault_tolerance.warm_worker) where one is ready."""

    warm: WarmWorker | None = None

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        pids = super()._start_workers(worker_group)
        if self.warm is not None:
            self.warm.round_started()
        return pids

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        if result.is_failed() and any(failure.exitcode == ExitCode.BAD_INPUT
                                      for failure in result.failures.values()):
            self._remaining_restarts = 0
        elif self.warm is not None and result.state == WorkerState.HEALTHY:
            self.warm.poll()
        return result


def method_name(depth: int = 2) -> str:
    """torch's `dynamic_rendezvous.get_method_name`, which names the caller's caller in each
    rendezvous record: that one calls `inspect.stack()` twice, reading the source of every
    frame on the stack (a forked process's holds its servers' frames too). With a deeper fork
    chain than today's, one rendezvous spent 1.9 s of CPU in it."""
    try:
        return sys._getframe(depth).f_code.co_name  # inspect.stack()[depth], less the source
    except ValueError:  # a stack shallower than that
        return "no_method_name"


def main(argv: Sequence[str] | None = None) -> int:
    args = torchrun.parse_args(list(argv) if argv is not None else None)
    rendezvous_handler_registry.register(RENDEZVOUS_BACKEND, member_rendezvous)
    launcher_api.LocalElasticAgent = PodAgent  # type: ignore[misc]  # torchrun's agent class
    dynamic_rendezvous.get_method_name = method_name
    # Forked now, before torchrun starts a thread: a child of a threaded process is unsafe.
    forks = ForkClient.fork_here() if fork_workers_wanted(os.environ) else None
    if warm_worker_wanted(os.environ):
        PodAgent.warm = WarmWorker(forks=forks)
    warm_worker.use(PodAgent.warm, forks)
    try:
        torchrun.run(args)
    except ChildFailedError as exc:
        codes = {failure.exitcode for failure in exc.failures.values()}
        logger.error("workers failed with exit codes %s", sorted(codes))
        return ExitCode.BAD_INPUT if ExitCode.BAD_INPUT in codes else ExitCode.FAILED
    except RendezvousClosedError:
        # Every agent closes the rendezvous as it ends: a pod recreated as its peers finished
        # finds it closed. With the model exported, that pod has nothing left to train.
        if not model_exported(os.environ):
            raise
        logger.warning("the job's rendezvous is closed and its model exported: its training "
                       "ended before this pod could join")
        return ExitCode.OK
    except SignalException as exc:
        # The agent stopped its workers (each checkpoints on SIGTERM). SIGTERM is a request to
        # leave (an eviction, a scale-down, a migration): done, it exits 0, so its controller
        # recreates it, where it should, without counting a failure.
        logger.info("stopped by %s", exc.sigval.name)
        return ExitCode.OK if exc.sigval == signal.SIGTERM else 128 + int(exc.sigval)
    finally:
        if PodAgent.warm is not None:
            PodAgent.warm.close()
        if forks is not None:
            forks.close()
    return 0


def fork_workers_wanted(environ: Mapping[str, str]) -> bool:
    """Whether this pod's agent forks its workers, unless its backend says not to
    (FORK_WORKERS)."""
    try:
        return Runtime(**Runtime.fields_from_env(environ)).fork_workers
    except (ValidationError, ValueError, AttributeError):
        return False  # the worker says what is wrong


def model_exported(environ: Mapping[str, str]) -> bool:
    """Whether this pod's job has exported its model (`config.json`, moved in last)."""
    try:
        return (Runtime(**Runtime.fields_from_env(environ)).model_dir / EXPORTED).exists()
    except (ValidationError, ValueError, AttributeError, OSError):
        return False


def warm_worker_wanted(environ: Mapping[str, str]) -> bool:
    """Whether this pod keeps a warm worker: unless its backend says not to (WARM_WORKER), and
    never for a pipeline stage (which one a worker holds is known only once it runs)."""
    try:
        runtime = Runtime(**Runtime.fields_from_env(environ))
        pipeline = JobSpec.model_validate_json(environ.get(SPEC_ENV) or "{}").stages > 1
    except (ValidationError, ValueError, AttributeError):
        return False  # the worker says what is wrong
    return runtime.warm_worker and not pipeline


if __name__ == "__main__":
    sys.exit(main())
