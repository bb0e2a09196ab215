"""The optimizer's state as a heal delivers it: the per-parameter part may arrive later."""

from __future__ import annotations

import copy
from concurrent.futures import Future
from typing import Any

import pytest
import torch
from torch import nn

from trainer.schedule import OptimizerLoader, start_state


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


@pytest.mark.parametrize("options", [{"fused": True}, {"fused": False},
                                     {"fused": False, "amsgrad": True}])
def test_a_state_started_ahead_is_the_one_torch_starts_and_trains_the_same(
        options: dict[str, Any]) -> None:
    def trained(ahead: bool) -> tuple[nn.Linear, torch.optim.Optimizer, list[dict[str, Any]]]:
        torch.manual_seed(0)
        layer = nn.Linear(4, 2)
        optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1, **options)
        if ahead:
            start_state(optimizer)
        started = [copy.deepcopy(optimizer.state[p]) for p in layer.parameters()]
        for _ in range(3):
            layer(torch.randn(3, 4)).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return layer, optimizer, started

    lazy, lazy_optimizer, nothing = trained(ahead=False)
    eager, eager_optimizer, started = trained(ahead=True)
    assert nothing == [{}, {}]
    for p, state in zip(eager.parameters(), started, strict=True):
        assert state["step"].item() == 0
        assert all(torch.equal(state[name], torch.zeros_like(p)) for name in state
                   if name != "step")
    for a, b in zip(lazy.parameters(), eager.parameters(), strict=True):
        assert torch.equal(a, b)  # bitwise: the same updates
        first, second = lazy_optimizer.state[a], eager_optimizer.state[b]
        assert first.keys() == second.keys()
        for name in first:
            assert (first[name].dtype, first[name].device, first[name].shape) == (
                second[name].dtype, second[name].device, second[name].shape)
            assert torch.equal(first[name], second[name])


def test_a_state_already_there_is_left_as_it_is() -> None:
    _, optimizer = stepped_optimizer()
    before = copy.deepcopy(optimizer.state_dict())
    start_state(optimizer)
    after = optimizer.state_dict()
    assert all(torch.equal(before["state"][i][name], after["state"][i][name])
               for i in before["state"] for name in before["state"][i])


def test_an_optimizer_other_than_adam_is_left_without_state() -> None:
    optimizer = torch.optim.SGD(nn.Linear(4, 2).parameters(), lr=0.1)
    start_state(optimizer)
    assert not optimizer.state
