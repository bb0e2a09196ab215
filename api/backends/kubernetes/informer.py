"""A list-then-watch cache of one kind of object in one namespace, fed by one background
thread: client-go's informer, reduced to what the backend needs.

The thread lists the objects once, then watches from the list's resourceVersion and resumes each
renewed watch from the last resourceVersion it saw; when the server answers 410 Gone (that
version was compacted away) it starts again from a fresh list, as client-go's reflector does.
Reading the cache costs no request, so a pass over jobs whose objects did not change makes none.

The control plane's own writes go into the cache from the server's answer (`write`), as
client-go's MutationCache does, so a read right after a write sees it even before the watch
does; of two versions of an object the cache keeps the newer (resourceVersions are etcd
revisions, compared as integers as the MutationCache compares them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

logger = logging.getLogger(__name__)

RETRY_SECONDS = 1.0
STOP_POLL_SECONDS = 0.05
SYNC_WAIT = 2.0
"""Seconds a read waits for a cache's first list before it asks the server itself."""

Obj = dict[str, Any]


def version_of(obj: Obj) -> int | None:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return None


def newer(obj: Obj, than: Obj | None) -> bool:
    """Whether `obj` is the same version as `than` or a later one (an unknown version is taken
    as the later: it is what arrived last)."""
    mine, theirs = version_of(obj), None if than is None else version_of(than)
    return mine is None or theirs is None or mine >= theirs


class Informer:
    """The objects of kind `kind` (`lister`: e.g. `CoreV1Api.list_namespaced_config_map`)
    that match `label_selector` in `namespace`, by name, and indexed by the value of their
    label `index` (client-go's Indexer: a job's pods are found without a scan of them all)."""

    def __init__(self, lister: Callable[..., Any], kind: str, namespace: str,
                 label_selector: str, timeout_seconds: int, index: str | None = None) -> None:
        self.lister, self.kind, self.index = lister, kind, index
        self.namespace, self.selector = namespace, label_selector
        self.timeout_seconds = timeout_seconds
        self.synced = threading.Event()
        """Set while the cache reflects the server (after a list, until a watch error)."""
        self.relists = 0
        self._objects: dict[str, Obj] = {}
        self._indexed: dict[str, set[str]] = {}
        """Per value of the label `index`, the names of the objects that have it."""
        self._lock = threading.Lock()
        """Held while the cache changes (subclasses keep more state under it: `_observed`)."""
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name=f"k8s-{kind.lower()}-watch",
                                        daemon=True)

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

    def wait_synced(self) -> bool:
        """Whether the cache reflects the server, waiting up to SYNC_WAIT for a started
        watch's first list (False: ask the server instead)."""
        return self._thread.is_alive() and self.synced.wait(SYNC_WAIT)

    def get(self, name: str) -> Obj | None:
        """The object as last seen (a copy of its top level: callers may replace its keys)."""
        with self._lock:
            found = self._objects.get(name)
        return None if found is None else dict(found)

    def items(self, label: str | None = None, value: str | None = None) -> list[Obj]:
        """Current objects whose label `label` is `value` (every one without a label)."""
        with self._lock:
            return [dict(obj) for obj in self._matching(label, value)]

    def write(self, obj: Obj) -> None:
        """Keep an object as the server answered a write (or a read) of ours, unless the
        cache holds a newer version of it already."""
        with self._lock:
            self._keep(self._typed(dict(obj)))  # a copy: the caller may go on changing obj

    def _matching(self, label: str | None, value: str | None) -> list[Obj]:
        """`items` without the copies, for callers holding the lock."""
        if label is not None and label == self.index:
            return [self._objects[name] for name in self._indexed.get(value or "", ())]
        return [obj for obj in self._objects.values() if label is None
                or (obj["metadata"].get("labels") or {}).get(label) == value]

    def _observed(self, obj: Obj) -> None:
        """Called with the lock held for each object listed or watched (deleted ones too)."""

    def _keep(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if newer(obj, self._objects.get(name)):
            self._drop(name)
            self._objects[name] = obj
            if (value := self._indexed_value(obj)) is not None:
                self._indexed.setdefault(value, set()).add(name)

    def _drop(self, name: str) -> None:
        obj = self._objects.pop(name, None)
        value = None if obj is None else self._indexed_value(obj)
        if value is not None:
            names = self._indexed[value]
            names.discard(name)
            if not names:
                del self._indexed[value]

    def _indexed_value(self, obj: Obj) -> str | None:
        if self.index is None:
            return None
        value: str | None = (obj["metadata"].get("labels") or {}).get(self.index)
        return value

    def _typed(self, obj: Obj) -> Obj:
        # A list's items come without kind and apiVersion; an owner reference needs both.
        if "kind" not in obj or "apiVersion" not in obj:
            obj = {"kind": self.kind, "apiVersion": "v1", **obj}
        return obj

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version = self._list()
                while not self._stop.is_set():
                    version = self._watch_once(version)
            except ApiException as exc:
                if exc.status == 410:
                    self.relists += 1
                    logger.info("%s watch: resourceVersion expired (410 Gone); listing again",
                                self.kind)
                    continue
                self._failed(f"HTTP {exc.status} {exc.reason}")
            except (HTTPError, OSError, ValueError) as exc:
                self._failed(f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # the thread must outlive any surprise in a response
                logger.exception("%s watch: unexpected error", self.kind)
                self._failed(f"{type(exc).__name__}: {exc}")

    def _failed(self, what: str) -> None:
        self.synced.clear()
        if not self._stop.is_set():
            logger.warning("%s watch in %s failed (%s); retrying in %.0f s", self.kind,
                           self.namespace, what, RETRY_SECONDS)
            self._stop.wait(RETRY_SECONDS)

    def _list(self) -> str:
        # Not preloaded: the raw urllib3 response, whose JSON the cache keeps as it is.
        response: Any = self.lister(self.namespace, label_selector=self.selector,
                                    _preload_content=False, _request_timeout=30)
        listing = json.loads(response.data)
        version: str = listing["metadata"]["resourceVersion"]
        listed = {item["metadata"]["name"]: self._typed(item)
                  for item in listing.get("items") or []}
        with self._lock:
            # Our own writes after the list was taken stay until the watch brings them.
            later = {name: obj for name, obj in self._objects.items()
                     if (version_of(obj) or 0) > int(version) and newer(obj, listed.get(name))}
            self._objects, self._indexed = {}, {}
            for obj in [*listed.values(), *later.values()]:
                self._keep(obj)
            for obj in listed.values():
                self._observed(obj)
        self.synced.set()
        return version

    def _watch_once(self, version: str) -> str:
        """One watch request, until the server ends it (timeoutSeconds); the last version seen."""
        stream = watch.Watch()
        self._watch = stream
        try:
            for event in stream.stream(self.lister, self.namespace,
                                       label_selector=self.selector, resource_version=version,
                                       timeout_seconds=self.timeout_seconds,
                                       allow_watch_bookmarks=True,
                                       _request_timeout=self.timeout_seconds + 30):
                obj = event["raw_object"]
                version = obj["metadata"].get("resourceVersion") or version
                if event["type"] == "BOOKMARK":
                    continue
                with self._lock:
                    name = obj["metadata"]["name"]
                    if event["type"] != "DELETED":
                        self._keep(self._typed(obj))
                    elif newer(obj, self._objects.get(name)):
                        self._drop(name)
                    self._observed(obj)
                if self._stop.is_set():
                    break
        finally:
            self._watch = None
        return version
