"""The control plane's settings: one object, read from MIGRATOR_* variables, validated at start."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MIGRATOR_", extra="ignore")

    data_dir: Path = Path("data")
    """SQLite file, job directories (checkpoints, models, logs)."""
    admin_token: str | None = Field(default=None, min_length=16)
    """Bearer token for every user endpoint; generated once into the data dir when unset."""
    backend: Literal["local", "kubernetes"] = "local"
    database_url: str | None = None
    """SQLAlchemy URL (e.g. postgresql+psycopg://...); SQLite in the data dir when unset."""
    inputs_dir: Path | None = None
    """Root for local models and datasets named by a relative path; `<data dir>/inputs` if unset."""
    host: str = "127.0.0.1"
    port: int = 8000
    public_url: str | None = None
    """Base URL the pods use to reach the API; `http://<host>:<port>` when unset."""
    max_report_bytes: int = 4 * 1024 * 1024
    """Largest report body accepted (413 above)."""
    reconcile_interval: float = 1.0
    """Seconds between two passes of the reconciler."""
    restart_budget: int = 5
    """Group restarts a job may use before it is marked failed."""
    predict_cache_size: int = 2
    """Models kept in memory for predictions."""
    log_format: Literal["text", "json"] = "text"
    """`json`: one JSON object per log line, for log collectors."""

    @property
    def resolved_inputs_dir(self) -> Path:
        return (self.inputs_dir or self.data_dir / "inputs").resolve()

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir.resolve() / "jobs"

    @property
    def cache_dir(self) -> Path:
        return self.data_dir.resolve() / "cache"

    @property
    def sqlite_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir.resolve() / 'migrator.db'}"

    @property
    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")
