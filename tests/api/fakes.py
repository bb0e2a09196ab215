"""An in-memory backend for route and reconciler tests (the e2e tests use the real one).

It keeps the protocol's semantics: pods exist per launch, a kill fails the pod and its controller
recreates it (restarts + 1), a scale adds or drops the highest ordinals, a migration marks the
pod migrating (on one of `nodes`), delete removes the workload and is idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from api.backends.base import (
    BackendError,
    Launch,
    Moving,
    PlacementError,
    PodStatus,
    StagingRequest,
    WorkloadConflict,
    WorkloadNotFound,
    WorkloadStatus,
)


@dataclass
class FakeBackend:
    name: str = "fake"
    launches: list[Launch] = field(default_factory=list)
    workloads: dict[str, WorkloadStatus] = field(default_factory=dict)
    kills: list[tuple[str, int, float]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    logs: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    fail_launch: str | None = None
    scales: list[tuple[str, int]] = field(default_factory=list)
    migrations: list[tuple[str, int, str | None]] = field(default_factory=list)
    nodes: tuple[str, ...] = ()
    reconciled: list[str] = field(default_factory=list)
    """The jobs `reconcile` was called for, in order (the controller's acts are the tests')."""
    stagings: list[StagingRequest] = field(default_factory=list)
    """The initializers started, in order; each runs until a test ends it (`end_staging`)."""
    initializing: set[str] = field(default_factory=set)

    def stage(self, request: StagingRequest) -> None:
        self.stagings.append(request)
        self.initializing.add(request.staging_id)

    def staging(self, staging_id: str) -> bool:
        return staging_id in self.initializing

    def end_staging(self, staging_id: str) -> None:
        self.initializing.discard(staging_id)

    def launch(self, launch: Launch) -> None:
        if self.fail_launch:
            raise BackendError(self.fail_launch)
        self.launches.append(launch)
        self.workloads[launch.job_id] = WorkloadStatus(present=True, pods=[
            self._pod(launch.job_id, o) for o in range(launch.pods)])

    @staticmethod
    def _pod(job_id: str, ordinal: int) -> PodStatus:
        return PodStatus(ordinal=ordinal, name=f"{job_id}-{ordinal}", phase="Running",
                         restarts=0, incarnation="0")

    def reconcile(self, job_id: str) -> None:
        self.reconciled.append(job_id)

    def status(self, job_id: str) -> WorkloadStatus:
        return self.workloads.get(job_id, WorkloadStatus(present=False))

    def set_pod(self, job_id: str, ordinal: int, **changes: object) -> None:
        workload = self.workloads[job_id]
        pods = [replace(p, **changes) if p.ordinal == ordinal else p  # type: ignore[arg-type]
                for p in workload.pods]
        self.workloads[job_id] = replace(workload, pods=pods)

    def finish(self, job_id: str, reason: str | None = None) -> None:
        self.workloads[job_id] = replace(self.workloads[job_id], present=False, finished=True,
                                         reason=reason)

    def kill_pod(self, job_id: str, ordinal: int, grace_seconds: float) -> None:
        workload = self.workloads.get(job_id)
        if workload is None or not workload.present or ordinal >= len(workload.pods):
            raise WorkloadNotFound(f"no pod {ordinal} of {job_id}")
        self.kills.append((job_id, ordinal, grace_seconds))
        restarts = workload.pods[ordinal].restarts + 1
        self.set_pod(job_id, ordinal, restarts=restarts, exit_code=-9)

    def _workload(self, job_id: str) -> WorkloadStatus:
        workload = self.workloads.get(job_id)
        if workload is None or not workload.present:
            raise WorkloadNotFound(f"no workload of {job_id}")
        return workload

    def scale(self, job_id: str, replicas: int) -> None:
        workload = self._workload(job_id)
        self.scales.append((job_id, replicas))
        kept = [p for p in workload.pods if p.ordinal < replicas]
        added = [self._pod(job_id, o) for o in range(len(kept), replicas)]
        self.workloads[job_id] = replace(workload, pods=kept + added)

    def migrate_pod(self, job_id: str, ordinal: int, node: str | None) -> Moving:
        workload = self._workload(job_id)
        if node is not None and node not in self.nodes:
            raise PlacementError(f"no node {node}")
        pod = next((p for p in workload.pods if p.ordinal == ordinal), None)
        if pod is None:
            raise WorkloadNotFound(f"no pod {ordinal} of {job_id}")
        if pod.migrating:
            raise WorkloadConflict(f"pod {pod.name} is already migrating")
        self.migrations.append((job_id, ordinal, node))
        self.set_pod(job_id, ordinal, migrating=True)
        return Moving(pod.incarnation, pod.node)

    def delete(self, job_id: str) -> None:
        self.deleted.append(job_id)
        if job_id in self.workloads:
            self.workloads[job_id] = WorkloadStatus(present=False)

    def tail_logs(self, job_id: str, ordinal: int, lines: int) -> list[str]:
        return self.logs.get((job_id, ordinal), [])[-lines:]

    def active_jobs(self) -> list[str]:
        return [job_id for job_id, w in self.workloads.items() if w.present]

    def gone(self, job_id: str) -> bool:
        return job_id not in self.active_jobs()
