"""Pod bodies as the Kubernetes API returns them -> the protocol's pod view and job verdicts."""

from __future__ import annotations

from typing import Any

import pytest

from api.backends.kubernetes.labels import INCARNATION_LABEL, ORDINAL_LABEL, REPLACES_LABEL
from api.backends.kubernetes.status import (
    Incarnations,
    dump_incarnations,
    give_up_reason,
    last_line,
    load_incarnations,
    view,
)
from api.backends.kubernetes.watch import left_gracefully


def pod(name: str = "job-1-0-3", phase: str = "Running", state: dict[str, Any] | None = None,
        last: dict[str, Any] | None = None, restarts: int = 0, **metadata: Any) -> dict[str, Any]:
    """A trainer pod `<job>-<ordinal>-<incarnation>` with the labels the backend gives it."""
    container = {"name": "trainer", "restartCount": restarts,
                 "state": state if state is not None else {
                     "running": {"startedAt": "2026-11-23T10:00:00Z"}},
                 "lastState": last or {}}
    ordinal, incarnation = name.split("-")[-2:]
    return {"metadata": {"name": name, "uid": "uid-a",
                         "labels": {ORDINAL_LABEL: ordinal, INCARNATION_LABEL: incarnation},
                         **metadata},
            "spec": {"nodeName": "node-a"},
            "status": {"phase": phase, "containerStatuses": [container]}}


def test_running_pod() -> None:
    seen = view(pod())
    assert seen is not None
    assert (seen.ordinal, seen.phase, seen.container_restarts, seen.exit_code, seen.reason) == (
        0, "Running", 0, None, None)
    assert seen.started_at == 1795428000.0  # 2026-11-23T10:00:00Z


@pytest.mark.parametrize(("body", "phase", "exit_code", "reason"), [
    (pod(phase="Pending") | {"status": {"phase": "Pending"}}, "Pending", None, None),
    (pod(phase="Pending", state={"waiting": {"reason": "ContainerCreating"}}), "Pending", None,
     None),
    (pod(phase="Pending", state={"waiting": {"reason": "ImagePullBackOff"}}), "Pending", None,
     "ImagePullBackOff"),
    (pod(state={"waiting": {"reason": "CrashLoopBackOff"}}, restarts=3,
         last={"terminated": {"exitCode": 1, "reason": "Error"}}), "Failed", 1,
     "CrashLoopBackOff"),
    (pod(state={"waiting": {"reason": "CrashLoopBackOff"}}, restarts=3,
         last={"terminated": {"exitCode": 137, "reason": "OOMKilled"}}), "Failed", 137,
     "CrashLoopBackOff (OOMKilled)"),
    (pod(restarts=1, last={"terminated": {"exitCode": 137, "reason": "OOMKilled"}}), "Running",
     137, "OOMKilled"),
    (pod(state={"terminated": {"exitCode": 1, "reason": "Error"}}), "Failed", 1, "Error"),
    (pod(state={"terminated": {"exitCode": 0, "reason": "Completed"}}), "Succeeded", 0, None),
    (pod(phase="Succeeded", state={"terminated": {"exitCode": 0, "reason": "Completed"}}),
     "Succeeded", 0, None),
    (pod(phase="Failed", state={}) | {"status": {"phase": "Failed", "reason": "Evicted"}},
     "Failed", None, "Evicted"),
    (pod(phase="Unknown"), "Failed", None, "NodeLost"),
])
def test_phases_and_reasons(body: dict[str, Any], phase: str, exit_code: int | None,
                            reason: str | None) -> None:
    body.setdefault("metadata", {"name": "job-1-0", "uid": "u"})
    seen = view(body)
    assert seen is not None
    assert (seen.phase, seen.exit_code, seen.reason) == (phase, exit_code, reason)


def test_identity_from_the_labels() -> None:
    seen = view(pod("job-1-7-12"))
    assert seen is not None and (seen.ordinal, seen.incarnation, seen.node) == (7, 12, "node-a")
    assert seen.replaces is None and not seen.gated
    surge = pod("job-1-7-13")
    surge["metadata"]["labels"][REPLACES_LABEL] = "12"
    assert view(surge).replaces == 12  # type: ignore[union-attr]
    unlabelled = pod("job-1-4-0")
    del unlabelled["metadata"]["labels"]
    assert view(unlabelled) is None  # not one of ours
    assert view({"metadata": {"name": "job-1-lighthouse-5d8f9-x2x"}}) is None


def test_deleting_pod_is_marked() -> None:
    seen = view(pod(deletionTimestamp="2026-11-23T10:00:01Z"))
    assert seen is not None and seen.deleting and not seen.graceful
    seen = view(pod(deletionTimestamp="2026-11-23T10:00:01Z", deletionGracePeriodSeconds=30))
    assert seen is not None and seen.deleting and seen.graceful


def test_a_pod_that_left_on_its_deletions_sigterm_is_told_apart() -> None:
    ended = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    assert left_gracefully(pod(state=ended, deletionTimestamp="2026-11-23T10:00:01Z"))
    assert not left_gracefully(pod(state=ended))  # finished training: not a deletion
    killed = {"terminated": {"exitCode": 137, "reason": "Error"}}
    assert not left_gracefully(pod(state=killed, deletionTimestamp="2026-11-23T10:00:01Z"))
    assert not left_gracefully(pod(deletionTimestamp="2026-11-23T10:00:01Z"))  # still running


def test_incarnations_count_pods_that_ended_and_container_restarts_and_never_go_down() -> None:
    counter = Incarnations()
    assert counter.observe("a", 0) and counter.total == 0
    assert not counter.observe("a", 0) and not counter.settle({"a"})
    assert counter.observe("a", 2) and counter.total == 2  # two container restarts
    assert counter.observe("b", 0) and counter.total == 2  # its replacement, beside it
    assert counter.settle({"b"}) and counter.total == 3  # a is gone: its 2 + 1
    assert not counter.observe("b", 0)
    assert counter.observe("c", 1) and counter.settle({"c"}) and counter.total == 5
    assert counter.observe("c", 0) is False and counter.total == 5  # never down


def test_a_pod_that_left_gracefully_is_replaced_without_a_restart() -> None:
    counter = Incarnations()
    assert counter.observe("a", 1) and counter.total == 1
    assert counter.observe("b", 0)  # a migration's replacement, or a recreated pod
    assert counter.observe("a", 1, left=True) and not counter.observe("a", 1, left=True)
    assert counter.settle({"b"}) and counter.total == 1  # its restart, but none for leaving
    assert counter.settle(set()) and counter.total == 2  # b did not leave: it failed


def test_incarnations_survive_the_annotation() -> None:
    tally = {0: Incarnations(1, {"a": (2, False)}), 1: Incarnations(0, {"b": (0, True)})}
    assert load_incarnations(dump_incarnations(tally)) == tally
    assert load_incarnations(None) == {}
    assert load_incarnations("{not json") == {}
    assert load_incarnations('{"0": {"uid": "a", "base": 1, "count": 0}}') == {}  # the old


def test_bad_input_is_final() -> None:
    message = ("2026-11-23 10:00:00,123 INFO job=job-1 pod=job-1-0 trainer: loading\n"
               "2026-11-23 10:00:01,456 ERROR job=job-1 pod=job-1-0 trainer: dataset "
               "'missing.csv': no such file under the inputs dir\n\n")
    crashed = view(pod(state={"waiting": {"reason": "CrashLoopBackOff"}}, restarts=1,
                       last={"terminated": {"exitCode": 2, "reason": "Error",
                                            "message": message}}))
    assert crashed is not None
    assert give_up_reason([crashed], {0: 1}, budget=5) == (
        "pod job-1-0 failed: bad input: dataset 'missing.csv': no such file under the "
        "inputs dir")
    without = view(pod(state={"terminated": {"exitCode": 2}}))
    assert give_up_reason([without], {0: 0}, budget=5) == (  # type: ignore[list-item]
        "pod job-1-0 failed: bad input: exit code 2")


def test_restart_budget() -> None:
    oom = view(pod(restarts=1, last={"terminated": {"exitCode": 137, "reason": "OOMKilled"}}))
    assert oom is not None
    assert give_up_reason([oom], {0: 5}, budget=5) is None  # at the budget: still going
    assert give_up_reason([oom], {0: 6}, budget=5) == (
        "restart budget spent: pod job-1-0 restarted 6 times, last exit code 137 (OOMKilled)")


def test_last_line() -> None:
    assert last_line(None) is None
    launcher_after = ("2026-11-23 10:00:01,456 ERROR job=j pod=j-0 trainer: dataset 'x': gone\n"
                      "2026-11-23 10:00:02,000 INFO job=j pod=j-0 agent: workers exited\n"
                      "[E] workers failed with exit codes [2]\n")
    assert last_line(launcher_after) == "dataset 'x': gone"
    assert last_line("trainer: invalid configuration: epochs: must be at least 1\n") == \
        "trainer: invalid configuration: epochs: must be at least 1"
