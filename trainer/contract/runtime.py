"""Where a pod runs: what its backend tells it through environment variables.

Backends build a pod's environment with `Runtime.to_env` (or name a variable with `env_name`,
for values Kubernetes fills in itself); the trainer reads it back with `Runtime.fields_from_env`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from upath import UPath

from trainer.contract.artifact_store import Location
from trainer.contract.credentials import SECRET_ENV

SPEC_ENV = "TRAINER_CONFIG"
"""The environment variable that holds the job spec (trainer.contract.spec), as JSON."""
RENDEZVOUS_BACKEND = "livemigrator"
"""The torchrun rendezvous backend of restart-mode pods (trainer.fault_tolerance.elastic
registers it)."""
LOOPBACK = "127.0.0.1"
"""The address of every process of a local job, and of what only its own process uses."""


class Runtime(BaseModel):
    """Where this pod runs; each field's alias is its environment variable."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True,
                              validate_by_name=True, validate_by_alias=True)

    job_id: str = Field(default="local", alias="JOB_ID")
    """Job id, carried in every log line and report."""

    pod_name: str = Field(default="", alias="POD_NAME")
    """This pod's stable name, `<job>-<ordinal>`; `<job_id>-<rank>` when empty."""

    incarnation: str = Field(default="", alias="POD_INCARNATION")
    """This process's life of the pod (restart count or uid); generated when empty."""

    report_url: str | None = Field(default=None, alias="REPORT_URL")
    """Where reports are POSTed (`.../api/v1/jobs/{id}/reports`); none: no HTTP reports."""

    report_token: str | None = Field(default=None, alias="REPORT_TOKEN", repr=False)
    """Bearer token for `report_url`: the job's report token."""

    pod_address: str = Field(default="", alias="POD_ADDRESS")
    """How peers reach this pod, and the only address its processes listen on (127.0.0.1
    locally, the pod IP on Kubernetes); the host name's address when empty."""

    lighthouse: str | None = Field(default=None, alias="TORCHFT_LIGHTHOUSE")
    """The job's torchft lighthouse (`http://host:port`): a live job's pods join through it."""

    peer_secret: str = Field(default="", alias=SECRET_ENV, repr=False)
    """The job's own secret, which its pods and coordinator prove to each other
    (trainer.contract.credentials): to join the quorum or the rendezvous, to heal."""

    replica_store: str | None = Field(default=None, alias="REPLICA_STORE", max_length=300)
    """A live pipeline pod's `host:port` where its replica's stages meet (hosted by the
    replica's stage 0)."""

    quorum_retries: int = Field(default=10, ge=0, alias="TORCHFT_QUORUM_RETRIES")
    """How often a live pod retries a failed quorum request, so a lighthouse restart is
    survived."""

    metrics_file: Path | None = Field(default=None, alias="METRICS_FILE")
    """A JSON-lines file that receives every report record too."""

    checkpoint_dir: Location = Field(default=Path("runs/checkpoints"), alias="CHECKPOINT_DIR")
    """The job's shared checkpoint directory (`step-N/`): a path, or an object store's URL
    (trainer.contract.artifact_store)."""

    model_dir: Location = Field(default=Path("runs/model"), alias="MODEL_DIR")
    """Where the trained model is exported with `save_pretrained`: a path or a store's URL."""

    inputs_dir: Path = Field(default=Path("data/inputs"), alias="INPUTS_DIR")
    """Root of local models and datasets named by a relative path."""

    cache_dir: Path = Field(default=Path("data/cache"), alias="TRAINER_CACHE_DIR")
    """Tokenization cache, keyed by dataset, tokenizer and max_length."""

    log_sample_ids: bool = Field(default=False, alias="LOG_SAMPLE_IDS")
    """Debug: report the sample ids of every committed step (proves exactly-once use)."""

    max_steps: int | None = Field(default=None, ge=1, alias="MAX_STEPS")
    """Stop after this many committed steps in all (benchmarks, tests); none: every epoch."""

    report_drain_seconds: float = Field(default=600.0, ge=0, alias="REPORT_DRAIN_SECONDS")
    """How long an ending pod waits for the control plane to take its undelivered reports (it
    may be restarting); what is left then is lost, and the pod's log says how much."""

    quantize_on_cpu: bool = Field(default=False, alias="QUANTIZE_ON_CPU")
    """Tests: let an 8-bit base model train on the CPU (bitsandbytes' LLM.int8(), far slower
    than float32 there, so no backend asks for it), to run the CUDA path's code."""

    heartbeat_file: Path | None = Field(default=None, alias="HEARTBEAT_FILE")
    """Touched about once a second while report records flow; Kubernetes probes its age."""

    ready_file: Path | None = Field(default=None, alias="READY_FILE")
    """Created once this process participates in a step (it holds the live state): a migration
    retires the pod's old incarnation when its replacement's file appears."""

    warm_worker: bool = Field(default=True, alias="WARM_WORKER")
    """Restart mode: the pod's agent keeps a warm worker (imported, data and model loaded) for
    the next round, at the cost of one more process's memory."""

    fork_workers: bool = Field(default=True, alias="FORK_WORKERS")
    """Restart mode: the pod's agent forks its rounds' workers (and its warm worker) from a
    fork server of its own (trainer.forkserver) instead of starting fresh interpreters."""

    replica_file: Path | None = Field(default=None, alias="REPLICA_FILE")
    """Where a live pod writes its replica id once it joined the lighthouse: should the process
    die, its supervisor tells the lighthouse at once instead of letting heartbeats expire."""

    @field_validator("checkpoint_dir", "model_dir")
    @classmethod
    def _resolved(cls, value: Path | UPath) -> Path | UPath:
        """A directory's links are resolved once, here: the store layer follows none at or
        below it (trainer.contract.artifact_store)."""
        return value.resolve() if isinstance(value, Path) else value

    @model_validator(mode="after")
    def _token_with_url(self) -> Runtime:
        if self.report_url and not self.report_token:
            raise ValueError("report_token (REPORT_TOKEN) is required when report_url is set")
        return self

    @classmethod
    def env_name(cls, field: str) -> str:
        alias = cls.model_fields[field].alias
        assert alias is not None, field
        return alias

    @classmethod
    def fields_from_env(cls, environ: Mapping[str, str]) -> dict[str, str]:
        """Field values set by `environ`, by field name (an empty variable leaves the default)."""
        return {field: environ[name] for field in cls.model_fields
                if environ.get(name := cls.env_name(field))}

    def to_env(self) -> dict[str, str]:
        """The environment variables that reproduce this runtime (unset fields left out)."""
        values = self.model_dump(by_alias=True, exclude_unset=True, exclude_none=True)
        return {name: str(value).lower() if isinstance(value, bool) else str(value)
                for name, value in values.items()}


def url_host(address: str) -> str:
    """`address` as the host part of a URL or of `host:port`: an IPv6 literal in brackets."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def host_port(host: str, port: int) -> str:
    """`host:port` for a host name, an IPv4 or an IPv6 address (`[fd00::1]:29510`)."""
    return f"{url_host(host)}:{port}"
