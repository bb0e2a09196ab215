"""Staged assets against today's path (issue 25), with the model and data served by a real hub
mirror (olah, tests/hub/.venv, as `make test-setup` installs it). Two parts, run by
bench/assets.py:

- `rejoin`: what a recreated pod does before it can heal, `trainer.prepare` (tokenizer, the
  tokenized splits, the seeded model), each time in a fresh process with an empty cache of its
  own, as every pod on a cluster has. Three paths: `warm` (today's on this machine: the model a
  local directory, the tokens in the shared cache), `download` (today's on a cluster: the model
  and dataset downloaded from the hub into the pod's cache, then tokenized there) and `staged`
  (the initializer staged model, dataset and tokens once: the pod reads them). For MiniLM-L6
  and for BERT-base's shape (random weights, MiniLM's vocabulary). The goal: staged within
  1.2x of warm.
- `first-step`: `python -m api` with the local backend; the time from `POST /api/v1/jobs` to
  the first committed step of a 2-pod job on a hub model and the `imdb` alias, for the first
  job (which stages) and a second one on the same assets (which stages nothing).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.api_ingest import ADMIN, TOKEN
from tests.hub.mirror import HubMirror
from tests.support import free_port

IMDB = "stanfordnlp/imdb"
PREPARE = """
import json, sys, time
started = time.perf_counter()
from trainer.config import JobSpec, Runtime, TrainConfig
from trainer.prepare import prepare
import torch
imported = time.perf_counter()
spec = JobSpec.model_validate_json(sys.argv[1])
runtime = Runtime(inputs_dir=sys.argv[2], cache_dir=sys.argv[3], checkpoint_dir=sys.argv[3])
prepare(TrainConfig(spec, runtime), torch.device("cpu"))
print(json.dumps({"imports": imported - started, "prepare": time.perf_counter() - imported}))
"""


def imdb_like(folder: Path, rows: int) -> Path:
    """IMDB's layout and shape: Parquet splits of `rows` reviews of about 230 words each."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench.assets import BAD, GOOD, WORDS

    rng = random.Random(0)
    for split in ("train", "test"):
        labels = [index % 2 for index in range(rows)]
        texts = [" ".join(rng.choice((GOOD if label else BAD) if rng.random() < 0.1 else WORDS)
                          for _ in range(230)) for label in labels]
        (folder / "plain_text").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": texts, "label": labels}),
                       folder / "plain_text" / f"{split}-00000-of-00001.parquet")
    return folder


def hub_env(mirror: HubMirror, home: Path, offline: bool) -> dict[str, str]:
    flag = "1" if offline else "0"
    return {**os.environ, "HF_ENDPOINT": mirror.endpoint, "HF_HOME": str(home),
            "HF_HUB_OFFLINE": flag, "HF_DATASETS_OFFLINE": flag,
            "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": str(Path.cwd())}


def timed_prepare(spec: dict[str, Any], inputs: Path, cache: Path, env: dict[str, str],
                  ) -> dict[str, float]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PREPARE, json.dumps(spec), str(inputs),
                           str(cache)], env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"prepare failed:\n{done.stderr[-3000:]}")
    times: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return times | {"total": time.perf_counter() - started}


def download(mirror: HubMirror, repo_id: str, kind: str, target: Path, home: Path) -> None:
    """What from_pretrained and load_dataset fetch by hub id, into the pod's own cache (olah
    answers their probes for absent files with 401, so the bench fetches the same files)."""
    script = ("import sys; from huggingface_hub import snapshot_download; "
              "snapshot_download(sys.argv[1], repo_type=sys.argv[2], local_dir=sys.argv[3])")
    subprocess.run([sys.executable, "-c", script, repo_id, kind, str(target)],
                   env=hub_env(mirror, home, offline=False), check=True, capture_output=True)


def initialize(mirror: HubMirror, inputs: Path, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trainer.initializer", *args, "--inputs", str(inputs)],
                   env=hub_env(mirror, inputs.parent / "hf-init", offline=False), check=True,
                   capture_output=True)
    return time.perf_counter() - started


def rejoin(mirror: HubMirror, root: Path, models: dict[str, Path], rounds: int) -> None:
    from trainer.contract.spec import JobSpec
    from trainer.contract.staged import STAGED_FILE, staged_dir, tokens_key

    inputs = root / "inputs"
    print("| model | path | prepare (s, median) | with imports (s) | x warm |")
    print("|---|---|---|---|---|")
    for name, source in models.items():
        repo = f"bench/{name}"
        spec = {"model": repo, "dataset": "imdb", "preset": "seed", "max_length": 256}
        staging = {"model": initialize(mirror, inputs, "model", repo),
                   "dataset": initialize(mirror, inputs, "dataset", IMDB)}
        staging["tokens"] = initialize(mirror, inputs, "tokens",
                                       tokens_key(JobSpec.model_validate(spec), inputs),
                                       "--spec", json.dumps(spec))
        local = {**spec, "model": str(source)}
        warm_cache = root / "warm-cache"
        timed_prepare(local, inputs, warm_cache, hub_env(mirror, root / "hf-warm", True))
        results: dict[str, list[dict[str, float]]] = {"warm": [], "download": [], "staged": []}
        for round_ in range(rounds):
            results["warm"].append(timed_prepare(local, inputs, warm_cache,
                                                 hub_env(mirror, root / "hf-warm", True)))
            pod = root / f"pod-{name}-{round_}"  # a new pod: nothing of its own cached
            fetch_started = time.perf_counter()
            download(mirror, repo, "model", pod / "model", pod / "hf")
            download(mirror, IMDB, "dataset", pod / "imdb", pod / "hf")
            fetched = time.perf_counter() - fetch_started
            # Where the trainer finds a dataset on disk (as load_dataset's cache would hold it).
            target = staged_dir(pod / "inputs", "dataset", IMDB)
            target.parent.mkdir(parents=True)
            (pod / "imdb").rename(target)
            (target / STAGED_FILE).write_text("{}")
            today = timed_prepare({**spec, "model": str(pod / "model")}, pod / "inputs",
                                  pod / "cache", hub_env(mirror, pod / "hf", True))
            results["download"].append({key: value + fetched if key != "imports" else value
                                        for key, value in today.items()})
            results["staged"].append(timed_prepare(spec, inputs, root / f"empty-{round_}",
                                                   hub_env(mirror, pod / "hf2", True)))
            shutil.rmtree(pod, ignore_errors=True)
        warm = statistics.median(r["prepare"] for r in results["warm"])
        for path, runs in results.items():
            prepare = statistics.median(r["prepare"] for r in runs)
            total = statistics.median(r["total"] for r in runs)
            print(f"| {name} | {path} | {prepare:.2f} | {total:.2f} | {prepare / warm:.2f} |")
        print(f"| {name} | staging once (model, dataset, tokens) | "
              f"{' + '.join(f'{value:.1f}' for value in staging.values())} s | | |")


def first_step(mirror: HubMirror, root: Path) -> None:
    port = free_port()
    env = {**hub_env(mirror, root / "hf-api", offline=True), "HF_HUB_OFFLINE": "0",
           "MIGRATOR_DATA_DIR": str(root / "data"), "MIGRATOR_ADMIN_TOKEN": TOKEN}
    api = subprocess.Popen([sys.executable, "-m", "api", "--port", str(port)], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    http = httpx.Client(base_url=url, headers=ADMIN, timeout=30)
    try:
        _wait(lambda: _healthy(http), 60)
        spec = {"model": "bench/minilm", "dataset": "imdb", "preset": "seed", "replicas": 2,
                "epochs": 1, "max_length": 128, "batch_size": 16}
        print("| job | status after POST | POST to first committed step (s) | files fetched |")
        print("|---|---|---|---|")
        times = []
        for label in ("first (stages)", "second (same assets)"):
            fetched = len(mirror.fetches())
            started = time.perf_counter()
            created = http.post("/api/v1/jobs", json=spec).json()
            job_id = created["id"]
            _wait(lambda job_id=job_id: http.get(f"/api/v1/jobs/{job_id}/events",
                                                  params={"type": "metric"}).json()["data"], 600)
            times.append(time.perf_counter() - started)
            print(f"| {label} | {created['status']} | {times[-1]:.1f} | "
                  f"{len(mirror.fetches()) - fetched} |")
            http.post(f"/api/v1/jobs/{job_id}/cancel")
        print(f"\nsecond / first: {times[1] / times[0]:.2f}")
    finally:
        http.close()
        api.terminate()
        api.wait(30)
        for job_dir in (root / "data" / "jobs").glob("job-*"):
            from api.backends.local.backend import LocalBackend

            LocalBackend(root / "data" / "jobs").delete(job_dir.name)


def _healthy(http: httpx.Client) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def _wait(condition: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.2)
    return value


def run(parts: list[str], rows: int, rounds: int, bert_base: bool) -> None:
    from bench.trainer_overhead import prepare_bert_base
    from trainer.model import offline_model_dir

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        mirror = HubMirror(root / "mirror")
        models = {"minilm": offline_model_dir()}
        if bert_base:
            models["bert-base"], _ = prepare_bert_base(Path("runs/bench-bert-base"), 256)
        for name, source in models.items():
            copy = root / "sources" / name
            shutil.copytree(source, copy, ignore=shutil.ignore_patterns(
                "*.onnx", "onnx", "openvino", "*.bin", "*.h5", "*.ot", "1_Pooling", "2_*"))
            mirror.add_model(f"bench/{name}", copy)
        mirror.add_dataset(IMDB, imdb_like(root / "imdb", rows))
        mirror.start()
        try:
            if "rejoin" in parts:
                print(f"\n### A recreated pod's preparation ({rows:,} IMDB-shaped reviews per "
                      f"split, preset seed, {rounds} rounds, each a new process)\n")
                rejoin(mirror, root / "rejoin", models, rounds)
            if "first-step" in parts:
                print("\n### POST to the first committed step (MiniLM-L6 from the mirror, 2 pods)"
                      "\n")
                first_step(mirror, root / "first-step")
        finally:
            mirror.stop()
