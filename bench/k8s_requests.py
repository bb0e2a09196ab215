"""What the Kubernetes backend asks the API server on passes over quiet jobs.

    .venv/bin/python -m bench.k8s_requests [--jobs 10,100,200,500,1000] [--seconds 10]

The backend runs against the test suite's fake API server (tests/api/backends/k8s_fake/) with
`count` active jobs of two Running pods each, put straight into the fake's store as the backend
makes them (its own anchor and pod manifests). Passes like the reconciler's (reconcile, then
status, of every job, then `reconcile_interval`'s pause) run for `--seconds`; printed: the median
pass and the requests per second per job (goal: about zero), the watches' renewals left out (one
request per `k8s_watch_timeout`, whatever the jobs).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from api.backends.base import Launch
from api.backends.kubernetes.anchor import TEMPLATE_KEY, anchor
from api.backends.kubernetes.backend import KubernetesBackend, cluster_config
from api.backends.kubernetes.pods import trainer_pod
from api.settings import Settings
from tests.api.backends.k8s_fake import FakeApiServer, FakeCluster
from trainer.contract.spec import JobSpec

NS = "live-migrator"
PODS_PER_JOB = 2
WARM_PASSES = 2
"""Passes before the measured ones: the first records each job's restart tally on its anchor."""


def running_pod(pod: dict[str, Any], node: str) -> dict[str, Any]:
    """The pod as the kubelet reports it once its trainer runs and takes part in steps."""
    pod = copy.deepcopy(pod)
    container = pod["spec"]["containers"][0]
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running", "podIP": "10.244.0.10",
                     "startTime": "2026-11-27T00:00:00Z",
                     "conditions": [{"type": "Ready", "status": "True"}],
                     "containerStatuses": [{
                         "name": container["name"], "image": container["image"],
                         "ready": True, "started": True, "restartCount": 0, "lastState": {},
                         "state": {"running": {"startedAt": "2026-11-27T00:00:00Z"}}}]}
    return pod


def add_jobs(cluster: FakeCluster, settings: Settings, count: int) -> list[str]:
    """`count` jobs of two Running pods each, written straight to the fake's store."""
    config, jobs = cluster_config(settings), []
    with cluster.store.changed:
        for n in range(count):
            job_id = f"job-{n:08x}"
            directory = settings.jobs_dir / job_id
            launch = Launch(job_id=job_id, pods=PODS_PER_JOB, fault_tolerance="live",
                            spec=JobSpec(replicas=PODS_PER_JOB, fault_tolerance="live"),
                            report_url=f"http://api:8000/api/v1/jobs/{job_id}/reports",
                            report_token="token", peer_secret="secret",
                            checkpoint_dir=directory / "checkpoints",
                            model_dir=directory / "model",
                            inputs_dir=settings.resolved_inputs_dir, cache_dir=settings.cache_dir)
            owner = cluster.store.create("configmaps", NS, anchor(launch, config),
                                         validate=False)
            template = json.loads(owner["data"][TEMPLATE_KEY])
            for ordinal in range(PODS_PER_JOB):
                pod = trainer_pod(template, owner, ordinal, 0)
                cluster.store.create("pods", NS, running_pod(pod, cluster.nodes[ordinal]),
                                     validate=False)
            jobs.append(job_id)
    return jobs


def one_pass(backend: KubernetesBackend, jobs: list[str]) -> float:
    start = time.perf_counter()
    for job_id in jobs:  # what the control plane's reconciler does for each job
        backend.reconcile(job_id)
        backend.status(job_id)
    return time.perf_counter() - start


def measure(count: int, seconds: float) -> tuple[float, int, Counter[tuple[str, str]], float]:
    """(median pass in s, passes, requests by (verb, resource), elapsed s) at `count` jobs."""
    with tempfile.TemporaryDirectory() as scratch:
        server = FakeApiServer(FakeCluster())
        # The schema check of every write would be most of the first pass (the tests run it on
        # these very manifests); not what is measured here.
        server.cluster.store.validate = lambda plural, obj: None  # type: ignore[method-assign]
        try:
            kubeconfig = server.write_kubeconfig(Path(scratch) / "kubeconfig")
            settings = Settings(data_dir=Path(scratch) / "data", backend="kubernetes",
                                k8s_kubeconfig=kubeconfig)
            jobs = add_jobs(server.cluster, settings, count)
            # Nothing changes on quiet jobs: the fake's kubelet, scheduler and garbage collector
            # (a scan of every object each 20 ms, beside the backend) are stopped.
            server.cluster.close()
            backend = KubernetesBackend.from_settings(settings)
            try:
                for _ in range(WARM_PASSES):
                    one_pass(backend, jobs)
                before, times = len(server.cluster.requests), []
                start = time.perf_counter()
                while time.perf_counter() - start < seconds:
                    times.append(one_pass(backend, jobs))
                    time.sleep(settings.reconcile_interval)
                elapsed = time.perf_counter() - start
                asked = Counter(
                    (r.verb, r.resource) for r in server.cluster.requests[before:]
                    if r.verb != "watch")
            finally:
                backend.close()
        finally:
            server.stop()
    return statistics.median(times), len(times), asked, elapsed


def quiet_passes(counts: list[int], seconds: float) -> None:
    print("| active jobs | pass (median ms) | passes | requests per pass | "
          "requests/s per job | which |")
    print("|---|---|---|---|---|---|")
    for count in counts:
        median, passes, asked, elapsed = measure(count, seconds)
        total = sum(asked.values())
        which = ", ".join(f"{n} {verb} {resource}" for (verb, resource), n in asked.most_common())
        print(f"| {count:,} | {median * 1000:.1f} | {passes} | {total / passes:.1f} | "
              f"{total / elapsed / count:.3f} | {which or 'none'} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="10,100,200,500,1000")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    quiet_passes([int(n) for n in args.jobs.split(",")], args.seconds)


if __name__ == "__main__":
    main()
