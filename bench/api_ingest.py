"""Report ingestion through HTTP: 20 concurrent reporters, 20 metric points per report.

Prints sustained metric points/s (goal >= 10,000 on a 2-core machine with SQLite) and the p99
latency of GET /api/v1/jobs/{id} measured during that load (goal < 50 ms), each also as a ratio
to its goal. The server is the real control plane (uvicorn, SQLite in WAL mode) in a subprocess,
with a backend that launches nothing.

    PYTHONPATH=. .venv/bin/python -m bench.api_ingest [--seconds 15] [--reporters 20] [--points 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.serve_noop import free_port

TOKEN = "bench-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def start_server(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "bench.serve_noop", str(data_dir),
                               str(port)])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                return server, url
        except httpx.HTTPError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("the server did not start")


async def reporter(client: httpx.AsyncClient, url: str, token: str, pod: str, points: int,
                   stop: float, counts: list[int]) -> None:
    seq, step = 0, 0
    headers = {"Authorization": f"Bearer {token}"}
    while time.monotonic() < stop:
        records = []
        for _ in range(points):
            seq, step = seq + 1, step + 1
            records.append({"seq": seq, "kind": "metric", "time": time.time(),
                            "data": {"step": step, "epoch": 1, "loss": 0.4,
                                     "samples_per_second": 100.0, "samples_seen": step * 16}})
        response = await client.post(url, headers=headers,
                                     json={"pod": pod, "incarnation": "bench", "records": records})
        response.raise_for_status()
        counts.append(points)


async def prober(client: httpx.AsyncClient, url: str, stop: float,
                 latencies: list[float]) -> None:
    while time.monotonic() < stop:
        start = time.perf_counter()
        response = await client.get(url, headers=ADMIN)
        response.raise_for_status()
        latencies.append(time.perf_counter() - start)
        await asyncio.sleep(0.05)


async def run(url: str, data_dir: Path, args: argparse.Namespace) -> tuple[float, list[float]]:
    async with httpx.AsyncClient(base_url=url, timeout=30,
                                 limits=httpx.Limits(max_connections=64)) as client:
        pods: list[tuple[str, str, str]] = []  # (report url, token, pod name)
        while len(pods) < args.reporters:
            replicas = min(16, args.reporters - len(pods))
            response = await client.post("/api/v1/jobs", headers=ADMIN,
                                         json={"replicas": replicas})
            response.raise_for_status()
            job_id = response.json()["id"]
            token = (data_dir / "bench-tokens" / job_id).read_text()
            pods += [(f"/api/v1/jobs/{job_id}/reports", token, f"{job_id}-{o}")
                     for o in range(replicas)]
        counts: list[int] = []
        latencies: list[float] = []
        warmup_stop = time.monotonic() + 2
        await asyncio.gather(*(reporter(client, u, t, p, args.points, warmup_stop, [])
                               for u, t, p in pods))
        start = time.monotonic()
        stop = start + args.seconds
        probe_job = pods[0][0].removesuffix("/reports")
        await asyncio.gather(prober(client, probe_job, stop, latencies),
                             *(reporter(client, u, t, p, args.points, stop, counts)
                               for u, t, p in pods))
        return sum(counts) / (time.monotonic() - start), latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--reporters", type=int, default=20)
    parser.add_argument("--points", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        server, url = start_server(Path(scratch))
        try:
            rate, latencies = asyncio.run(run(url, Path(scratch), args))
        finally:
            server.terminate()
            server.wait(timeout=30)
    p99 = statistics.quantiles(latencies, n=100)[98] * 1000
    print("| figure | measured | goal | ratio to goal |")
    print("|---|---|---|---|")
    print(f"| metric points/s ({args.reporters} reporters x {args.points} points/report) "
          f"| {rate:,.0f} | >= 10,000 | {rate / 10_000:.2f} |")
    print(f"| p99 GET /api/v1/jobs/{{id}} under that load ({len(latencies)} probes) "
          f"| {p99:.1f} ms | < 50 ms | {p99 / 50:.2f} |")


if __name__ == "__main__":
    main()
