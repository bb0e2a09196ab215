"""Assets (issue 25): a dataset upload's throughput and the API's peak memory for a large file;
with bench/staging.py, a recreated pod's preparation and the time to a job's first step, staged
against today's path.

Writes an IMDB-shaped CSV (reviews of about 1.3 kB, two classes, a few duplicates and empty
rows) of `--gib` GiB, starts the real control plane (uvicorn, SQLite, a backend that launches
nothing), then uploads the file as the request body (`POST /api/v1/datasets`, streamed) while
sampling the API process's resident memory every 20 ms. Prints:

- the time to send the body and to get the answer (the checks and the normal form written),
  and the throughput of each, against the baseline of copying the same file on this disk (the
  ratio: upload throughput / copy throughput);
- the API's peak resident memory above its idle memory (goal: within 50 MB).

    PYTHONPATH=. .venv/bin/python -m bench.assets [--gib 1] [--parts upload,rejoin,first-step]
        [--rows 25000] [--rounds 2] [--bert-base]
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

from bench.api_ingest import ADMIN, start_server

WORDS = ["film", "movie", "plot", "actor", "scene", "story", "script", "camera", "music",
         "ending", "character", "director", "performance", "cast", "dialogue", "moment",
         "screen", "minute", "hour", "audience"]
GOOD = ["great", "superb", "moving", "brilliant", "warm", "clever", "fun", "charming"]
BAD = ["dull", "boring", "awful", "weak", "tedious", "clumsy", "flat", "lifeless"]
CHUNK = 1 << 20


def write_reviews(path: Path, size: int) -> int:
    """An IMDB-shaped CSV of about `size` bytes (one row in 500 empty, one in 1,000 a
    duplicate); its row count."""
    rng = random.Random(0)
    bases = []
    for index in range(1000):
        sentiment = GOOD if index % 2 else BAD
        words = [rng.choice(sentiment if rng.random() < 0.1 else WORDS) for _ in range(200)]
        bases.append((" ".join(words), "positive" if index % 2 else "negative"))
    rows, previous = 0, ""
    with path.open("w", encoding="utf-8") as handle:
        handle.write("review,sentiment\n")
        while handle.tell() < size:
            for _ in range(1000):
                text, label = bases[rows % 1000]
                row = ("" if rows % 500 == 0 else previous if rows % 1000 == 999
                       else f"{text} {rows}")
                handle.write(f'"{row}",{label}\n')
                previous = row
                rows += 1
    return rows


def sample_memory(pid: int, stop: threading.Event, peak: list[int]) -> None:
    process = psutil.Process(pid)
    while not stop.is_set():
        peak[0] = max(peak[0], process.memory_info().rss)
        stop.wait(0.02)


def chunks(path: Path, sent: list[float]) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            yield chunk
    sent.append(time.monotonic())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="upload,rejoin,first-step",
                        help="upload (this module), rejoin and first-step (bench/staging.py)")
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rows", type=int, default=25_000,
                        help="reviews per split of the IMDB-shaped dataset the mirror serves")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bert-base", action="store_true",
                        help="rejoin also with BERT-base's shape (random weights, 440 MB)")
    args = parser.parse_args()
    parts = args.parts.split(",")
    if "upload" in parts:
        print("### A dataset upload\n")
        upload(args.gib)
    if {"rejoin", "first-step"} & set(parts):
        from bench import staging

        staging.run(parts, args.rows, args.rounds, args.bert_base)


def upload(gib: float) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-assets-") as scratch:
        root = Path(scratch)
        source = root / "reviews.csv"
        rows = write_reviews(source, int(gib * 1024**3))
        size = source.stat().st_size
        started = time.monotonic()
        shutil.copyfile(source, root / "copy.csv")
        copy_seconds = time.monotonic() - started
        (root / "copy.csv").unlink()
        print(f"file: {size / 1024**3:.2f} GiB, {rows} rows; a copy on this disk: "
              f"{copy_seconds:.1f} s ({size / copy_seconds / 1e6:.0f} MB/s)")

        server, url = start_server(root / "data")
        try:
            # A first, small upload: what the API imports to read tables (pyarrow, pandas) is
            # loaded once, and counted apart from what an upload's size costs.
            before = psutil.Process(server.pid).memory_info().rss
            warm = httpx.post(f"{url}/api/v1/datasets", params={"name": "warm.csv"},
                              content=b"text,label\n" + b"".join(
                                  b"t%d,%d\n" % (i, i % 2) for i in range(20)),
                              headers=ADMIN, timeout=60)
            assert warm.status_code == 201, warm.text
            idle = psutil.Process(server.pid).memory_info().rss
            print(f"API memory before any upload {before / 1e6:.0f} MB, after a first small "
                  f"one {idle / 1e6:.0f} MB (the table readers' imports)")
            peak, stop = [idle], threading.Event()
            sampler = threading.Thread(target=sample_memory, args=(server.pid, stop, peak))
            sampler.start()
            sent: list[float] = []
            started = time.monotonic()
            response = httpx.post(f"{url}/api/v1/datasets", params={"name": "reviews.csv"},
                                  content=chunks(source, sent), headers=ADMIN, timeout=None)
            answered = time.monotonic()
            stop.set()
            sampler.join()
        finally:
            server.terminate()
            server.wait(timeout=30)
        if response.status_code != 201:
            raise SystemExit(f"upload: {response.status_code} {response.text[:500]}")
        dataset = response.json()
        send_seconds = sent[0] - started
        total_seconds = answered - started
        print(f"dataset: {dataset['rows']} rows kept, {dataset['duplicates']} duplicates and "
              f"{dataset['empty']} empty dropped, classes {dataset['class_counts']}, normal form "
              f"{dataset['size_bytes'] / 1e6:.0f} MB")
        print(f"body sent in {send_seconds:.1f} s ({size / send_seconds / 1e6:.0f} MB/s); "
              f"answered after {total_seconds:.1f} s ({size / total_seconds / 1e6:.0f} MB/s "
              "from the first byte to the dataset)")
        print(f"ratio, upload throughput / disk copy throughput: "
              f"{copy_seconds / send_seconds:.2f} (body), {copy_seconds / total_seconds:.2f} "
              "(to the answer)")
        print(f"API memory: idle {idle / 1e6:.0f} MB, peak {peak[0] / 1e6:.0f} MB: "
              f"+{(peak[0] - idle) / 1e6:.0f} MB (goal: within 50 MB)")


if __name__ == "__main__":
    main()
