"""The optimizer's state as a heal delivers it: the per-parameter part may arrive later."""

from __future__ import annotations

import copy
from concurrent.futures import Future
from typing import Any

import pytest
import torch
from torch import nn

from trainer.schedule import OptimizerLoader


def stepped_optimizer() -> tuple[nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layer = nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1, fused=True)
    layer(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    return layer, optimizer


def fresh_optimizer() -> torch.optim.Optimizer:
    return torch.optim.AdamW(nn.Linear(4, 2).parameters(), lr=0.5, fused=True)


def test_moments_still_arriving_are_loaded_when_they_have_arrived() -> None:
    _, source = stepped_optimizer()
    state = copy.deepcopy(source.state_dict())
    optimizer = fresh_optimizer()
    loader = OptimizerLoader(optimizer)
    moments: Future[Any] = Future()
    loader.load({**state, "state": moments})
    assert optimizer.state_dict()["state"] == {}  # nothing loaded yet, lr included
    assert optimizer.param_groups[0]["lr"] == 0.5
    moments.set_result(state["state"])
    loader.arrived()
    loaded = optimizer.state_dict()
    assert optimizer.param_groups[0]["lr"] == 0.1
    for index, moment in state["state"].items():
        assert torch.equal(loaded["state"][index]["exp_avg"], moment["exp_avg"])
        assert torch.equal(loaded["state"][index]["exp_avg_sq"], moment["exp_avg_sq"])
    loader.arrived()  # once only: nothing is pending any more


def test_moments_that_never_arrive_end_the_pod_with_the_reason() -> None:
    _, source = stepped_optimizer()
    loader = OptimizerLoader(fresh_optimizer())
    moments: Future[Any] = Future()
    loader.load({**source.state_dict(), "state": moments})
    moments.set_exception(ConnectionResetError("the source died"))
    with pytest.raises(RuntimeError, match=r"did not arrive .*the source died"):
        loader.arrived()


def test_a_whole_state_loads_at_once_and_drops_one_still_arriving() -> None:
    _, source = stepped_optimizer()
    optimizer = fresh_optimizer()
    loader = OptimizerLoader(optimizer)
    loader.load({**source.state_dict(), "state": Future()})
    loader.load(copy.deepcopy(source.state_dict()))  # a resume, say, after the heal failed
    assert optimizer.state_dict()["state"].keys() == source.state_dict()["state"].keys()
    loader.arrived()  # the unfinished Future is no longer waited for
