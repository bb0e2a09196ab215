"""A list-then-watch cache of every trainer pod, fed by one background thread.

The thread lists the pods once, then watches from the list's resourceVersion and resumes each
renewed watch from the last resourceVersion it saw; when the server answers 410 Gone (that
version was compacted away) it starts again from a fresh list, as client-go's reflector does.
Besides the current pods it keeps, per key (the backend's is the ordinal's `<job>-<n>`), every
uid it saw since the last `take` with that pod's highest container restart count and whether it
left gracefully, so a pod deleted and recreated between two looks is still counted (or not,
when it left).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

logger = logging.getLogger(__name__)

HISTORY = 32
"""Uids remembered per pod name (far more than can happen between two status calls)."""
RETRY_SECONDS = 1.0
STOP_POLL_SECONDS = 0.05

Pod = dict[str, Any]


@dataclass(frozen=True)
class Seen:
    """What the watch saw of one pod uid."""

    restarts: int
    """Its highest container restart count."""
    left: bool
    """It was being deleted and its container ended with exit code 0: a trainer that left
    gracefully on the deletion's SIGTERM. Counted as no restart."""


def restart_count(pod: Pod) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return max((int(s.get("restartCount", 0)) for s in statuses), default=0)


def left_gracefully(pod: Pod) -> bool:
    """Whether the pod is being deleted and every container of it ended with exit code 0."""
    if not pod["metadata"].get("deletionTimestamp"):
        return False
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    ended = [(s.get("state") or {}).get("terminated") for s in statuses]
    return bool(ended) and all(e is not None and e.get("exitCode") == 0 for e in ended)


class PodWatcher:
    def __init__(self, core: client.CoreV1Api, namespace: str, label_selector: str,
                 timeout_seconds: int, key: Callable[[Pod], str | None],
                 on_change: Callable[[], None] | None = None) -> None:
        self.core, self.namespace, self.selector = core, namespace, label_selector
        self.key = key
        """What a pod's uids are kept under (None: not kept)."""
        self.timeout_seconds = timeout_seconds
        self.on_change = on_change
        self.synced = threading.Event()
        """Set while the cache reflects the server (after a list, until a watch error)."""
        self.relists = 0
        self._pods: dict[str, Pod] = {}
        self._uids: dict[str, OrderedDict[str, Seen]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name="k8s-pod-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        # Until the thread ends: a watch stopped while its request was still on its way opens
        # its response afterwards, and that response must be shut too.
        while self._thread.is_alive() and time.monotonic() < deadline:
            current = self._watch
            if current is not None:
                current.stop()
                # Watch.stop() shuts the connection's socket, which http.client has already
                # handed to the response when the server said `Connection: close`; urllib3
                # (2.3+) can shut the response's own socket, so the blocked read returns now.
                response = getattr(current, "_resp", None)
                with contextlib.suppress(AttributeError, ValueError, RuntimeError, OSError):
                    response.shutdown()  # type: ignore[union-attr]
            self._thread.join(STOP_POLL_SECONDS)

    def pods(self, label: str, value: str) -> list[Pod]:
        """Current pods whose label `label` is `value`."""
        with self._lock:
            return [pod for pod in self._pods.values()
                    if (pod["metadata"].get("labels") or {}).get(label) == value]

    def take(self, keys: list[str], label: str, value: str,
             ) -> tuple[dict[str, list[tuple[str, Seen]]], set[str]]:
        """Every uid seen under each key since the last call and what was seen of it (oldest
        first, each handed out once), and the uids of the current pods whose label `label` is
        `value`, at one instant: a uid handed out is current or its pod was deleted."""
        with self._lock:
            taken = {key: list(self._uids.pop(key, {}).items()) for key in keys}
            present = {pod["metadata"].get("uid", "") for pod in self._pods.values()
                       if (pod["metadata"].get("labels") or {}).get(label) == value}
        return taken, present

    def forget(self, job_id: str) -> None:
        """Drop the uids kept for a job's pods (its workload is gone)."""
        with self._lock:
            for name in [n for n in self._uids if n.rsplit("-", 1)[0] == job_id]:
                del self._uids[name]

    def remember(self, pods: list[Pod]) -> None:
        """Record pods listed directly (while the watch is not synced)."""
        with self._lock:
            for pod in pods:
                self._record(pod)

    def _record(self, pod: Pod) -> None:
        key, uid = self.key(pod), pod["metadata"].get("uid", "")
        if key is None:
            return
        seen = self._uids.setdefault(key, OrderedDict())
        before = seen.get(uid, Seen(0, False))
        seen[uid] = Seen(max(before.restarts, restart_count(pod)),
                         before.left or left_gracefully(pod))
        while len(seen) > HISTORY:
            seen.popitem(last=False)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version = self._list()
                while not self._stop.is_set():
                    version = self._watch_once(version)
            except ApiException as exc:
                if exc.status == 410:
                    self.relists += 1
                    logger.info("pod watch: resourceVersion expired (410 Gone); listing again")
                    continue
                self._failed(f"HTTP {exc.status} {exc.reason}")
            except (HTTPError, OSError, ValueError) as exc:
                self._failed(f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # the thread must outlive any surprise in a response
                logger.exception("pod watch: unexpected error")
                self._failed(f"{type(exc).__name__}: {exc}")

    def _failed(self, what: str) -> None:
        self.synced.clear()
        if not self._stop.is_set():
            logger.warning("pod watch in %s failed (%s); retrying in %.0f s", self.namespace,
                           what, RETRY_SECONDS)
            self._stop.wait(RETRY_SECONDS)

    def _list(self) -> str:
        # Not preloaded: the raw urllib3 response, whose JSON the cache keeps as it is.
        response: Any = self.core.list_namespaced_pod(
            self.namespace, label_selector=self.selector, _preload_content=False,
            _request_timeout=30)
        listing = json.loads(response.data)
        with self._lock:
            self._pods = {pod["metadata"]["name"]: pod for pod in listing.get("items") or []}
            for pod in self._pods.values():
                self._record(pod)
        self.synced.set()
        self._changed()
        version: str = listing["metadata"]["resourceVersion"]
        return version

    def _watch_once(self, version: str) -> str:
        """One watch request, until the server ends it (timeoutSeconds); the last version seen."""
        stream = watch.Watch()
        self._watch = stream
        try:
            for event in stream.stream(self.core.list_namespaced_pod, self.namespace,
                                       label_selector=self.selector, resource_version=version,
                                       timeout_seconds=self.timeout_seconds,
                                       allow_watch_bookmarks=True,
                                       _request_timeout=self.timeout_seconds + 30):
                pod = event["raw_object"]
                version = pod["metadata"].get("resourceVersion") or version
                if event["type"] == "BOOKMARK":
                    continue
                with self._lock:
                    if event["type"] == "DELETED":
                        self._pods.pop(pod["metadata"]["name"], None)
                    else:
                        self._pods[pod["metadata"]["name"]] = pod
                    self._record(pod)
                self._changed()
                if self._stop.is_set():
                    break
        finally:
            self._watch = None
        return version

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
