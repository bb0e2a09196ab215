"""The fake API server's storage: objects with resourceVersions, a watch log, label selectors.

Like etcd behind a real API server, every change gets the next resourceVersion and lands in one
log that watches read from; `compact()` forgets the log, so a watch from an older version gets
410 Gone.
"""

from __future__ import annotations

import copy
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate

Obj = dict[str, Any]
SCHEMA_VERSION = "1.34.0"
"""The Kubernetes version whose official schemas every created body must satisfy (strict)."""

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class Kind:
    group: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1" if self.group else "v1"


KINDS = {k.plural: k for k in [
    Kind("", "pods", "Pod"), Kind("", "services", "Service"), Kind("", "secrets", "Secret"),
    Kind("", "events", "Event"), Kind("", "persistentvolumeclaims", "PersistentVolumeClaim"),
    Kind("", "configmaps", "ConfigMap"),
    Kind("apps", "statefulsets", "StatefulSet"), Kind("apps", "deployments", "Deployment"),
    Kind("networking.k8s.io", "networkpolicies", "NetworkPolicy"), Kind("batch", "jobs", "Job")]}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details,
                "code": self.code}


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_selector(text: str | None) -> list[tuple[str, str, set[str]]]:
    """`a=b,c!=d,e in (x,y),f notin (z),g,!h` as (key, operator, values)."""
    requirements: list[tuple[str, str, set[str]]] = []
    for part in re.findall(r"[^,(]+(?:\([^)]*\))?", text or ""):
        part = part.strip()
        if not part:
            continue
        if match := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", part):
            values = {v.strip() for v in match.group(3).split(",")}
            requirements.append((match.group(1), match.group(2), values))
        elif match := re.fullmatch(r"([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)", part):
            operator = "!=" if match.group(2) == "!=" else "="
            requirements.append((match.group(1), operator, {match.group(3)}))
        elif match := re.fullmatch(r"(!?)([\w./-]+)", part):
            requirements.append((match.group(2), "!" if match.group(1) else "exists", set()))
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
    return requirements


def matches(labels: dict[str, str], requirements: list[tuple[str, str, set[str]]]) -> bool:
    for key, operator, values in requirements:
        present, value = key in labels, labels.get(key)
        if ((operator in ("=", "in") and value not in values)
                or (operator in ("!=", "notin") and value in values)
                or (operator == "exists" and not present) or (operator == "!" and present)):
            return False
    return True


@dataclass
class WatchEvent:
    version: int
    plural: str
    namespace: str
    type: str
    object: Obj


@dataclass
class Store:
    objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    log: list[WatchEvent] = field(default_factory=list)
    version: int = 1000
    compacted: int = 0
    """Watches from a version below this one get 410 Gone."""
    changed: threading.Condition = field(default_factory=threading.Condition)

    # Every method expects `changed` to be held by the caller (the server and the controller
    # change several objects under one lock, as one step).

    def get(self, plural: str, namespace: str, name: str) -> Obj:
        found = self.objects.get((plural, namespace, name))
        if found is None:
            raise ApiError(404, "NotFound", f'{plural} "{name}" not found', name=name,
                           kind=plural)
        return found

    def find(self, plural: str, namespace: str, name: str) -> Obj | None:
        return self.objects.get((plural, namespace, name))

    def items(self, plural: str, namespace: str, selector: str | None = None) -> list[Obj]:
        requirements = parse_selector(selector)
        return [obj for (p, ns, _), obj in sorted(self.objects.items())
                if p == plural and ns == namespace
                and matches(obj["metadata"].get("labels") or {}, requirements)]

    def create(self, plural: str, namespace: str, body: Obj, validate: bool = True) -> Obj:
        kind = KINDS[plural]
        obj = copy.deepcopy(body)
        metadata = obj.setdefault("metadata", {})
        if body.get("kind") != kind.kind or body.get("apiVersion") != kind.api_version:
            raise ApiError(400, "BadRequest", f"expected {kind.api_version} {kind.kind}, got "
                                              f"{body.get('apiVersion')} {body.get('kind')}")
        if metadata.get("namespace", namespace) != namespace:
            raise ApiError(400, "BadRequest", "the namespace of the object does not match the "
                                              "namespace on the request")
        if validate:
            self.validate(plural, obj)
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
        name = metadata.get("name", "")
        if (plural, namespace, name) in self.objects:
            raise ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists', name=name,
                           kind=plural)
        metadata.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now(),
                        generation=1)
        self._put(plural, namespace, obj, "ADDED")
        return obj

    def validate(self, plural: str, obj: Obj) -> None:
        """The real server's schema check, strict: unknown or mistyped fields are refused."""
        name = obj["metadata"].get("name") or obj["metadata"].get("generateName", "x") + "x"
        pattern = DNS_LABEL if plural == "services" else DNS_SUBDOMAIN
        causes = [] if pattern.match(name) else [
            {"reason": "FieldValueInvalid", "field": "metadata.name",
             "message": f"Invalid value: {name!r}"}]
        try:
            kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            causes.append({"reason": "FieldValueInvalid",
                           "field": ".".join(str(p) for p in exc.path) or "<root>",
                           "message": exc.message})
        if causes:
            kind = KINDS[plural].kind
            raise ApiError(422, "Invalid", f'{kind} "{name}" is invalid: '
                                           + "; ".join(f"{c['field']}: {c['message']}"
                                                       for c in causes),
                           name=name, kind=kind, causes=causes)

    def update(self, plural: str, obj: Obj) -> Obj:
        """Store a changed object (a MODIFIED event)."""
        self._put(plural, obj["metadata"]["namespace"], obj, "MODIFIED")
        return obj

    def remove(self, plural: str, namespace: str, name: str) -> Obj:
        obj = self.objects.pop((plural, namespace, name))
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.log.append(WatchEvent(self.version, plural, namespace, "DELETED", obj))
        self.changed.notify_all()
        return obj

    def _put(self, plural: str, namespace: str, obj: Obj, type_: str) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.objects[(plural, namespace, obj["metadata"]["name"])] = obj
        self.log.append(WatchEvent(self.version, plural, namespace, type_, copy.deepcopy(obj)))
        self.changed.notify_all()

    def events_after(self, version: int, plural: str, namespace: str,
                     selector: str | None) -> list[WatchEvent]:
        """Log entries after `version`; 410 Gone when the log no longer reaches back there."""
        if version < self.compacted:
            raise ApiError(410, "Expired", f"too old resource version: {version} "
                                           f"({self.compacted})")
        requirements = parse_selector(selector)
        return [e for e in self.log if e.version > version and e.plural == plural
                and e.namespace == namespace
                and matches(e.object["metadata"].get("labels") or {}, requirements)]

    def compact(self) -> None:
        """Forget the watch log past the newest version, as compaction does: every watch, even
        one that is up to date, must start again from a fresh list."""
        self.version += 1
        self.compacted = self.version
        self.log.clear()
        self.changed.notify_all()
