"""The restart-mode pod agent's choices made from its environment
(trainer.fault_tolerance.elastic)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from trainer.contract.runtime import SPEC_ENV
from trainer.contract.spec import JobSpec
from trainer.fault_tolerance.elastic import warm_worker_wanted
from trainer.fault_tolerance.warm_worker import WarmHandler

PIPELINE = JobSpec(parallelism="pipeline", pipeline_stages=3, fault_tolerance="restart")


@pytest.mark.parametrize(("environ", "wanted"), [
    ({}, True),  # the spec's defaults: a data-parallel job
    ({SPEC_ENV: JobSpec(replicas=3).model_dump_json()}, True),
    ({SPEC_ENV: PIPELINE.model_dump_json()}, False),  # a stage is known only once it runs
    # The pipeline's default stages come from the spec's model, not from the agent.
    ({SPEC_ENV: json.dumps({"parallelism": "pipeline"})}, False),
    ({SPEC_ENV: JobSpec().model_dump_json(), "WARM_WORKER": "false"}, False),
    ({SPEC_ENV: json.dumps({"replicas": 0})}, False),  # invalid: the worker says what is wrong
    ({SPEC_ENV: "{replicas"}, False),
])
def test_a_warm_worker_is_kept_for_data_parallel_jobs_only(environ: dict[str, str],
                                                            wanted: bool) -> None:
    assert warm_worker_wanted(environ) is wanted


def test_its_rendezvous_records_name_their_methods_as_torchs_own_would() -> None:
    """`elastic.method_name` stands in for torch's `get_method_name` (which reads the source of
    every frame of the stack, twice): the same name at every depth, without a stack."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from trainer.fault_tolerance.elastic import method_name

    def caller() -> list[tuple[str, str]]:
        get = dynamic_rendezvous.get_method_name
        return [(get(1), method_name(1)), (get(2), method_name(2)), (get(3), method_name(3))]

    def outer() -> list[tuple[str, str]]:
        return caller()

    names = outer()
    assert names[:2] == [("caller", "caller"), ("outer", "outer")]
    assert names[2][0] == names[2][1]
    assert method_name(10_000) == dynamic_rendezvous.get_method_name(10_000) == "no_method_name"


HUNG_WORKER = """
import signal, sys, time
from trainer.distributed import show_stacks_on_request
show_stacks_on_request()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def waiting_in_a_collective():
    print("ready", flush=True)
    time.sleep(600)
waiting_in_a_collective()
"""


def test_a_worker_that_outlives_its_sigterm_writes_its_stacks_before_its_sigkill() -> None:
    worker = subprocess.Popen([sys.executable, "-c", HUNG_WORKER], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        handler = WarmHandler(worker, 0)
        handler.close(signal.SIGTERM)
        assert worker.poll() is None  # ignored
        handler.close(signal.SIGKILL)
        _, stderr = worker.communicate(timeout=30)
    finally:
        worker.kill()
        worker.wait()
    assert worker.returncode == -signal.SIGKILL
    assert "Current thread" in stderr and "in waiting_in_a_collective" in stderr
