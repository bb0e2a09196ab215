"""KubernetesBackend with the real `kubernetes` client against the fake API server."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.backends.base import (
    BackendError,
    Launch,
    PlacementError,
    StagingRequest,
    WorkloadConflict,
    WorkloadNotFound,
    WorkloadStatus,
)
from api.backends.kubernetes.anchor import (
    INCARNATIONS_ANNOTATION,
    ISSUED_ANNOTATION,
    REPLICAS_KEY,
    TEMPLATE_KEY,
    anchor,
)
from api.backends.kubernetes.backend import KubernetesBackend, cluster_config
from api.backends.kubernetes.coordinator import coordinator_deployment, coordinator_service
from api.backends.kubernetes.initializer_job import job_name
from api.backends.kubernetes.labels import (
    ALL_TRAINERS,
    JOB_LABEL,
    ORDINAL_LABEL,
    REPLACES_LABEL,
    owned_by,
)
from api.backends.kubernetes.network import headless_service, network_policy
from api.backends.kubernetes.pods import PLACEMENT_GATE, trainer_pod
from api.backends.kubernetes.secret import secret
from api.backends.kubernetes.template import TERMINATION_GRACE
from api.settings import Settings
from tests.api.backends.k8s_fake import FakeApiServer
from tests.conftest import ROOT
from tests.support import observed, wait_for
from trainer.contract.spec import JobSpec
from trainer.contract.staged import staging_id

NS = "live-migrator"
BUDGET = 3


@pytest.fixture
def settings(tmp_path: Path, kubeconfig: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", backend="kubernetes", k8s_kubeconfig=kubeconfig,
                    k8s_trainer_image="registry.example/trainer:1.2.3", restart_budget=BUDGET,
                    k8s_watch_timeout=2)


@pytest.fixture
def backends(settings: Settings) -> Iterator[Callable[[], KubernetesBackend]]:
    """Backend instances (a second one is a restarted control plane); all closed afterwards."""
    made: list[KubernetesBackend] = []

    def make() -> KubernetesBackend:
        made.append(KubernetesBackend.from_settings(settings))
        return made[-1]

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def backend(backends: Callable[[], KubernetesBackend]) -> KubernetesBackend:
    return backends()


def make_launch(settings: Settings, job_id: str = "job-0a1b2c3d", mode: str = "live",
                replicas: int = 2) -> Launch:
    directory = settings.jobs_dir / job_id
    return Launch(job_id=job_id, pods=replicas, fault_tolerance=mode,  # type: ignore[arg-type]
                  spec=JobSpec(replicas=replicas, fault_tolerance=mode),
                  report_url=f"http://api:8000/api/v1/jobs/{job_id}/reports",
                  report_token="token-" + job_id, peer_secret="heal-" + job_id,
                  checkpoint_dir=directory / "checkpoints",
                  model_dir=directory / "model", inputs_dir=settings.resolved_inputs_dir,
                  cache_dir=settings.cache_dir)


def running(backend: KubernetesBackend, job_id: str) -> WorkloadStatus:
    """Wait until every pod of the job runs; its status then."""
    result: WorkloadStatus = wait_for(
        lambda: (s := observed(backend, job_id)).pods and all(p.phase == "Running" for p in s.pods)
        and s, what=f"the pods of {job_id} to run", timeout=20)
    return result


def pod_status(backend: KubernetesBackend, job_id: str, ordinal: int,
               check: Callable[[Any], bool], what: str) -> WorkloadStatus:
    result: WorkloadStatus = wait_for(
        lambda: (s := observed(backend, job_id)).pods and check(s.pods[ordinal]) and s, what=what,
        timeout=20)
    return result


def pod_of(fake_k8s: FakeApiServer, job_id: str, ordinal: int) -> dict[str, Any]:
    return fake_k8s.cluster.trainer(job_id, ordinal)


def name_of(fake_k8s: FakeApiServer, job_id: str, ordinal: int) -> str:
    return str(fake_k8s.cluster.trainer(job_id, ordinal)["metadata"]["name"])


def test_launch_creates_exactly_the_expected_objects(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    launch = make_launch(settings)
    backend.launch(launch)
    cluster = cluster_config(settings)
    posts = [r for r in fake_k8s.cluster.requests if r.method == "POST"
             and "persistentvolumeclaims" not in r.path]
    owner = fake_k8s.cluster.get("configmaps", NS, launch.job_id)
    template = json.loads(owner["data"][TEMPLATE_KEY])
    # The exact bodies sent: the pure manifests, everything owned by the created anchor.
    assert [(r.path, r.body) for r in posts] == [
        (f"/api/v1/namespaces/{NS}/configmaps", anchor(launch, cluster)),
        (f"/api/v1/namespaces/{NS}/secrets",
         owned_by(secret(launch, cluster), owner)),
        (f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies",
         owned_by(network_policy(launch, cluster), owner)),
        (f"/api/v1/namespaces/{NS}/services",
         owned_by(headless_service(launch, cluster), owner)),
        (f"/apis/apps/v1/namespaces/{NS}/deployments",
         owned_by(coordinator_deployment(launch, cluster), owner)),
        (f"/api/v1/namespaces/{NS}/services",
         owned_by(coordinator_service(launch, cluster), owner)),
        *[(f"/api/v1/namespaces/{NS}/pods", trainer_pod(template, owner, ordinal, 0))
          for ordinal in range(2)]]
    assert posts[1].body["stringData"] == {"report-token": "token-job-0a1b2c3d",
                                           "peer-secret": "heal-job-0a1b2c3d"}
    status = running(backend, launch.job_id)
    assert [(p.name, p.restarts) for p in status.pods] == [("job-0a1b2c3d-0", 0),
                                                            ("job-0a1b2c3d-1", 0)]
    assert status.present and not status.finished
    assert backend.active_jobs() == [launch.job_id]
    # Where the API reads checkpoints and the model: links to the job's PVC sub-directories.
    volumes = settings.resolved_volumes_dir
    assert launch.checkpoint_dir.resolve() == volumes / "checkpoints" / launch.job_id
    assert launch.model_dir.resolve() == volumes / "models" / launch.job_id / "model"
    assert (volumes / "checkpoints" / launch.job_id).is_dir()


def test_kill_deletes_the_pod_and_the_control_plane_replaces_it(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    launch = make_launch(settings)
    backend.launch(launch)
    running(backend, launch.job_id)
    old = pod_of(fake_k8s, launch.job_id, 1)["metadata"]
    backend.kill_pod(launch.job_id, 1, grace_seconds=0)
    delete = next(r for r in fake_k8s.cluster.requests if r.method == "DELETE")
    assert (delete.path, delete.query.get("gracePeriodSeconds")) == (
        f"/api/v1/namespaces/{NS}/pods/{old['name']}", "0")
    status = pod_status(backend, launch.job_id, 1,
                        lambda p: p.restarts == 1 and p.phase == "Running", "pod 1 to rerun")
    assert status.pods[0].restarts == 0
    assert status.pods[1].name == "job-0a1b2c3d-1"  # its identity stays
    assert status.pods[1].incarnation == "1"  # the job's next incarnation
    assert name_of(fake_k8s, launch.job_id, 1) == "job-0a1b2c3d-1-1"
    event = next(r.body for r in fake_k8s.cluster.requests if r.path.endswith("/events"))
    assert (event["reason"], event["involvedObject"]["uid"]) == ("FailureInjected", old["uid"])
    # The tally is saved on the anchor for a restarted control plane.
    annotations = fake_k8s.cluster.get("configmaps", NS, launch.job_id)["metadata"][
        "annotations"]
    assert '"base":1' in annotations[INCARNATIONS_ANNOTATION]
    assert annotations[ISSUED_ANNOTATION] == "1"


def test_a_pass_never_creates_a_pod_twice_while_the_watch_lags(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    launch = make_launch(settings)
    backend.launch(launch)
    running(backend, launch.job_id)
    killed = name_of(fake_k8s, launch.job_id, 1)
    backend.kill_pod(launch.job_id, 1, grace_seconds=0)
    wait_for(lambda: killed not in {p["metadata"]["name"] for p in backend.watcher.pods(
        JOB_LABEL, launch.job_id)}, what="the watch to show the kill", timeout=10)
    stale = backend.watcher.pods(JOB_LABEL, launch.job_id)
    # The watch lags: it shows none of what the passes below do.
    monkeypatch.setattr(backend.watcher, "pods", lambda label, value: stale)
    for _ in range(3):
        observed(backend, launch.job_id)
    ordinal_1 = [p for p in fake_k8s.cluster.store.items("pods", NS)
                 if p["metadata"]["labels"].get(ORDINAL_LABEL) == "1"]
    assert [p["metadata"]["name"] for p in ordinal_1] == [f"{launch.job_id}-1-1"]
    with pytest.raises(WorkloadConflict, match="being replaced"):
        backend.migrate_pod(launch.job_id, 1, None)
    monkeypatch.undo()
    pod_status(backend, launch.job_id, 1, lambda p: p.phase == "Running" and p.incarnation == "1",
               "the one replacement to run")


def test_a_pod_newer_than_a_passs_view_is_not_counted_as_gone(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake_k8s.cluster.ready_on_start = False  # the replacement stays beside the pod
    launch = make_launch(settings)
    backend.launch(launch)
    running(backend, launch.job_id)
    before = backend.watcher.pods(JOB_LABEL, launch.job_id)
    backend.migrate_pod(launch.job_id, 0, None)
    surge = name_of(fake_k8s, launch.job_id, 0)
    wait_for(lambda: surge in {p["metadata"]["name"] for p in backend.watcher.pods(
        JOB_LABEL, launch.job_id)}, what="the watch to show the replacement",
        timeout=10)
    # A pass whose view of the pods was taken just before the replacement showed up.
    monkeypatch.setattr(backend.watcher, "pods", lambda label, value: before)
    assert observed(backend, launch.job_id).pods[0].restarts == 0
    monkeypatch.undo()
    assert observed(backend, launch.job_id).pods[0].restarts == 0


def test_scale_patches_the_anchor_and_the_control_plane_follows(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    launch = make_launch(settings, replicas=2)
    backend.launch(launch)
    running(backend, launch.job_id)
    backend.scale(launch.job_id, 3)
    patch = [r for r in fake_k8s.cluster.requests if r.method == "PATCH"][-1]
    assert (patch.path, patch.body) == (
        f"/api/v1/namespaces/{NS}/configmaps/{launch.job_id}",
        {"data": {REPLICAS_KEY: "3"}})
    pod_status(backend, launch.job_id, 2, lambda p: p.phase == "Running", "pod 2 to run")

    backend.scale(launch.job_id, 1)
    leaving = [pod_of(fake_k8s, launch.job_id, o)["metadata"]["name"] for o in (1, 2)]
    # Observing acts on nothing: no pod is deleted (or anything written) until a reconcile.
    sent = len(fake_k8s.cluster.requests)
    assert [p.ordinal for p in backend.status(launch.job_id).pods] == [0]
    assert [r.method for r in fake_k8s.cluster.requests[sent:]
            if r.method not in ("GET", "WATCH")] == []
    assert not any(fake_k8s.cluster.pod(n)["metadata"].get("deletionTimestamp")
                   for n in leaving)
    backend.reconcile(launch.job_id)  # the pass that deletes them
    # The pods scaled away get their grace period (SIGTERM: they leave gracefully).
    deleting = fake_k8s.cluster.pod(leaving[1])["metadata"]
    assert deleting["deletionGracePeriodSeconds"] == TERMINATION_GRACE
    wait_for(lambda: not any(fake_k8s.cluster.store.find("pods", NS, n) for n in leaving),
             timeout=10, what="pods 1 and 2 to be gone")
    status = observed(backend, launch.job_id)
    assert [(p.ordinal, p.restarts) for p in status.pods] == [(0, 0)] and status.present
    with pytest.raises(WorkloadNotFound, match="job-ffffffff"):
        backend.scale("job-ffffffff", 2)


def test_a_live_migration_makes_the_replacement_before_it_breaks_the_pod(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    fake_k8s.cluster.ready_on_start = False  # ready once told: a trainer that took part
    launch = make_launch(settings)
    backend.launch(launch)
    running(backend, launch.job_id)
    old = pod_of(fake_k8s, launch.job_id, 1)
    moving = backend.migrate_pod(launch.job_id, 1, None)
    assert (moving.incarnation, moving.node) == ("0", old["spec"]["nodeName"])
    surge = pod_of(fake_k8s, launch.job_id, 1)
    assert surge["metadata"]["labels"][REPLACES_LABEL] == "0"
    assert surge["spec"]["hostname"] == old["spec"]["hostname"] == "job-0a1b2c3d-1"
    status = pod_status(backend, launch.job_id, 1, lambda p: p.migrating, "the migration")
    assert status.pods[1].incarnation == "0"  # the old one is the pod until the new takes part
    with pytest.raises(WorkloadConflict, match="already migrating"):
        backend.migrate_pod(launch.job_id, 1, None)
    wait_for(lambda: fake_k8s.cluster.pod(surge["metadata"]["name"])["status"].get("podIP"),
             what="the replacement to run", timeout=10)
    for _ in range(3):  # not ready: both run on
        assert fake_k8s.cluster.store.find("pods", NS, old["metadata"]["name"]) is not None
        assert observed(backend, launch.job_id).pods[1].migrating

    fake_k8s.cluster.set_ready(surge["metadata"]["name"])
    status = pod_status(backend, launch.job_id, 1,
                        lambda p: not p.migrating and p.incarnation == "1" and
                        fake_k8s.cluster.store.find("pods", NS, old["metadata"]["name"]) is None,
                        "the old pod to leave")
    moved = status.pods[1]
    assert moved.node is not None and moved.node != old["spec"]["nodeName"]  # another node
    assert (moved.phase, moved.restarts) == ("Running", 0)  # it left gracefully: no restart
    deleted = [r for r in fake_k8s.cluster.requests if r.method == "DELETE"]
    assert [(r.path.rsplit("/", 1)[1], r.query.get("gracePeriodSeconds")) for r in deleted] == [
        (old["metadata"]["name"], str(TERMINATION_GRACE))]


def test_a_migration_goes_to_the_named_node_or_gives_up(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    launch = make_launch(settings, replicas=1)
    backend.launch(launch)
    running(backend, launch.job_id)
    here = pod_of(fake_k8s, launch.job_id, 0)["spec"]["nodeName"]
    with pytest.raises(PlacementError, match=f"already runs on node {here}"):
        backend.migrate_pod(launch.job_id, 0, here)
    there = next(node for node in fake_k8s.cluster.nodes if node != here)
    backend.migrate_pod(launch.job_id, 0, there)
    status = pod_status(backend, launch.job_id, 0, lambda p: p.node == there and p.incarnation
                        == "1" and not p.migrating, "the pod to move to the named node")
    assert status.pods[0].restarts == 0

    # A node no pod can go to: the replacement stays unschedulable, and is given up.
    backend.controller.migration_timeout = 0.5  # from here on, a replacement is given up soon
    backend.migrate_pod(launch.job_id, 0, "node-nowhere")
    stuck = pod_of(fake_k8s, launch.job_id, 0)
    assert stuck["metadata"]["labels"][REPLACES_LABEL] == "1"
    wait_for(lambda: fake_k8s.cluster.pod(stuck["metadata"]["name"])["status"].get(
        "conditions", [{}])[0].get("reason") == "Unschedulable", what="the scheduler to refuse",
        timeout=10)
    status = pod_status(backend, launch.job_id, 0, lambda p: not p.migrating,
                        "the stuck replacement to be deleted")
    assert (status.pods[0].incarnation, status.pods[0].node) == ("1", there)
    with pytest.raises(WorkloadNotFound, match="has no pod 3"):
        backend.migrate_pod(launch.job_id, 3, None)


def test_a_restart_mode_migration_starts_the_replacement_once_the_pod_is_gone(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    launch = make_launch(settings, mode="restart")
    backend.launch(launch)
    running(backend, launch.job_id)
    fake_k8s.cluster.max_grace = 1.0  # the emergency checkpoint takes a moment
    old = pod_of(fake_k8s, launch.job_id, 0)
    backend.migrate_pod(launch.job_id, 0, None)
    held = pod_of(fake_k8s, launch.job_id, 0)
    assert held["spec"]["schedulingGates"] == [{"name": PLACEMENT_GATE}]
    assert fake_k8s.cluster.pod(old["metadata"]["name"])["metadata"]["deletionTimestamp"]
    assert observed(backend, launch.job_id).pods[0].phase != "Failed"
    assert not held["spec"].get("nodeName")  # no two pods of one ordinal at once
    status = pod_status(backend, launch.job_id, 0,
                        lambda p: p.incarnation == "1" and p.phase == "Running",
                        "the replacement to run")
    assert fake_k8s.cluster.store.find("pods", NS, old["metadata"]["name"]) is None
    assert status.pods[0].node != old["spec"]["nodeName"] and status.pods[0].restarts == 0

    # To a node that cannot take it: once given up, a pod that may go anywhere replaces it.
    backend.controller.migration_timeout = 0.5  # from here on, a replacement is given up soon
    backend.migrate_pod(launch.job_id, 0, "node-nowhere")
    status = pod_status(backend, launch.job_id, 0,
                        lambda p: p.incarnation == "3" and p.phase == "Running",
                        "a pod that may go anywhere to run")
    assert "affinity" not in pod_of(fake_k8s, launch.job_id, 0)["spec"]


def test_kill_with_grace_and_unknown_pods(backend: KubernetesBackend, settings: Settings,
                                          fake_k8s: FakeApiServer) -> None:
    launch = make_launch(settings, replicas=1)
    backend.launch(launch)
    running(backend, launch.job_id)
    first = name_of(fake_k8s, launch.job_id, 0)
    backend.kill_pod(launch.job_id, 0, grace_seconds=2.5)
    delete = [r for r in fake_k8s.cluster.requests if r.method == "DELETE"][-1]
    assert delete.query["gracePeriodSeconds"] == "3"
    # SIGTERM: the trainer leaves gracefully (exit 0) while the pod is deleted; a live job's
    # replacement starts at once, beside it. No restart is counted, nothing shows as Failed.
    phases: list[str] = []

    def replaced(pod: Any) -> bool:
        phases.append(pod.phase)
        return (pod.phase == "Running" and pod.incarnation == "1"
                and fake_k8s.cluster.store.find("pods", NS, first) is None)

    status = pod_status(backend, launch.job_id, 0, replaced, "pod 0 to be replaced")
    assert status.pods[0].restarts == 0 and "Failed" not in phases
    # One that ignores SIGTERM is killed at the end of its grace: that counts.
    fake_k8s.cluster.sigterm_exit[name_of(fake_k8s, launch.job_id, 0)] = 137
    backend.kill_pod(launch.job_id, 0, grace_seconds=1)
    pod_status(backend, launch.job_id, 0, lambda p: p.restarts == 1, "pod 0 to be recreated")
    with pytest.raises(WorkloadNotFound, match="has no pod 1"):
        backend.kill_pod(launch.job_id, 1, 0)
    with pytest.raises(WorkloadNotFound, match=f"configmap {NS}/job-ffffffff: 404"):
        backend.kill_pod("job-ffffffff", 0, 0)


def test_errors_keep_their_meaning(backend: KubernetesBackend, settings: Settings,
                                   fake_k8s: FakeApiServer) -> None:
    launch = make_launch(settings)
    backend.launch(launch)
    with pytest.raises(WorkloadConflict, match=f"create configmap {NS}/job-0a1b2c3d: 409"):
        backend.launch(launch)
    # A name the API server refuses (422, from its schema check) is a plain backend error.
    with pytest.raises(BackendError, match="422") as invalid:
        backend.launch(make_launch(settings, job_id="job-BAD"))
    assert not isinstance(invalid.value, WorkloadConflict | WorkloadNotFound)
    assert observed(backend, "job-nothing").present is False


def test_a_failed_launch_leaves_nothing_behind(backend: KubernetesBackend, settings: Settings,
                                               fake_k8s: FakeApiServer) -> None:
    launch = make_launch(settings, job_id="job-0000beef")
    fake_k8s.cluster.create("secrets", NS, {"apiVersion": "v1", "kind": "Secret",
                                            "metadata": {"name": "job-0000beef-report"}})
    with pytest.raises(WorkloadConflict, match=f"secret {NS}/job-0000beef-report"):
        backend.launch(launch)
    wait_for(lambda: not any(k[0] in ("configmaps", "pods", "services", "deployments")
                             for k in fake_k8s.cluster.store.objects),
             what="the half-made workload to be deleted", timeout=10)


def test_delete_is_foreground_keeps_volumes_and_is_idempotent(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    launch = make_launch(settings, mode="restart")
    backend.launch(launch)
    running(backend, launch.job_id)
    fake_k8s.cluster.collect_garbage = False  # look at it while it is being deleted
    backend.delete(launch.job_id)
    delete = [r for r in fake_k8s.cluster.requests if r.method == "DELETE"][-1]
    assert (delete.path, delete.query["propagationPolicy"]) == (
        f"/api/v1/namespaces/{NS}/configmaps/{launch.job_id}", "Foreground")
    with pytest.raises(WorkloadNotFound, match="being deleted"):
        backend.kill_pod(launch.job_id, 0, 0)
    # Still there while being deleted (the control plane decided already: no verdict).
    deleting = observed(backend, launch.job_id)
    assert (deleting.present, deleting.finished, len(deleting.pods)) == (True, False, 2)
    assert not backend.gone(launch.job_id)  # its pods may still write
    fake_k8s.cluster.collect_garbage = True
    wait_for(lambda: sorted({k[0] for k in fake_k8s.cluster.store.objects}) == [
        "persistentvolumeclaims"], what="every object but the PVCs to be gone", timeout=10)
    assert observed(backend, launch.job_id).present is False
    assert backend.gone(launch.job_id)
    backend.delete(launch.job_id)  # again: nothing to do, no error
    assert backend.active_jobs() == []
    assert launch.checkpoint_dir.resolve().is_dir()  # checkpoints stay on their volume


def test_oom_and_the_restart_budget(backend: KubernetesBackend, settings: Settings,
                                    fake_k8s: FakeApiServer) -> None:
    launch = make_launch(settings)
    backend.launch(launch)
    running(backend, launch.job_id)
    name = name_of(fake_k8s, launch.job_id, 0)
    fake_k8s.cluster.oom_kill(name)
    status = pod_status(backend, launch.job_id, 0, lambda p: p.restarts == 1, "the OOM restart")
    assert (status.pods[0].exit_code, status.pods[0].reason) == (137, "OOMKilled")
    for _ in range(BUDGET):
        fake_k8s.cluster.crash(name, exit_code=1)
    status = wait_for(lambda: (s := observed(backend, launch.job_id)).finished and s,
                      what="the budget to run out", timeout=20)
    assert status.reason == ("restart budget spent: pod job-0a1b2c3d-0 restarted 4 times, last "
                             "exit code 1 (Error)")
    assert not status.present


def test_bad_input_ends_the_job_instead_of_crash_looping(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    launch = make_launch(settings, replicas=1)
    backend.launch(launch)
    running(backend, launch.job_id)
    fake_k8s.cluster.crash_loop(name_of(fake_k8s, launch.job_id, 0), 2, message=(
        "2026-11-23 10:00:01,456 ERROR job=job-0a1b2c3d pod=job-0a1b2c3d-0 trainer: "
        "dataset 'missing.csv': not found under the inputs dir\n"))
    status = wait_for(lambda: (s := observed(backend, launch.job_id)).finished and s,
                      what="the bad input to end the job", timeout=20)
    assert status.reason == ("pod job-0a1b2c3d-0 failed: bad input: dataset 'missing.csv': "
                             "not found under the inputs dir")
    assert (status.pods[0].phase, status.pods[0].reason) == ("Failed", "CrashLoopBackOff")


def test_logs(backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    launch = make_launch(settings, replicas=1)
    backend.launch(launch)
    running(backend, launch.job_id)
    name = name_of(fake_k8s, launch.job_id, 0)
    fake_k8s.cluster.set_log(name, "".join(f"line {i}\n" for i in range(10)))
    assert backend.tail_logs(launch.job_id, 0, 3) == ["line 7", "line 8", "line 9"]
    log = [r for r in fake_k8s.cluster.requests if r.path.endswith("/log")][-1]
    assert log.query == {"container": "trainer", "tailLines": "3", "previous": "false"}
    fake_k8s.cluster.set_log(name, "")
    fake_k8s.cluster.set_log(name, "Traceback\nRuntimeError: boom\n", previous=True)
    fake_k8s.cluster.crash(name)
    assert backend.tail_logs(launch.job_id, 0, 5) == ["Traceback", "RuntimeError: boom"]
    assert backend.tail_logs(launch.job_id, 7, 5) == []


def test_a_restarted_control_plane_re_adopts_and_goes_on_counting(
        backends: Callable[[], KubernetesBackend], settings: Settings,
        fake_k8s: FakeApiServer) -> None:
    first = backends()
    launch = make_launch(settings)
    first.launch(launch)
    running(first, launch.job_id)
    first.kill_pod(launch.job_id, 0, 0)
    pod_status(first, launch.job_id, 0, lambda p: p.restarts == 1 and p.phase == "Running",
               "pod 0 to rerun")
    # The passes that follow count the new pod on the anchor (status shows it a pass earlier).
    rerun = pod_of(fake_k8s, launch.job_id, 0)["metadata"]["uid"]
    wait_for(lambda: first.reconcile(launch.job_id) or rerun in (fake_k8s.cluster.get(
        "configmaps", NS, launch.job_id)["metadata"].get("annotations") or {}).get(
        INCARNATIONS_ANNOTATION, ""), what="the tally to name pod 0's new pod", timeout=20)
    first.close()
    # While no control plane runs, pod 0 is deleted again and pod 1 restarts its container;
    # the next control plane replaces pod 0.
    fake_k8s.cluster.delete("pods", NS, name_of(fake_k8s, launch.job_id, 0), 0, None)
    fake_k8s.cluster.crash(name_of(fake_k8s, launch.job_id, 1))
    second = backends()
    assert second.active_jobs() == [launch.job_id]
    status = pod_status(second, launch.job_id, 0, lambda p: p.phase == "Running",
                        "pod 0 to run")
    assert [p.restarts for p in status.pods] == [2, 1]


def test_watch_recovers_from_410_gone(backend: KubernetesBackend, settings: Settings,
                                      fake_k8s: FakeApiServer) -> None:
    launch = make_launch(settings)
    backend.launch(launch)
    running(backend, launch.job_id)
    with fake_k8s.cluster.store.changed:
        fake_k8s.cluster.store.compact()  # the watch's resourceVersion is now too old
    wait_for(lambda: backend.watcher.relists >= 1, what="the watch to list again", timeout=10)
    backend.kill_pod(launch.job_id, 1, 0)
    pod_status(backend, launch.job_id, 1, lambda p: p.restarts == 1 and p.phase == "Running",
               "the kill to be seen through the new watch")
    lists = [r for r in fake_k8s.cluster.requests if r.path.endswith("/pods")
             and r.method == "GET" and r.query.get("watch") != "true"]
    assert len(lists) >= 2  # the first list and the one after 410
    watches = [r for r in fake_k8s.cluster.requests if r.path.endswith("/pods")
               and r.query.get("watch") == "true"]
    assert all(w.query["labelSelector"] == ALL_TRAINERS for w in watches)
    assert {w.query["timeoutSeconds"] for w in watches} == {"2"}
    # Resumed watches start from the last version seen, not from a fresh list.
    assert len({w.query["resourceVersion"] for w in watches}) == len(watches)


def verbs_used(requests: list[Any]) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of each request, as the API server authorizes it."""
    used = set()
    for request in requests:
        parts = request.path.strip("/").split("/")
        group = parts[1] if parts[0] == "apis" else ""
        rest = parts[parts.index("namespaces") + 2:]
        resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
        verb = {"POST": "create", "PATCH": "patch", "DELETE": "delete"}.get(request.method)
        if verb is None:
            verb = "get" if len(rest) > 1 else (
                "watch" if request.query.get("watch") == "true" else "list")
        used.add((group, resource, verb))
    return used


def test_the_role_grants_exactly_the_verbs_the_backend_uses(
        backends: Callable[[], KubernetesBackend], settings: Settings,
        fake_k8s: FakeApiServer) -> None:
    first = backends()
    for mode, job_id in (("live", "job-0000000a"), ("restart", "job-0000000b")):
        first.launch(make_launch(settings, job_id=job_id, mode=mode))
        running(first, job_id)
    first.kill_pod("job-0000000a", 0, 0)
    pod_status(first, "job-0000000a", 0, lambda p: p.restarts == 1 and p.phase == "Running",
               "the recreated pod")
    first.migrate_pod("job-0000000b", 1, None)  # restart mode: its replacement's gate
    pod_status(first, "job-0000000b", 1, lambda p: p.incarnation == "1" and p.phase == "Running",
               "the migrated pod")
    fake_k8s.cluster.set_log(name_of(fake_k8s, "job-0000000a", 0), "hello\n")
    assert first.tail_logs("job-0000000a", 0, 5) == ["hello"]
    assert first.active_jobs() == ["job-0000000a", "job-0000000b"]
    first.delete("job-0000000b")
    staging = StagingRequest(staging_id("model", "acme/bert"), "model", "acme/bert", "main",
                             settings.resolved_inputs_dir, settings.data_dir / "staging.log")
    first.stage(staging)
    assert first.staging(staging.staging_id)
    fake_k8s.cluster.fail_job(job_name(staging.staging_id))
    first.stage(staging)  # 409: the failed one is read, deleted and created anew
    cluster_setup = [r for r in fake_k8s.cluster.requests if "persistentvolumeclaims" in r.path]
    used = verbs_used([r for r in fake_k8s.cluster.requests if r not in cluster_setup])
    role = next(d for d in yaml.safe_load_all((ROOT / "k8s/base/rbac.yaml").read_text())
                if d["kind"] == "Role")
    granted = {(group, resource, verb) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    # Owner references with blockOwnerDeletion are authorized as an update of the owner's
    # finalizers (where that admission plugin runs); no request of ours names it.
    implicit = {("", "configmaps/finalizers", "update")}
    assert used == granted - implicit

