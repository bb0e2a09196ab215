"""SSE fan-out: delivery delay from a report's arrival to each of 100 stream clients.

A reporter posts metric batches at a steady rate; every client measures, per event, the time from
the record's send time to its arrival. Prints p50/p99 for 1 client (baseline, same run) and for
100 clients, with the ratio (goal: p99 < 200 ms at 100 clients).

    PYTHONPATH=. .venv/bin/python -m bench.sse_fanout [--clients 100] [--posts 100] [--rate 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.api_ingest import ADMIN, start_server
from trainer.contract.records import Metric


async def listen(client: httpx.AsyncClient, path: str, expected: int, connected: asyncio.Event,
                 delays: list[float]) -> None:
    received = 0
    async with client.stream("GET", path, headers=ADMIN) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = json.loads(line[5:])
            if data.get("kind") != "metric":
                connected.set()
                continue
            delays.append(time.time() - data["time"])
            received += 1
            if received == expected:
                return


async def round_trip(url: str, data_dir: Path, clients: int, posts: int, rate: float,
                     points: int) -> list[float]:
    limits = httpx.Limits(max_connections=clients + 8)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        job = (await http.post("/api/v1/jobs", headers=ADMIN, json={"replicas": 1})).json()
        token = (data_dir / "bench-tokens" / job["id"]).read_text()
        delays: list[float] = []
        events = [asyncio.Event() for _ in range(clients)]
        listeners = [asyncio.create_task(listen(http, f"/api/v1/jobs/{job['id']}/stream",
                                                posts * points, event, delays))
                     for event in events]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 60)
        seq = 0
        for _ in range(posts):
            records = []
            for _ in range(points):
                seq += 1
                data = Metric(step=seq, epoch=1, loss=0.3, learning_rate=1e-4,
                              samples_per_second=100.0, participants=1, samples_seen=seq)
                records.append({"seq": seq, "kind": data.KIND, "time": time.time(),
                                "data": data.model_dump()})
            response = await http.post(f"/api/v1/jobs/{job['id']}/reports",
                                       headers={"Authorization": f"Bearer {token}"},
                                       json={"pod": f"{job['id']}-0", "incarnation": "b",
                                             "records": records})
            response.raise_for_status()
            await asyncio.sleep(1 / rate)
        await asyncio.wait_for(asyncio.gather(*listeners), 120)
        return delays


def summary(delays: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(delays, n=100)
    return cuts[49] * 1000, cuts[98] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--posts", type=int, default=100)
    parser.add_argument("--rate", type=float, default=10, help="posts per second")
    parser.add_argument("--points", type=int, default=5, help="metric records per post")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        server, url = start_server(Path(scratch))
        try:
            baseline = summary(asyncio.run(round_trip(url, Path(scratch), 1, args.posts,
                                                      args.rate, args.points)))
            loaded = summary(asyncio.run(round_trip(url, Path(scratch), args.clients,
                                                    args.posts, args.rate, args.points)))
        finally:
            server.terminate()
            server.wait(timeout=30)
    events = args.posts * args.points
    print("| clients | events each | p50 delay | p99 delay |")
    print("|---|---|---|---|")
    print(f"| 1 (baseline) | {events} | {baseline[0]:.1f} ms | {baseline[1]:.1f} ms |")
    print(f"| {args.clients} | {events} | {loaded[0]:.1f} ms | {loaded[1]:.1f} ms |")
    print(f"\np99 ratio {args.clients} clients / 1 client: {loaded[1] / baseline[1]:.2f}; "
          f"p99 at {args.clients} clients vs goal 200 ms: {loaded[1] / 200:.2f}")


if __name__ == "__main__":
    main()
