"""Calls to the Kubernetes API server, their errors kept in the backend protocol's terms:
404 -> WorkloadNotFound, 409 -> WorkloadConflict, anything else -> BackendError, each naming
namespace/name."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from api.backends.base import BackendError, WorkloadConflict, WorkloadNotFound
from api.settings import Settings

T = TypeVar("T")
REQUEST_TIMEOUT = 30.0
MERGE_PATCH = "application/merge-patch+json"


def api_client(settings: Settings) -> client.ApiClient:
    """A client from the configured kubeconfig, else in-cluster, else $KUBECONFIG/~/.kube."""
    configuration = client.Configuration()
    try:
        if settings.k8s_kubeconfig is not None or settings.k8s_context is not None:
            config.load_kube_config(
                config_file=str(settings.k8s_kubeconfig) if settings.k8s_kubeconfig else None,
                context=settings.k8s_context, client_configuration=configuration)
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                config.load_kube_config(client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        raise BackendError(f"no Kubernetes configuration: {exc}") from None
    return client.ApiClient(configuration)


def describe(exc: ApiException) -> str:
    """Status code, reason and the Status message; never the request (a Secret's data)."""
    message = ""
    with contextlib.suppress(ValueError, AttributeError):
        message = json.loads(exc.body or "{}").get("message", "")
    return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")


def call(what: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run one API call; errors keep their status, wrapped with `what` (verb kind ns/name)."""
    kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
    try:
        return function(*args, **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            raise WorkloadNotFound(f"{what}: {describe(exc)}") from None
        if exc.status == 409:
            raise WorkloadConflict(f"{what}: {describe(exc)}") from None
        raise BackendError(f"{what}: {describe(exc)}") from None
    except (HTTPError, OSError) as exc:
        raise BackendError(f"{what}: Kubernetes API unreachable ({exc})") from None


def raw(what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """A call's JSON body as the server sent it (no model classes in between)."""
    response = call(what, function, *args, _preload_content=False, **kwargs)
    body: dict[str, Any] = json.loads(response.data)
    return body
