"""Serve the real control plane with a backend that launches nothing (benchmarks only).

    python -m bench.serve_noop DATA_DIR PORT [DATABASE_URL]
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import uvicorn

from api.app import create_app
from api.backends.base import (
    Launch,
    Moving,
    PodStatus,
    StagingRequest,
    Unsupported,
    WorkloadStatus,
)
from api.settings import Settings


class NoopBackend:
    """Pods that are always Running and never do anything: the load comes from the bench.

    It writes each job's report token to `<tokens_dir>/<job_id>` so the bench can report.
    """

    name = "noop"

    def __init__(self, tokens_dir: Path) -> None:
        self.tokens_dir = tokens_dir
        self.replicas: dict[str, int] = {}

    def launch(self, launch: Launch) -> None:
        self.replicas[launch.job_id] = launch.pods
        self.tokens_dir.mkdir(parents=True, exist_ok=True)
        (self.tokens_dir / launch.job_id).write_text(launch.report_token)

    def reconcile(self, job_id: str) -> None:
        pass

    def status(self, job_id: str) -> WorkloadStatus:
        return WorkloadStatus(present=True, pods=[
            PodStatus(ordinal=o, name=f"{job_id}-{o}", phase="Running", restarts=0)
            for o in range(self.replicas.get(job_id, 0))])

    def kill_pod(self, job_id: str, ordinal: int, grace_seconds: float) -> None:
        pass

    def scale(self, job_id: str, replicas: int) -> None:
        self.replicas[job_id] = replicas

    def migrate_pod(self, job_id: str, ordinal: int, node: str | None) -> Moving:
        return Moving(None)

    def delete(self, job_id: str) -> None:
        self.replicas.pop(job_id, None)

    def tail_logs(self, job_id: str, ordinal: int, lines: int) -> list[str]:
        return []

    def active_jobs(self) -> list[str]:
        return list(self.replicas)

    def stage(self, request: StagingRequest) -> None:
        raise Unsupported("the bench's jobs name nothing on the hub")

    def staging(self, staging_id: str) -> bool:
        return False

    def gone(self, job_id: str) -> bool:
        return job_id not in self.replicas


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    data_dir, port = Path(sys.argv[1]), int(sys.argv[2])
    database_url = sys.argv[3] if len(sys.argv) > 3 else None  # else SQLite in the data dir
    settings = Settings(data_dir=data_dir, admin_token="bench-admin-token-0123456789",
                        port=port, database_url=database_url)
    app = create_app(settings, NoopBackend(data_dir / "bench-tokens"))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
