"""The one protocol every backend implements; routes and the reconciler know nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from trainer.contract.artifact_store import Location
from trainer.contract.spec import JobSpec
from trainer.contract.staged import Kind

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed"]

MIGRATION_TIMEOUT = 120.0
"""Seconds a migration's replacement has to take part (heal and train). A backend that runs
one gives up on it then (Kubernetes deletes it, and the pod stays where it is), and the
control plane records the migration as failed once the backend no longer runs it
(api/services/pod_migrations.py)."""


class BackendError(Exception):
    """The backend could not carry out a request (the cluster or supervisor is unreachable)."""


class WorkloadNotFound(BackendError):
    """No workload (or no such pod) exists for the job."""


class WorkloadConflict(BackendError):
    """The workload (or an object of it) already exists or changed concurrently, or the pod is
    busy with a request of the same kind (a migration)."""


class Unsupported(BackendError):
    """This backend cannot do that (yet); the message says what it can do instead."""


class PlacementError(BackendError):
    """The node a request names cannot take the pod (unknown, unschedulable, or the backend
    has only one)."""


@dataclass(frozen=True)
class Resources:
    """What one pod asks for; None leaves the backend's default. The local backend ignores it."""

    cpu: str | None = None
    """A Kubernetes CPU quantity (`2`, `500m`)."""
    memory: str | None = None
    """A Kubernetes memory quantity (`4Gi`)."""
    gpus: int = 0


@dataclass(frozen=True)
class Launch:
    """Everything a backend needs to start a job's pods."""

    job_id: str
    pods: int
    """Pods to run: `spec.replicas` data-parallel replicas of `spec.stages` pods each."""
    fault_tolerance: Literal["live", "restart"]
    spec: JobSpec
    """The job spec the trainer takes; it becomes JSON (TRAINER_CONFIG) only in the pods'
    environment (api.backends.programs.pod_env)."""
    report_url: str
    """`.../api/v1/jobs/{id}/reports`, reachable from the pods."""
    report_token: str
    """The per-job report token (the API keeps only its hash)."""
    checkpoint_dir: Location
    """A directory, or a prefix in an object store (trainer.contract.artifact_store)."""
    model_dir: Location
    inputs_dir: Path
    cache_dir: Path
    resources: Resources | None = None
    """Per-pod resources from the job spec (not part of `spec`: the trainer does not take them)."""
    peer_secret: str = ""
    """The per-job secret a live pod must present to fetch a peer's state (the API keeps none)."""
    store_env: dict[str, str] = field(default_factory=dict)
    """The job's own credential for its artifacts, as the pods' environment variables, in place
    of the store's (api.services.job_credentials); empty: the pods get the store's."""


@dataclass(frozen=True)
class PodStatus:
    ordinal: int
    name: str
    """`<job_id>-<ordinal>`, stable across restarts."""
    phase: PodPhase
    restarts: int
    started_at: float | None = None
    """Unix time the current incarnation started."""
    exit_code: int | None = None
    """Exit code of the last incarnation that ended (negative: killed by that signal)."""
    reason: str | None = None
    """Why the last incarnation ended or waits, where the backend knows (`OOMKilled`,
    `CrashLoopBackOff`); None otherwise."""
    incarnation: str | None = None
    """The current incarnation (what its reports carry), where the backend names it."""
    migrating: bool = False
    """A migration of this pod is under way (its replacement has not taken over yet)."""
    node: str | None = None
    """The node it runs on, where the backend has nodes."""


@dataclass(frozen=True)
class Moving:
    """The incarnation a migration replaces, as it was when the migration was asked for."""

    incarnation: str | None
    """What its reports carry, where the backend names it."""
    node: str | None = None


@dataclass(frozen=True)
class WorkloadStatus:
    present: bool
    """The workload exists and its controller (supervisor / anchor) is alive."""
    pods: list[PodStatus] = field(default_factory=list)
    finished: bool = False
    """The controller stopped on its own: every pod succeeded, or it gave up (see reason)."""
    reason: str | None = None
    """Why the controller gave up (restart budget spent, bad input), None otherwise."""


@dataclass(frozen=True)
class StagingRequest:
    """A hub repository to stage once under the inputs dir (trainer.initializer): the
    initializer rewrites its progress file there (trainer.contract.staged.progress_file) as it
    works, and ends with the outcome in it."""

    staging_id: str
    kind: Kind
    repo_id: str
    """A hub repository; for `tokens` and `file`, their key (trainer.contract.staged)."""
    revision: str
    """A branch, tag or commit; for `push`, the job's id."""
    inputs_dir: Path
    log_file: Path
    """Where a local initializer's output goes (a Kubernetes one's is its pod's log)."""
    spec: str | None = None
    """As JSON (`--spec`): for `tokens`, the job spec whose splits to tokenize; for `file`, the
    import (source, name, columns); for `push`, the model's files and the repository's
    visibility."""


class Backend(Protocol):
    name: str

    def launch(self, launch: Launch) -> None:
        """Create the job's workload; return once it is created (pods start asynchronously)."""

    def reconcile(self, job_id: str) -> None:
        """Act so the job's workload converges to what it was asked to be: replace a dead
        controller (a supervisor), create, gate-lift or delete pods (the Kubernetes pod
        controller), give up where its budget is spent. The control plane calls it once per
        pass, before `status`; it does nothing for a job with no workload."""

    def status(self, job_id: str) -> WorkloadStatus:
        """Observe the job's pods, acting on nothing (`reconcile` acts); `present=False` when
        no workload exists (any more) or its controller is not alive."""

    def kill_pod(self, job_id: str, ordinal: int, grace_seconds: float) -> None:
        """Kill one pod as a node failure would; its controller recreates it.

        Raises WorkloadNotFound for an unknown job or ordinal.
        """

    def scale(self, job_id: str, replicas: int) -> None:
        """Run `replicas` pods: new ordinals start and heal from a peer, the highest ones get
        SIGTERM and leave gracefully (they are not recreated).

        Raises WorkloadNotFound where the job has no running workload.
        """

    def migrate_pod(self, job_id: str, ordinal: int, node: str | None) -> Moving:
        """Move one pod to another node (`node`, or any but its own), keeping its ordinal: live,
        the replacement starts and takes part before the old incarnation leaves. Returns the
        incarnation being replaced.

        Raises WorkloadNotFound for an unknown job or ordinal, WorkloadConflict while that pod
        migrates already, PlacementError where `node` cannot take it.
        """

    def delete(self, job_id: str) -> None:
        """Remove the workload so nothing restarts; checkpoints and models stay. Idempotent."""

    def tail_logs(self, job_id: str, ordinal: int, lines: int) -> list[str]:
        """The last `lines` lines the pod wrote (stdout and stderr), oldest first."""

    def active_jobs(self) -> list[str]:
        """Ids of jobs whose workload exists, for re-adoption after a control-plane restart."""

    def stage(self, request: StagingRequest) -> None:
        """Start an initializer for the request, the only process that reaches the hub; return
        once it is started. Raises Unsupported where the backend cannot stage."""

    def staging(self, staging_id: str) -> bool:
        """Whether an initializer this process started for the staging still runs."""

    def gone(self, job_id: str) -> bool:
        """Whether no process of the job's workload is left (a deleted one's pods have ended),
        so that nothing writes its artifacts any more. Observes only."""
