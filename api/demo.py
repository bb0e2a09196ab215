"""`python -m api.demo`: the main job. Start the control plane, submit the offline demo job,
show its progress until it finishes, then keep serving (interactive) or stop (non-interactive).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import httpx

from api.cli import Client, watch
from api.settings import Settings

DEMO_SPEC = {"name": "demo: MiniLM on Rotten Tomatoes", "model": "minilm",
             "dataset": "rotten_tomatoes", "max_train_samples": 2000, "max_eval_samples": 500,
             "replicas": 2, "epochs": 1, "batch_size": 16, "fault_tolerance": "live"}


def wait_healthy(url: str, server: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the control plane exited with code {server.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the control plane did not answer on {url} within {timeout:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m api.demo", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    url = f"http://{args.host}:{args.port}"
    server = subprocess.Popen([sys.executable, "-m", "api", "--host", args.host,
                               "--port", str(args.port)], start_new_session=True)
    try:
        wait_healthy(url, server)
        settings = Settings()
        token = settings.admin_token or (settings.data_dir / "admin_token").read_text().strip()
        client = Client(url, token)
        job = client.request("POST", "/api/v1/jobs", json=DEMO_SPEC)
        print(f"\nSubmitted {job['id']}: {DEMO_SPEC['name']}, {DEMO_SPEC['replicas']} pods. "
              f"Kill a pod while it trains:\n  curl -X POST -H 'Authorization: Bearer {token}' "
              f"{url}/api/v1/jobs/{job['id']}/pods/1/kill\n", flush=True)
        final = watch(client, job["id"])
        if final["status"] != "succeeded":
            print(f"\nThe demo job {final['status']}: {final['reason']}")
            return 1
        metrics = final["metrics"]
        print(f"\nDone: test accuracy {100 * metrics.get('test_accuracy', 0):.1f}%, "
              f"F1 {100 * metrics.get('test_f1', 0):.1f}%. Model {final['model_id']}:\n"
              f"  curl -H 'Authorization: Bearer {token}' -o model.tar.gz "
              f"{url}/api/v1/models/{final['model_id']}/download")
        if sys.stdin.isatty():
            print(f"\nThe control plane keeps running on {url}; Ctrl-C stops it.")
            server.wait()
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
