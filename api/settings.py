"""The control plane's settings: one object, read from MIGRATOR_* variables, validated at start."""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from upath import UPath

from trainer.contract.artifact_store import location
from trainer.contract.runtime import host_port

CONTAINER = re.compile(r"[a-z0-9](?:-?[a-z0-9]){2,49}")
"""An Azure container name short enough for `-<job id>` after it (63 characters at most)."""


class Settings(BaseSettings):
    # Attribute docstrings: the field docs that docs/reference/settings.md is generated from.
    model_config = SettingsConfigDict(env_prefix="MIGRATOR_", extra="ignore",
                                      use_attribute_docstrings=True)

    data_dir: Path = Path("data")
    """SQLite file, job directories (checkpoints, models, logs)."""
    admin_token: str | None = Field(default=None, min_length=16)
    """Bearer token for every user endpoint; generated once into the data dir when unset."""
    backend: Literal["local", "kubernetes"] = "local"
    """Where pods run: `local` (process groups under a detached supervisor per job) or
    `kubernetes` (pods in a cluster, kept by the control plane)."""
    database_url: str | None = None
    """SQLAlchemy URL (e.g. postgresql+psycopg://...); SQLite in the data dir when unset."""
    artifacts_url: str | None = None
    """Where checkpoints and models go (trainer.contract.artifact_store): `file://...`,
    `az://container/prefix` (Azure Blob) or `s3://bucket/prefix` (S3, MinIO); the data dir's
    `jobs/` when unset.
    The store's credentials come from its client's standard environment variables
    (AZURE_STORAGE_CONNECTION_STRING; AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL),
    which the trainer pods inherit (unless `artifacts_per_job`)."""
    artifacts_per_job: bool = False
    """Azure Blob only (`artifacts_url` = `az://<container>`): each job's artifacts go to a
    container of its own, `<container>-<job id>`, and its pods get a SAS for that container
    alone instead of the store's credentials (api/services/job_credentials.py)."""
    artifacts_credential_lifetime: float = Field(default=86400, ge=60)
    """Seconds a job's SAS stays valid without the control plane: it extends it while the job
    runs and revokes it when the job ends."""
    inputs_dir: Path | None = None
    """Root for local models and datasets named by a relative path; `<data dir>/inputs` if unset."""
    host: str = "127.0.0.1"
    """Address the API listens on (`python -m api --host` overrides it)."""
    port: int = 8000
    """Port the API listens on (`python -m api --port` overrides it)."""
    public_url: str | None = None
    """Base URL the pods use to reach the API; `http://<host>:<port>` when unset."""
    stream_link_seconds: int = Field(default=60, ge=1, le=3600)
    """How long a signed link to a job's event stream can be opened (an open stream is never
    cut); the dashboard asks for a new one each time it connects."""
    stream_queue_size: int = Field(default=1000, ge=1, le=1_000_000)
    """Events each client of an event stream may have waiting to be sent; past it, the client
    catches up from the database instead, so a slow client never slows the reports."""
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Largest request body accepted, but for reports (413 above, before it is read whole)."""
    max_report_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Largest report body accepted (413 above)."""
    max_upload_bytes: int = Field(default=2 * 1024**3, ge=1024)
    """Largest dataset upload accepted (413 above, as soon as the body passes it)."""
    max_job_event_bytes: int = Field(default=256 * 1024 * 1024, ge=1024)
    """Events a job's reports may store, in bytes of JSON: about 1.5 million metric points (170
    bytes each), ten times what 16 pods report over 10,000 steps. Past it, reports get a 429 and
    their metrics, evaluations, checkpoint records and sample ids are no longer stored (they
    still move the job's progress); its lifecycle events still are, in 1/16 more."""
    reconcile_interval: float = 1.0
    """Seconds between two passes of the reconciler."""
    restart_budget: int = 5
    """Restarts each pod may use before its job is marked failed."""
    checkpoint_ttl: float | None = Field(default=None, gt=0)
    """Seconds after a job finished when its checkpoints are pruned to the final (newest) and
    the best (highest validation accuracy); unset: every checkpoint is kept."""
    restart_backoff: float = Field(default=1.0, ge=0, le=300)
    """Seconds the local backend waits before it recreates a failed pod (Kubernetes recreates
    a deleted pod at once and backs off crashing containers itself)."""
    standby: bool = True
    """Local backend, live jobs: keep a warm standby process per job (model and data loaded)
    that the next pod to start becomes, so a recreated, added or migrated pod takes part in
    about the time of a heal. Costs one idle process's memory per job."""
    fork_pods: bool = True
    """Local backend: start a job's pods as forks of one process per job that has imported
    torch, transformers and the trainer, instead of each importing them again (seconds of CPU
    per pod start). Costs one idle process's memory per job."""
    fork_template: Path | None = None
    """Local backend, with `fork_pods`: the socket of a fork-server template
    (`python -m trainer.forktemplate`) that forks each job's fork server, ready at once; unset,
    the control plane starts its own (one more idle process's memory). A job started while
    the template still imports spawns its server, which imports."""
    predict_cache_size: int = 2
    """Models kept in memory for predictions."""
    log_format: Literal["text", "json"] = "text"
    """`json`: one JSON object per log line, for log collectors."""

    # --- kubernetes backend (MIGRATOR_BACKEND=kubernetes) ---
    k8s_namespace: str = Field(default="live-migrator",
                               pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    """Namespace of every job's objects (the API's own, in the cluster)."""
    k8s_kubeconfig: Path | None = None
    """Kubeconfig file; unset: in-cluster config, else $KUBECONFIG or ~/.kube/config."""
    k8s_context: str | None = None
    """Kubeconfig context; unset: the file's current context."""
    k8s_trainer_image: str = "ghcr.io/live-migrator/live-migrator-trainer:v0.1.0"
    """Image of the trainer pods, the lighthouse and the rendezvous store (as the images
    workflow names it: ghcr.io/<owner>/live-migrator-trainer:<tag>)."""
    k8s_image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """imagePullPolicy of the trainer image in every pod and coordinator."""
    k8s_data_claim: str = "migrator-data"
    """RWX PVC with the inputs (local models and datasets), mounted read-only at /inputs."""
    k8s_checkpoints_claim: str = "migrator-checkpoints"
    """RWX PVC of checkpoints: one sub-directory per job."""
    k8s_models_claim: str = "migrator-models"
    """RWX PVC of exported models: one sub-directory per job."""
    k8s_artifacts_secret: str | None = None
    """With MIGRATOR_ARTIFACTS_URL: the Secret (in the namespace) whose keys every trainer pod
    gets as environment variables, the store's credentials."""
    k8s_hub_endpoint: str | None = Field(
        default=None, validation_alias=AliasChoices("MIGRATOR_K8S_HUB_ENDPOINT", "HF_ENDPOINT"))
    """The Hugging Face hub (or a mirror) that initializer pods stage hub models and datasets
    from, as their HF_ENDPOINT; unset: the API's own HF_ENDPOINT, else the hub's default. (A
    local initializer inherits the API's environment.)"""
    k8s_hub_token_secret: str | None = None
    """A Secret (in the namespace) whose key `HF_TOKEN` initializer pods get as HF_TOKEN, for
    gated or private hub repositories; trainer pods never get it."""
    k8s_volumes_dir: Path | None = None
    """Where this API process has the checkpoints and models PVCs mounted (`checkpoints/`,
    `models/` below it); must lie inside the data dir. `<data dir>/volumes` when unset."""
    k8s_pod_cpu: str = "2"
    """CPU request and limit of a trainer pod when the job spec names none."""
    k8s_pod_memory: str = "6Gi"
    """Memory request and limit of a trainer pod when the job spec names none."""
    k8s_cache_size: str = "8Gi"
    """Size limit of a trainer pod's emptyDir cache (Hugging Face downloads, tokenized data)."""
    k8s_watch_timeout: int = Field(default=300, ge=1)
    """Seconds one watch request (of the pods, of the anchors) lasts before it is renewed from
    the last resourceVersion."""

    @property
    def resolved_inputs_dir(self) -> Path:
        return (self.inputs_dir or self.data_dir / "inputs").resolve()

    @field_validator("artifacts_url")
    @classmethod
    def _a_store(cls, value: str | None) -> str | None:
        if value:
            location(value)  # raises on a URL that names no store
        return value or None

    @model_validator(mode="after")
    def _per_job_in_azure(self) -> Settings:
        if not self.artifacts_per_job:
            return self
        parts = urlsplit(self.artifacts_url or "")
        if parts.scheme not in ("az", "abfs"):
            raise ValueError("artifacts_per_job needs an Azure Blob artifacts_url (az://"
                             "container): S3 has no per-job credential here (see "
                             "docs/storage.md)")
        if parts.path.strip("/") or not CONTAINER.fullmatch(parts.netloc):
            raise ValueError("with artifacts_per_job, artifacts_url names a container alone: "
                             "az://<3 to 50 lowercase letters, digits, single hyphens>")
        return self

    @cached_property
    def artifacts(self) -> Path | UPath:
        """The root of every job's artifacts (`<job id>/checkpoints`, `<job id>/model`); a
        directory with its links resolved, as the store layer follows none below it."""
        root = location(self.artifacts_url) if self.artifacts_url else self.jobs_dir
        return root.resolve() if isinstance(root, Path) else root

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir.resolve() / "jobs"

    @property
    def admin_token_file(self) -> Path:
        """Where the token generated on the first start is kept (mode 0600), unless ADMIN_TOKEN
        is set."""
        return self.data_dir.resolve() / "admin_token"

    @property
    def cache_dir(self) -> Path:
        return self.data_dir.resolve() / "cache"

    @property
    def resolved_volumes_dir(self) -> Path:
        return (self.k8s_volumes_dir or self.data_dir / "volumes").resolve()

    @property
    def sqlite_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir.resolve() / 'migrator.db'}"

    @property
    def base_url(self) -> str:
        return (self.public_url or f"http://{host_port(self.host, self.port)}").rstrip("/")
