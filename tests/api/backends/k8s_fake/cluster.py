"""The fake cluster's behaviour: API verbs, a scheduler over its nodes, a kubelet, the GC.

- The scheduler binds each Pending pod without a node and without scheduling gates to a node
  (`nodes`) that its required node affinity on `kubernetes.io/hostname` admits, the one with
  the fewest pods; with none it marks the pod Unschedulable (PodScheduled False).
- The kubelet moves bound Pending pods to Running (an IP, a started trainer container) and removes a
  pod deleted with a grace period once that grace (capped at `max_grace` for speed) is over,
  its container first recorded as ended with the exit code its SIGTERM gave (0: the trainer
  left gracefully; `sigterm_exit` sets another, 137 for one SIGKILLed at the end of the grace).
- The garbage collector carries out propagationPolicy: Foreground (owner marked with the
  `foregroundDeletion` finalizer, dependents deleted first, then the owner), Background (owner
  gone at once, orphans collected) and Orphan (owner references removed). PVCs that no object
  owns are never touched. Deployments and Jobs get no pods (jobs.py: a test ends a Job).
Tests steer containers with `crash`, `crash_loop`, `oom_kill`, `succeed` and `set_log`.
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from tests.api.backends.k8s_fake.jobs import DEFAULT_PROPAGATION, JobController
from tests.api.backends.k8s_fake.store import ApiError, Obj, Store, now

TICK = 0.02


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any

    @property
    def resource(self) -> str:
        """What the request is on, as RBAC names it: `pods`, `pods/log`, `configmaps`..."""
        rest = self._rest()
        return rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "") if rest else self.path

    @property
    def verb(self) -> str:
        """As the API server authorizes it: get, list, watch, create, patch or delete."""
        if self.method == "GET" and len(self._rest()) > 1:
            return "get"
        if self.method == "GET":
            return "watch" if self.query.get("watch") in ("true", "1") else "list"
        return {"POST": "create", "PATCH": "patch", "DELETE": "delete"}.get(self.method,
                                                                              self.method)

    def _rest(self) -> list[str]:
        """The path after `namespaces/{ns}/`: the plural, then a name and a subresource."""
        parts = self.path.strip("/").split("/")
        return parts[parts.index("namespaces") + 2:] if "namespaces" in parts else []


class FakeCluster(JobController):
    def __init__(self, start_delay: float = 0.05, max_grace: float = 0.3,
                 nodes: tuple[str, ...] = ("node-a", "node-b", "node-c")) -> None:
        self.store = Store()
        self.nodes = list(nodes)
        self.start_delay, self.max_grace = start_delay, max_grace
        self.start_pods = True
        """False keeps new pods Pending (tests that look at a pod before it runs)."""
        self.ready_on_start = True
        """False: a started pod's container is not ready (its readiness probe fails: a trainer
        that has not taken part in a step yet) until `set_ready`."""
        self.collect_garbage = True
        """False holds deletions in progress (tests that look at an object being deleted)."""
        self.requests: list[Request] = []
        """Every request served, in order (the HTTP server appends them)."""
        self.sigterm_exit: dict[str, int] = {}
        """Exit code of a pod's container after a graceful deletion's SIGTERM (default 0)."""
        self.logs: dict[tuple[str, bool], str] = {}
        self._born: dict[str, float] = {}
        self._removal_due: dict[str, float] = {}
        self._ips = itertools.count(10)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-kubelet", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with self.store.changed:
            self.store.changed.notify_all()
        self._thread.join(5)

    # --- verbs (called by the HTTP server) ----------------------------------------------

    def create(self, plural: str, namespace: str, body: Obj) -> Obj:
        with self.store.changed:
            obj = self.store.create(plural, namespace, body)
            self._reconcile()
            return copy.deepcopy(obj)

    def get(self, plural: str, namespace: str, name: str) -> Obj:
        with self.store.changed:
            return copy.deepcopy(self.store.get(plural, namespace, name))

    def patch(self, plural: str, namespace: str, name: str, patch: Obj) -> Obj:
        with self.store.changed:
            obj = copy.deepcopy(self.store.get(plural, namespace, name))
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != obj["metadata"].get("resourceVersion"):
                # A precondition, as a real server treats a resourceVersion in a patch.
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {plural} '
                                                f'"{name}": the object has been modified; please '
                                                "apply your changes to the latest version and "
                                                "try again", name=name, kind=plural)
            merged = merge_patch(obj, patch)
            if merged["metadata"]["uid"] != obj["metadata"]["uid"] or \
                    merged["metadata"]["name"] != obj["metadata"]["name"]:
                raise ApiError(422, "Invalid", "metadata.name and metadata.uid are immutable")
            self.store.validate(plural, merged)
            return copy.deepcopy(self.store.update(plural, merged))

    def delete(self, plural: str, namespace: str, name: str, grace: int | None,
               propagation: str | None) -> Obj:
        with self.store.changed:
            obj = copy.deepcopy(self.store.get(plural, namespace, name))
            metadata = obj["metadata"]
            if plural == "pods":
                if grace is None:
                    grace = int(obj["spec"].get("terminationGracePeriodSeconds", 30))
                if grace == 0:
                    removed = self.store.remove(plural, namespace, name)
                    self._reconcile()
                    return removed
                if not metadata.get("deletionTimestamp"):
                    metadata.update(deletionTimestamp=now(), deletionGracePeriodSeconds=grace)
                    self.store.update(plural, obj)
                    self._removal_due[name] = time.monotonic() + min(grace, self.max_grace)
                return copy.deepcopy(obj)
            # Background: the default of apps/v1 and core objects.
            policy = propagation or (DEFAULT_PROPAGATION if plural == "jobs" else "Background")
            if policy == "Foreground":
                if not metadata.get("deletionTimestamp"):
                    metadata.update(deletionTimestamp=now(), deletionGracePeriodSeconds=0,
                                    finalizers=[*metadata.get("finalizers", []),
                                                "foregroundDeletion"])
                    self.store.update(plural, obj)
                return copy.deepcopy(obj)
            removed = self.store.remove(plural, namespace, name)
            if policy == "Orphan":
                for dependent in self._dependents(namespace, metadata["uid"]):
                    dependent = copy.deepcopy(dependent)
                    dependent["metadata"].pop("ownerReferences", None)
                    self.store.update(self._plural(dependent), dependent)
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": name, "kind": plural, "uid": removed["metadata"]["uid"]}}

    def log(self, namespace: str, name: str, previous: bool, tail: int | None) -> str:
        with self.store.changed:
            pod = self.store.get("pods", namespace, name)
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if not statuses:
                raise ApiError(400, "BadRequest", f'container in pod "{name}" is waiting to '
                                                  "start: ContainerCreating")
            if previous and not statuses[0].get("lastState", {}).get("terminated"):
                raise ApiError(400, "BadRequest", f'previous terminated container in pod '
                                                  f'"{name}" not found')
            lines = self.logs.get((name, previous), "").splitlines(keepends=True)
            return "".join(lines[-tail:] if tail else lines)

    # --- test hooks ---------------------------------------------------------------------

    def served(self, since: int = 0) -> Counter[tuple[str, str]]:
        """The requests served from the `since`-th on, counted by (verb, resource)."""
        return Counter((r.verb, r.resource) for r in self.requests[since:])

    def pod(self, name: str, namespace: str = "live-migrator") -> Obj:
        return self.get("pods", namespace, name)

    def trainer(self, job_id: str, ordinal: int, namespace: str = "live-migrator") -> Obj:
        """The trainer pod that is `ordinal` of the job now: its newest not being deleted."""
        with self.store.changed:
            pods = [p for p in self.store.items("pods", namespace)
                    if (p["metadata"].get("labels") or {}).get("live-migrator.io/job") == job_id
                    and p["metadata"]["labels"].get("live-migrator.io/ordinal") == str(ordinal)
                    and not p["metadata"].get("deletionTimestamp")]
            if not pods:
                raise ApiError(404, "NotFound", f"no pod {ordinal} of {job_id}")
            return copy.deepcopy(max(pods, key=lambda p: int(
                p["metadata"]["labels"]["live-migrator.io/incarnation"])))

    def set_log(self, name: str, text: str, previous: bool = False) -> None:
        self.logs[(name, previous)] = text

    def crash(self, name: str, exit_code: int = 1, reason: str = "Error", message: str = "",
              namespace: str = "live-migrator") -> None:
        """The trainer container exits; the kubelet restarts it at once (restartCount + 1)."""
        with self.store.changed:
            pod = self._container_ended(name, namespace, exit_code, reason, message)
            status = pod["status"]["containerStatuses"][0]
            status.update(restartCount=status["restartCount"] + 1, started=True,
                          lastState={"terminated": status["state"]["terminated"]},
                          state={"running": {"startedAt": now()}})
            self.store.update("pods", pod)

    def set_ready(self, name: str, namespace: str = "live-migrator") -> None:
        """The pod's readiness probe passes (its trainer took part in a step)."""
        with self.store.changed:
            pod = copy.deepcopy(self.store.get("pods", namespace, name))
            pod["status"]["containerStatuses"][0]["ready"] = True
            self.store.update("pods", pod)

    def oom_kill(self, name: str, namespace: str = "live-migrator") -> None:
        self.crash(name, 137, "OOMKilled", namespace=namespace)

    def crash_loop(self, name: str, exit_code: int, message: str = "",
                   namespace: str = "live-migrator") -> None:
        """The container exited and the kubelet waits before the next start (back-off)."""
        with self.store.changed:
            pod = self._container_ended(name, namespace, exit_code, "Error", message)
            status = pod["status"]["containerStatuses"][0]
            status.update(restartCount=status["restartCount"] + 1, ready=False, started=False,
                          lastState={"terminated": status["state"]["terminated"]},
                          state={"waiting": {"reason": "CrashLoopBackOff",
                                             "message": "back-off 10s restarting failed "
                                                        "container"}})
            self.store.update("pods", pod)

    def succeed(self, name: str, namespace: str = "live-migrator") -> None:
        with self.store.changed:
            pod = self._container_ended(name, namespace, 0, "Completed", "")
            pod["status"]["phase"] = "Succeeded"
            self.store.update("pods", pod)

    def _container_ended(self, name: str, namespace: str, exit_code: int, reason: str,
                         message: str) -> Obj:
        """Record the end of the running container (one MODIFIED event); the caller goes on."""
        pod = copy.deepcopy(self.store.get("pods", namespace, name))
        status = pod["status"]["containerStatuses"][0]
        started = status["state"].get("running", {}).get("startedAt", now())
        terminated = {"exitCode": exit_code, "reason": reason, "startedAt": started,
                      "finishedAt": now(), "containerID": status.get("containerID", "")}
        if message:
            terminated["message"] = message
        status.update(ready=False, state={"terminated": terminated})
        self.store.update("pods", pod)
        return copy.deepcopy(pod)

    # --- controllers --------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            with self.store.changed:
                self._kubelet()
                if self.collect_garbage:
                    self._collect_garbage()
                self._reconcile()
                self.store.changed.wait(TICK)

    def _reconcile(self) -> None:
        """The scheduler: bind each schedulable Pending pod to a node, or say why not."""
        self._start_jobs()
        for (plural, namespace, name), pod in list(self.store.objects.items()):
            spec = pod.get("spec") or {}
            if (plural != "pods" or spec.get("nodeName")
                    or pod["metadata"].get("deletionTimestamp")):
                continue
            if spec.get("schedulingGates"):
                gated = {"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}
                if pod.get("status") != gated:
                    self.store.update("pods", {**copy.deepcopy(pod), "status": gated})
                continue
            fits = [node for node in self.nodes if admits(spec, node)]
            pod = copy.deepcopy(pod)
            if not fits:
                condition = {"type": "PodScheduled", "status": "False",
                             "reason": "Unschedulable",
                             "message": f"0/{len(self.nodes)} nodes are available: "
                                        "didn't match Pod's node affinity/selector."}
                if pod.get("status", {}).get("conditions") != [condition]:
                    pod["status"] = {"phase": "Pending", "conditions": [condition]}
                    self.store.update("pods", pod)
                continue
            load = {node: 0 for node in fits}
            for other in self.store.items("pods", namespace):
                if other["spec"].get("nodeName") in load:
                    load[other["spec"]["nodeName"]] += 1
            pod["spec"]["nodeName"] = min(fits, key=lambda node: (load[node], node))
            pod["status"] = {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "True"}]}
            self.store.update("pods", pod)
            self._born[name] = time.monotonic()

    def _kubelet(self) -> None:
        clock = time.monotonic()
        for (plural, namespace, name), pod in list(self.store.objects.items()):
            if plural != "pods":
                continue
            if pod["metadata"].get("deletionTimestamp"):
                if clock >= self._removal_due.get(name, 0):
                    self._stop_container(pod)
                    self.store.remove("pods", namespace, name)
                continue
            if (self.start_pods and pod.get("status", {}).get("phase") == "Pending"
                    and pod["spec"].get("nodeName")
                    and clock >= self._born.get(name, float("inf")) + self.start_delay):
                pod = copy.deepcopy(pod)
                container = pod["spec"]["containers"][0]
                pod["status"] = {
                    "phase": "Running", "podIP": f"10.244.0.{next(self._ips)}",
                    "startTime": now(), "qosClass": "Guaranteed",
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "containerStatuses": [{
                        "name": container["name"], "image": container["image"],
                        "imageID": "", "containerID": f"containerd://{name}",
                        "ready": self.ready_on_start,
                        "started": True, "restartCount": 0, "lastState": {},
                        "state": {"running": {"startedAt": now()}}}]}
                self.store.update("pods", pod)

    def _stop_container(self, pod: Obj) -> None:
        """The end of a graceful deletion: the container's exit is recorded (one MODIFIED
        event) before the pod goes, as the kubelet reports it."""
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        if not statuses or "running" not in statuses[0].get("state", {}):
            return
        name = pod["metadata"]["name"]
        code = self.sigterm_exit.get(name, 0)
        self._container_ended(name, pod["metadata"]["namespace"], code,
                              "Completed" if code == 0 else "Error", "")

    def _collect_garbage(self) -> None:
        live = {obj["metadata"]["uid"] for obj in self.store.objects.values()}
        for (plural, namespace, name), obj in list(self.store.objects.items()):
            metadata = obj["metadata"]
            owners = [ref["uid"] for ref in metadata.get("ownerReferences") or []]
            if owners and not any(uid in live for uid in owners):
                self.store.remove(plural, namespace, name)  # an orphan (Background)
            elif "foregroundDeletion" in (metadata.get("finalizers") or []):
                dependents = self._dependents(namespace, metadata["uid"])
                for dependent in dependents:
                    self.store.remove(self._plural(dependent), namespace,
                                      dependent["metadata"]["name"])
                if not dependents:
                    self.store.remove(plural, namespace, name)

    def _dependents(self, namespace: str, uid: str) -> list[Obj]:
        return [obj for (_, ns, _), obj in self.store.objects.items() if ns == namespace
                and any(ref["uid"] == uid for ref in obj["metadata"].get("ownerReferences") or [])]

    @staticmethod
    def _plural(obj: Obj) -> str:
        return {"Pod": "pods", "Service": "services", "Secret": "secrets", "Event": "events",
                "StatefulSet": "statefulsets", "Deployment": "deployments",
                "ConfigMap": "configmaps",
                "PersistentVolumeClaim": "persistentvolumeclaims",
                "NetworkPolicy": "networkpolicies", "Job": "jobs"}[obj["kind"]]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def admits(spec: Obj, node: str) -> bool:
    """Whether the pod's required node affinity on the node's hostname label lets it there
    (each term's expressions all hold; any term will do)."""
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    for term in terms:
        holds = True
        for expression in term.get("matchExpressions") or []:
            if expression["key"] != "kubernetes.io/hostname":
                holds = False  # no other node label exists here
            elif expression["operator"] == "In":
                holds &= node in expression.get("values", [])
            elif expression["operator"] == "NotIn":
                holds &= node not in expression.get("values", [])
            else:
                holds = False
        if holds:
            return True
    return False
