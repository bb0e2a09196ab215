"""How the control plane's cost grows with active jobs and with a job's history.

    .venv/bin/python bench/scale.py [--jobs 10,100,200,500,1000] [--events 10000,300000]

1. The reconcile pass, in this process, against the noop backend (pods always Running): its
   time per pass and per active job (goal: at most 0.5 ms per active job, growing linearly).
2. `GET /api/v1/jobs` and `GET /api/v1/jobs/{id}` p99 through the real control plane
   (`python -m bench.serve_noop`) while it reconciles that many active jobs (goal: under 50 ms).
3. A job page over a long history: what the dashboard fetches for a job of 10k to 300k events
   (goal: usable in under 1 s; the API's memory flat).
4. The Kubernetes backend's requests to the API server on passes over that many quiet jobs,
   against the test suite's fake API server (bench/k8s_requests.py; goal: about zero).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil
from sqlmodel import Session

from api.db import init_db, make_engine
from api.models import Job, JobStatus, Pod
from api.reconciler import Reconciler
from api.services.events import EventLog
from api.settings import Settings
from bench.api_ingest import ADMIN, start_server
from bench.control_plane import wait
from bench.k8s_requests import quiet_passes
from bench.serve_noop import NoopBackend
from trainer.contract.spec import JobSpec

PODS_PER_JOB = 2


def add_active_jobs(settings: Settings, backend: NoopBackend, count: int) -> None:
    """`count` running jobs of two Running pods each, written straight to the database."""
    spec = JobSpec(replicas=PODS_PER_JOB)
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


def pods_running(http: httpx.Client, job_id: str) -> bool:
    return all(pod["phase"] == "Running"
               for pod in http.get(f"/api/v1/jobs/{job_id}").json()["pods"])


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
                    # Measured once the reconciler has seen every job's pods Running.
                    wait(functools.partial(pods_running, http, created[-1]), 60,
                         "the newest job's pods to run")
                    jobs = p99(http, "/api/v1/jobs", requests)
                    one = p99(http, f"/api/v1/jobs/{created[len(created) // 2]}", requests)
                    print(f"| {count} | {jobs:.1f} | {one:.1f} |", flush=True)
        finally:
            server.kill()
            server.wait()


def report_history(http: httpx.Client, job_id: str, token: str, events: int) -> None:
    """`events` metric points from the job's two pods (a step each), an evaluation every 1,000
    steps, through the real report endpoint."""
    auth = {"Authorization": f"Bearer {token}"}
    per_pod = events // PODS_PER_JOB
    for pod in range(PODS_PER_JOB):
        for start in range(0, per_pod, 1000):
            records: list[dict[str, Any]] = []
            for step in range(start + 1, min(start + 1000, per_pod) + 1):
                records.append({"seq": step, "kind": "metric", "time": 1.7e9 + step, "data": {
                    "step": step, "epoch": 1, "loss": 1.0 / step ** 0.5, "learning_rate": 1e-4,
                    "participants": 2, "samples_per_second": 100.0, "samples_seen": step * 32}})
            if pod == 0:
                records.append({"seq": start + 1000 + 1, "kind": "eval", "time": 1.7e9 + start,
                                "data": {"split": "validation", "accuracy": 0.8, "f1": 0.8,
                                         "loss": 0.4, "samples": 100, "epoch": 1,
                                         "step": start + 1000}})
            response = http.post(f"/api/v1/jobs/{job_id}/reports", headers=auth, json={
                "pod": f"{job_id}-{pod}", "incarnation": "bench", "records": records})
            response.raise_for_status()


def whole_history(http: httpx.Client, job_id: str) -> tuple[int, int, float]:
    """What the job page read before: every event, in pages of 1,000 (requests, bytes, s)."""
    start, after, requests, size = time.perf_counter(), 0, 0, 0
    while True:
        response = http.get(f"/api/v1/jobs/{job_id}/events",
                            params={"after": after, "limit": 1000})
        requests, size = requests + 1, size + len(response.content)
        after = response.json()["next_after"]
        if after is None:
            return requests, size, time.perf_counter() - start


def page_load(http: httpx.Client, job_id: str) -> tuple[int, int, float]:
    """What the job page reads now (web/static/history.js): the job, its series, its
    evaluations, then the timeline's newest 200 other events up to the series' last id
    (requests, bytes, s)."""
    start = time.perf_counter()
    job = http.get(f"/api/v1/jobs/{job_id}")
    series = http.get(f"/api/v1/jobs/{job_id}/series", params={"points": 2000})
    before = series.json()["last_id"] + 1
    requests, size = 2, len(job.content) + len(series.content)
    after: int | None = 0
    while after is not None:
        response = http.get(f"/api/v1/jobs/{job_id}/events", params={
            "type": "metric", "points": "false", "after": after, "before": before,
            "limit": 1000})
        requests, size = requests + 1, size + len(response.content)
        after = response.json()["next_after"]
    latest = http.get(f"/api/v1/jobs/{job_id}/events", params={
        "before": before, "newest": "true", "points": "false", "limit": 200,
        "type": ["metric", "checkpoint", "job", "pod", "log"]})
    requests, size = requests + 1, size + len(latest.content)
    return requests, size, time.perf_counter() - start


def job_pages(histories: list[int]) -> None:
    print("| events | whole history: requests, MiB, s | job page now: requests, KiB, s | "
          "API RSS (MiB) |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        server, url = start_server(Path(scratch))
        try:
            with httpx.Client(base_url=url, headers=ADMIN, timeout=120) as http:
                for events in histories:
                    job_id = http.post("/api/v1/jobs", json={"replicas": PODS_PER_JOB}).json()[
                        "id"]
                    token = (Path(scratch) / "bench-tokens" / job_id).read_text()
                    report_history(http, job_id, token, events)
                    old = whole_history(http, job_id)
                    new = page_load(http, job_id)
                    rss = psutil.Process(server.pid).memory_info().rss / 2**20
                    print(f"| {events:,} | {old[0]}, {old[1] / 2**20:.1f}, {old[2]:.2f} | "
                          f"{new[0]}, {new[1] / 2**10:.0f}, {new[2]:.2f} | {rss:.0f} |",
                          flush=True)
        finally:
            server.kill()
            server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="10,100,200,500,1000")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--events", default="10000,100000,300000")
    parser.add_argument("--k8s-seconds", type=float, default=10.0,
                        help="seconds of passes measured per count of jobs (part 4)")
    args = parser.parse_args()
    counts = [int(n) for n in args.jobs.split(",")]
    print("## 1. Reconcile pass (noop backend, SQLite)\n")
    reconcile_pass(counts, args.passes)
    print("\n## 2. API reads while the control plane reconciles (noop backend, SQLite)\n")
    api_latency(counts, args.requests)
    print("\n## 3. A job page over a long history (noop backend, SQLite)\n")
    job_pages([int(n) for n in args.events.split(",")])
    print("\n## 4. Kubernetes requests on passes over quiet jobs (fake API server)\n")
    quiet_passes(counts, args.k8s_seconds)


if __name__ == "__main__":
    main()
