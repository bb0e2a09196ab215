from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.backends.k8s_fake import FakeApiServer, FakeCluster


@pytest.fixture
def fake_k8s() -> Iterator[FakeApiServer]:
    """A fake Kubernetes API server on 127.0.0.1, with the namespace's shared PVCs."""
    server = FakeApiServer(FakeCluster())
    for claim in ("migrator-data", "migrator-checkpoints", "migrator-models"):
        server.cluster.create("persistentvolumeclaims", "live-migrator", {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
            "spec": {"accessModes": ["ReadWriteMany"],
                     "resources": {"requests": {"storage": "10Gi"}}}})
    yield server
    server.stop()


@pytest.fixture
def kubeconfig(fake_k8s: FakeApiServer, tmp_path: Path) -> Path:
    return fake_k8s.write_kubeconfig(tmp_path / "kubeconfig")
