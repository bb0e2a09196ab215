"""The pod watch thread: it lists, follows, and stops at once when the backend closes."""

from __future__ import annotations

import time
from pathlib import Path

from api.backends.kubernetes.backend import KubernetesBackend
from api.settings import Settings
from tests.api.backends.k8s_fake import FakeApiServer
from tests.support import observed, wait_for


def test_close_stops_a_long_watch_at_once(tmp_path: Path, kubeconfig: Path,
                                          fake_k8s: FakeApiServer) -> None:
    settings = Settings(data_dir=tmp_path / "data", backend="kubernetes",
                        k8s_kubeconfig=kubeconfig, k8s_watch_timeout=600)
    backend = KubernetesBackend.from_settings(settings)
    try:
        assert observed(backend, "job-00000000").present is False  # starts the watch
        wait_for(lambda: any(r.query.get("watch") == "true" for r in fake_k8s.cluster.requests),
                 what="the watch request", timeout=10)
        assert backend.watcher.synced.is_set()
    finally:
        started = time.monotonic()
        backend.close()
    assert time.monotonic() - started < 2.0  # not the 600 s the server would keep it open
    assert not backend.watcher._thread.is_alive()
