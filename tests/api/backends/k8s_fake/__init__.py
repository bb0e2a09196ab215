"""An in-process fake Kubernetes API server that the real `kubernetes` client talks to."""

from tests.api.backends.k8s_fake.cluster import FakeCluster, Request
from tests.api.backends.k8s_fake.server import FakeApiServer
from tests.api.backends.k8s_fake.store import SCHEMA_VERSION, ApiError

__all__ = ["SCHEMA_VERSION", "ApiError", "FakeApiServer", "FakeCluster", "Request"]
