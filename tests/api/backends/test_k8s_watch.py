"""The watch caches (pods, anchors): they list, follow, list again after 410 Gone and stop at
once when the backend closes; a pass over quiet jobs asks the server nothing."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client import CoreV1Api

from api.backends.kubernetes.anchor import ISSUED_ANNOTATION, REPLICAS_KEY
from api.backends.kubernetes.backend import KubernetesBackend
from api.backends.kubernetes.calls import MERGE_PATCH
from api.settings import Settings
from tests.api.backends.k8s_fake import FakeApiServer
from tests.api.backends.test_kubernetes import NS, make_launch, running
from tests.support import observed, wait_for


def test_close_stops_a_long_watch_at_once(tmp_path: Path, kubeconfig: Path,
                                          fake_k8s: FakeApiServer) -> None:
    settings = Settings(data_dir=tmp_path / "data", backend="kubernetes",
                        k8s_kubeconfig=kubeconfig, k8s_watch_timeout=600)
    backend = KubernetesBackend.from_settings(settings)
    try:
        assert observed(backend, "job-00000000").present is False  # starts the watch
        # The pods' watch: the anchors' may come first, before the pods' list is synced.
        wait_for(lambda: any(r.query.get("watch") == "true" and r.path.endswith("/pods")
                             for r in fake_k8s.cluster.requests),
                 what="the pods' watch request", timeout=10)
        assert backend.watcher.synced.is_set()
    finally:
        started = time.monotonic()
        backend.close()
    assert time.monotonic() - started < 2.0  # not the 600 s the server would keep it open
    assert not backend.watcher._thread.is_alive()


@pytest.fixture
def settings(tmp_path: Path, kubeconfig: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", backend="kubernetes", k8s_kubeconfig=kubeconfig,
                    k8s_watch_timeout=2)


@pytest.fixture
def backend(settings: Settings) -> Iterator[KubernetesBackend]:
    made = KubernetesBackend.from_settings(settings)
    yield made
    made.close()


def asked(fake_k8s: FakeApiServer, since: int) -> Counter[tuple[str, str]]:
    """The requests served since then but the watches' renewals, by (verb, resource)."""
    served = fake_k8s.cluster.served(since)
    return Counter({key: n for key, n in served.items() if key[0] != "watch"})


def replicas_cached(backend: KubernetesBackend, job_id: str) -> str:
    owner = backend.anchors.cache.get(job_id)
    return "" if owner is None else str(owner["data"][REPLICAS_KEY])


def test_passes_over_quiet_jobs_ask_the_server_nothing(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    jobs = ["job-0000000a", "job-0000000b", "job-0000000c"]
    for job_id in jobs:
        backend.launch(make_launch(settings, job_id=job_id))
    for job_id in jobs:
        running(backend, job_id)
        observed(backend, job_id)  # the tally of the pods seen is on the anchor now
    before = len(fake_k8s.cluster.requests)
    for _ in range(5):
        for job_id in jobs:
            assert observed(backend, job_id).present
        assert backend.active_jobs() == jobs
        assert not backend.gone(jobs[0])
    assert asked(fake_k8s, before) == Counter()

    # Someone else scales a job through the API: the next pass sees it, still asking nothing.
    before = len(fake_k8s.cluster.requests)
    CoreV1Api(backend.api).patch_namespaced_config_map(
        jobs[1], NS, {"data": {REPLICAS_KEY: "3"}}, _content_type=MERGE_PATCH)
    wait_for(lambda: replicas_cached(backend, jobs[1]) == "3", what="the watch to show it",
             timeout=10)
    assert len(observed(backend, jobs[1]).pods) == 3
    # Theirs, then the pass's: the new pod's incarnation recorded on the anchor, and the pod.
    assert asked(fake_k8s, before) == Counter({("patch", "configmaps"): 2,
                                               ("create", "pods"): 1})


def test_the_anchors_watch_lists_again_after_410_gone(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    launch = make_launch(settings)
    backend.launch(launch)
    running(backend, launch.job_id)
    lists = fake_k8s.cluster.served()[("list", "configmaps")]
    with fake_k8s.cluster.store.changed:
        fake_k8s.cluster.store.compact()  # the watches' resourceVersions are now too old
    wait_for(lambda: backend.anchors.cache.relists >= 1 and backend.anchors.cache.synced.is_set(),
             what="the anchors' watch to list again", timeout=10)
    assert fake_k8s.cluster.served()[("list", "configmaps")] == lists + 1
    # A change after the new list comes through the new watch, from the list's version.
    CoreV1Api(backend.api).patch_namespaced_config_map(
        launch.job_id, NS, {"data": {REPLICAS_KEY: "1"}}, _content_type=MERGE_PATCH)
    wait_for(lambda: replicas_cached(backend, launch.job_id) == "1",
             what="the new watch to show the change", timeout=10)
    before = len(fake_k8s.cluster.requests)
    assert [p.ordinal for p in backend.status(launch.job_id).pods] == [0]
    assert ("get", "configmaps") not in asked(fake_k8s, before)
    watches = [r for r in fake_k8s.cluster.requests
               if r.verb == "watch" and r.resource == "configmaps"]
    assert len({w.query["resourceVersion"] for w in watches}) == len(watches)


def test_a_pass_sees_our_own_writes_while_the_anchors_watch_lags(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    launch = make_launch(settings)
    backend.launch(launch)
    running(backend, launch.job_id)
    cache, keep = backend.anchors.cache, backend.anchors.cache._keep
    # The anchors' watch shows nothing from now on; only our own writes reach the cache.
    monkeypatch.setattr(cache, "_keep", lambda obj: None if threading.current_thread().name
                        == "k8s-configmap-watch" else keep(obj))
    for replicas in (3, 4):
        backend.scale(launch.job_id, replicas)
        assert len(observed(backend, launch.job_id).pods) == replicas
    # Each new pod's incarnation was recorded from the anchor as we last wrote it: no conflict.
    issued = fake_k8s.cluster.get("configmaps", NS, launch.job_id)["metadata"]["annotations"]
    assert issued[ISSUED_ANNOTATION] == "2"
    assert fake_k8s.cluster.trainer(launch.job_id, 3)["metadata"]["name"] == f"{launch.job_id}-3-2"
    fake_k8s.cluster.collect_garbage = False  # look at it while it is being deleted
    backend.delete(launch.job_id)
    deleting = observed(backend, launch.job_id)  # no pass acts on a job being deleted
    assert (deleting.present, deleting.finished) == (True, False)
    assert backend.active_jobs() == []
