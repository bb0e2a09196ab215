"""The restart-mode pod agent's choices made from its environment
(trainer.fault_tolerance.elastic)."""

from __future__ import annotations

import json

import pytest

from trainer.contract.runtime import SPEC_ENV
from trainer.contract.spec import JobSpec
from trainer.fault_tolerance.elastic import warm_worker_wanted

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
