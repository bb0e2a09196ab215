"""Report ingestion through HTTP: 20 concurrent reporters, 20 metric points per report.

Prints sustained metric points/s (goal >= 10,000 on a 2-core machine with SQLite) and the p99
latency of GET /api/v1/jobs/{id} measured during that load (goal < 50 ms), each also as a ratio
to its goal, for each database: SQLite in WAL mode (the default) and PostgreSQL (a throwaway
server started on a free port, tests/postgres.py; PostgreSQL's own processes share the 2 cores).
The server is the real control plane (uvicorn) in a subprocess, with a backend that launches
nothing.

    PYTHONPATH=. .venv/bin/python -m bench.api_ingest [--seconds 15] [--reporters 20] [--points 20]
        [--databases sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import json
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


def start_server(data_dir: Path, database_url: str | None = None,
                 ) -> tuple[subprocess.Popen[bytes], str]:
    """The noop control plane on a free port: SQLite in `data_dir`, or `database_url`."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "bench.serve_noop", str(data_dir),
                               str(port), *([database_url] if database_url else [])])
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


class RawConnection:
    """A minimal keep-alive HTTP/1.1 client: the load generator must cost far less than the
    server it measures (httpx spends about as much CPU per request as the server does)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str) -> RawConnection:
        host, port = url.removeprefix("http://").split(":")
        return cls(*await asyncio.open_connection(host, int(port)))

    async def post(self, path: str, token: str, body: bytes) -> int:
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            .encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.writer.close()


async def reporter(url: str, path: str, token: str, pod: str, points: int, stop: float,
                   counts: list[int], interval: float = 0.0) -> None:
    """Post reports until `stop`: back to back, or one every `interval` seconds (paced)."""
    connection = await RawConnection.open(url)
    seq, due = 0, time.monotonic()
    try:
        while time.monotonic() < stop:
            if interval:
                due += interval
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            records = []
            for _ in range(points):
                seq += 1
                records.append({"seq": seq, "kind": "metric", "time": time.time(),
                                "data": {"step": seq, "epoch": 1, "loss": 0.4,
                                         "learning_rate": 1e-4, "participants": 2,
                                         "samples_per_second": 100.0, "samples_seen": seq * 16}})
            body = json.dumps({"pod": pod, "incarnation": f"bench-{stop}",
                               "records": records}).encode()
            status = await connection.post(path, token, body)
            if status != 200:
                raise SystemExit(f"report rejected with HTTP {status}")
            counts.append(points)
    finally:
        connection.close()


async def prober(client: httpx.AsyncClient, url: str, stop: float,
                 latencies: list[float]) -> None:
    while time.monotonic() < stop:
        start = time.perf_counter()
        response = await client.get(url, headers=ADMIN)
        response.raise_for_status()
        latencies.append(time.perf_counter() - start)
        await asyncio.sleep(0.05)


async def phase(url: str, pods: list[tuple[str, str, str]], args: argparse.Namespace,
                probe: str, paced: float | None) -> tuple[float, list[float]]:
    """Report for args.seconds (back to back, or paced to `paced` points/s in all) while
    probing GET latency; return (points/s stored, GET latencies)."""
    interval = len(pods) * args.points / paced if paced else 0.0
    counts: list[int] = []
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        start = time.monotonic()
        stop = start + args.seconds
        await asyncio.gather(prober(client, probe, stop, latencies),
                             *(reporter(url, u, t, p, args.points, stop, counts, interval)
                               for u, t, p in pods))
        return sum(counts) / (time.monotonic() - start), latencies


async def run(url: str, data_dir: Path, args: argparse.Namespace,
              ) -> dict[str, tuple[float, list[float]]]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        pods: list[tuple[str, str, str]] = []  # (report path, token, pod name)
        while len(pods) < args.reporters:
            replicas = min(16, args.reporters - len(pods))
            response = await client.post("/api/v1/jobs", headers=ADMIN,
                                         json={"replicas": replicas})
            response.raise_for_status()
            job_id = response.json()["id"]
            token = (data_dir / "bench-tokens" / job_id).read_text()
            pods += [(f"/api/v1/jobs/{job_id}/reports", token, f"{job_id}-{o}")
                     for o in range(replicas)]
    probe = pods[0][0].removesuffix("/reports")
    warmup = argparse.Namespace(**{**vars(args), "seconds": 2})
    await phase(url, pods, warmup, probe, None)
    return {"max": await phase(url, pods, args, probe, None),
            "paced": await phase(url, pods, args, probe, args.target)}


def measure(args: argparse.Namespace, database_url: str | None,
            ) -> dict[str, tuple[float, list[float]]]:
    with tempfile.TemporaryDirectory() as scratch:
        server, url = start_server(Path(scratch), database_url)
        try:
            return asyncio.run(run(url, Path(scratch), args))
        finally:
            server.terminate()
            server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--reporters", type=int, default=20)
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--target", type=float, default=10_000,
                        help="points/s of the paced phase (the goal's load)")
    parser.add_argument("--databases", default="sqlite,postgresql")
    args = parser.parse_args()
    results: dict[str, dict[str, tuple[float, list[float]]]] = {}
    for database in args.databases.split(","):
        if database == "sqlite":
            results[database] = measure(args, None)
        elif database == "postgresql":
            from tests.postgres import PostgresServer, server_bin

            bin_dir = server_bin()
            if bin_dir is None:
                raise SystemExit("PostgreSQL is not installed (apt-get install postgresql)")
            postgres = PostgresServer(bin_dir).start()
            try:
                results[database] = measure(args, postgres.create_database())
            finally:
                postgres.stop()
        else:
            parser.error(f"unknown database {database!r}: sqlite or postgresql")
    print("| database | figure | measured | goal | ratio to goal |")
    print("|---|---|---|---|---|")
    for database, result in results.items():
        rate, _ = result["max"]
        paced_rate, latencies = result["paced"]
        p50, p99 = (statistics.quantiles(latencies, n=100)[i] * 1000 for i in (49, 98))
        print(f"| {database} | sustained metric points/s, {args.reporters} reporters x "
              f"{args.points} points per report, back to back | {rate:,.0f} | >= 10,000 | "
              f"{rate / 10_000:.2f} |")
        print(f"| {database} | p99 GET /api/v1/jobs/{{id}} while {paced_rate:,.0f} points/s are "
              f"ingested ({len(latencies)} probes, p50 {p50:.1f} ms) | {p99:.1f} ms | < 50 ms | "
              f"{p99 / 50:.2f} |")
    if {"sqlite", "postgresql"} <= set(results):
        ratio = results["postgresql"]["max"][0] / results["sqlite"]["max"][0]
        print(f"\npostgresql/sqlite sustained points/s: {ratio:.2f}")


if __name__ == "__main__":
    main()
