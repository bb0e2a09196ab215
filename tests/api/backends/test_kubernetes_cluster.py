"""OPT-IN: the backend lifecycle against a real cluster. Skipped unless KUBECONFIG is set.

Needs, in the namespace of MIGRATOR_K8S_NAMESPACE (default `live-migrator`), what k8s/ creates
(`kubectl apply -k k8s/overlays/aks`: the shared PVCs), and a pullable trainer image in
MIGRATOR_K8S_TRAINER_IMAGE. The job is a small real training run; the test deletes it.
Completion is not waited for: the API side of the shared volumes is not mounted here.
Run: KUBECONFIG=~/.kube/config .venv/bin/python -m pytest -m cluster tests/api/backends -rs
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.backends.base import Launch, WorkloadStatus
from api.backends.kubernetes.backend import KubernetesBackend
from api.settings import Settings
from tests.support import observed, wait_for
from trainer.contract.spec import JobSpec

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"),
                       reason="opt-in real-cluster suite: set KUBECONFIG (and "
                              "MIGRATOR_K8S_NAMESPACE, MIGRATOR_K8S_TRAINER_IMAGE) to run it"),
]
STARTUP = 600.0  # image pulls and volume attachment on a real cluster


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", backend="kubernetes",
                    k8s_kubeconfig=Path(os.environ["KUBECONFIG"]), k8s_pod_cpu="1",
                    k8s_pod_memory="3Gi")


@pytest.fixture
def backend(settings: Settings) -> Iterator[KubernetesBackend]:
    made = KubernetesBackend.from_settings(settings)
    yield made
    made.close()


def all_running(backend: KubernetesBackend, job_id: str) -> WorkloadStatus:
    status: WorkloadStatus = wait_for(
        lambda: (s := observed(backend, job_id)).pods and all(p.phase == "Running" for p in s.pods)
        and s, what="the pods to run", timeout=STARTUP)
    return status


def test_lifecycle_on_a_real_cluster(backend: KubernetesBackend, settings: Settings) -> None:
    job_id = f"job-{secrets.token_hex(4)}"
    directory = settings.jobs_dir / job_id
    launch = Launch(job_id=job_id, pods=2, fault_tolerance="restart",
                    spec=JobSpec(replicas=2, fault_tolerance="restart", max_train_samples=2000,
                                 epochs=3),
                    report_url=f"http://migrator-api:8000/api/v1/jobs/{job_id}/reports",
                    report_token=secrets.token_urlsafe(32), checkpoint_dir=directory / "ckpt",
                    model_dir=directory / "model", inputs_dir=settings.resolved_inputs_dir,
                    cache_dir=settings.cache_dir, peer_secret=secrets.token_urlsafe(32))
    backend.launch(launch)
    try:
        all_running(backend, job_id)
        assert job_id in backend.active_jobs()
        backend.kill_pod(job_id, 1, grace_seconds=0)
        wait_for(lambda: (s := observed(backend, job_id)).pods[1].restarts >= 1
                 and s.pods[1].phase == "Running", what="pod 1 to be recreated", timeout=STARTUP)
        assert backend.tail_logs(job_id, 1, 50)
        second = KubernetesBackend.from_settings(settings)  # a restarted control plane
        try:
            assert job_id in second.active_jobs()
            assert observed(second, job_id).pods[1].restarts >= 1
        finally:
            second.close()
        # Scale up, then down: the pod scaled away leaves on its SIGTERM, so no pod's restart
        # count moves and the ordinal is gone.
        restarts = [p.restarts for p in observed(backend, job_id).pods]
        backend.scale(job_id, 3)
        all_running(backend, job_id)
        backend.scale(job_id, 2)
        scaled: WorkloadStatus = wait_for(
            lambda: len((s := observed(backend, job_id)).pods) == 2 and s, what="the scale-down",
            timeout=STARTUP)
        assert [p.restarts for p in scaled.pods] == restarts
        # Migrate pod 0 off its node (restart mode: it checkpoints and its replacement starts
        # elsewhere once it is gone); a one-node cluster has nowhere to send it.
        before = observed(backend, job_id).pods[0]
        backend.migrate_pod(job_id, 0, None)
        moved: WorkloadStatus = wait_for(
            lambda: (s := observed(backend, job_id)).pods[0].incarnation != before.incarnation
            and s.pods[0].phase == "Running" and s, what="pod 0 to migrate", timeout=STARTUP)
        assert moved.pods[0].restarts == before.restarts
    finally:
        backend.delete(job_id)
    wait_for(lambda: job_id not in backend.active_jobs(),
             what="the workload to be deleted", timeout=120)
    assert not observed(backend, job_id).present
