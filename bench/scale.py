"""How the control plane's cost grows with active jobs and with a job's history.

    .venv/bin/python bench/scale.py [--jobs 10,100,200,500,1000] [--events 10000,300000]

1. The reconcile pass, in this process, against the noop backend (pods always Running): its
   time per pass and per active job (goal: at most 0.5 ms per active job, growing linearly).
2. `GET /api/v1/jobs` and `GET /api/v1/jobs/{id}` p99 through the real control plane
   (`python -m bench.serve_noop`) while it reconciles that many active jobs (goal: under 50 ms).
3. A job page over a long history: what the dashboard fetches for a job of 10k to 300k events
   (goal: usable in under 1 s; the API's memory flat).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlmodel import Session

from api.db import init_db, make_engine
from api.models import Job, JobStatus, Pod
from api.reconciler import Reconciler
from api.services.events import EventLog
from api.settings import Settings
from bench.api_ingest import ADMIN, start_server
from bench.serve_noop import NoopBackend
from trainer.contract.spec import JobSpec

PODS_PER_JOB = 2


def add_active_jobs(settings: Settings, backend: NoopBackend, count: int) -> None:
    """`count` running jobs of two Running pods each, written straight to the database."""
    spec = JobSpec(replicas=PODS_PER_JOB).model_dump(mode="json")
    engine = make_engine(settings)
    with Session(engine) as session:
        for _ in range(count):
            job_id = uuid.uuid4().hex[:12]
            session.add(Job(id=job_id, status=JobStatus.running, spec=spec,
                            report_token_hash="x" * 64))
            for ordinal in range(PODS_PER_JOB):
                session.add(Pod(job_id=job_id, ordinal=ordinal, name=f"{job_id}-{ordinal}",
                                phase="Running"))
            backend.replicas[job_id] = PODS_PER_JOB
        session.commit()
    engine.dispose()


def discard(job_id: str, events: list[dict[str, Any]]) -> None:
    """No dashboard listens in this process."""


def reconcile_pass(counts: list[int], passes: int) -> None:
    print("| active jobs | pass (median ms) | per job (ms) |")
    print("|---|---|---|")
    for count in counts:
        with tempfile.TemporaryDirectory() as scratch:
            settings = Settings(data_dir=Path(scratch), admin_token="bench-admin-token-0123456789")
            engine = make_engine(settings)
            init_db(engine)
            backend = NoopBackend(Path(scratch) / "tokens")
            add_active_jobs(settings, backend, count)
            reconciler = Reconciler(engine, settings, backend, EventLog(discard))
            reconciler.reconcile_once()  # the first pass may record changes: not timed
            times = []
            for _ in range(passes):
                start = time.perf_counter()
                reconciler.reconcile_once()
                times.append(time.perf_counter() - start)
            median = statistics.median(times) * 1000
            print(f"| {count} | {median:.1f} | {median / count:.3f} |", flush=True)
            engine.dispose()


def p99(http: httpx.Client, path: str, requests: int) -> float:
    times = []
    for _ in range(requests):
        start = time.perf_counter()
        http.get(path).raise_for_status()
        times.append(time.perf_counter() - start)
    return statistics.quantiles(times, n=100)[98] * 1000


def api_latency(counts: list[int], requests: int) -> None:
    """The real control plane (noop backend, reconciling every second) with `count` jobs
    created through the API; reads timed one after another."""
    print("| active jobs | GET /api/v1/jobs p99 (ms) | GET /api/v1/jobs/{id} p99 (ms) |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        server, url = start_server(Path(scratch))
        try:
            with httpx.Client(base_url=url, headers=ADMIN, timeout=60) as http:
                created: list[str] = []
                for count in counts:
                    while len(created) < count:
                        response = http.post("/api/v1/jobs", json={"replicas": PODS_PER_JOB})
                        response.raise_for_status()
                        created.append(response.json()["id"])
                    time.sleep(2)  # two reconcile passes: every job's pods are Running
                    jobs = p99(http, "/api/v1/jobs", requests)
                    one = p99(http, f"/api/v1/jobs/{created[len(created) // 2]}", requests)
                    print(f"| {count} | {jobs:.1f} | {one:.1f} |", flush=True)
        finally:
            server.kill()
            server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="10,100,200,500,1000")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    counts = [int(n) for n in args.jobs.split(",")]
    print("## 1. Reconcile pass (noop backend, SQLite)\n")
    reconcile_pass(counts, args.passes)
    print("\n## 2. API reads while the control plane reconciles (noop backend, SQLite)\n")
    api_latency(counts, args.requests)


if __name__ == "__main__":
    main()
