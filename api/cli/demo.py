"""`python -m api.cli.demo`: the main job. Start the control plane, submit the offline demo job,
show its progress until it finishes, then keep serving (interactive) or stop (non-interactive).
Ctrl-C cancels the job (its supervisor would keep it training) and stops the control plane.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Any

import httpx

from api.cli.client import BadInput, Client, CliError, configured_token, load_settings
from api.cli.commands import read_spec
from api.cli.follow import watch
from api.cli.terminal import echo
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m api.cli.demo", description=__doc__)
    parser.add_argument("--host", help="default: MIGRATOR_HOST, else 127.0.0.1")
    parser.add_argument("--port", type=int, help="default: MIGRATOR_PORT, else 8000")
    parser.add_argument("--spec", help="a job spec to run instead of the demo job (JSON object "
                                       "or @file.json)")
    args = parser.parse_args(argv)
    try:
        spec: dict[str, Any] = read_spec(args.spec) if args.spec else DEMO_SPEC
        # Checked here: the control plane would only say it exited.
        settings = load_settings()
    except CliError as exc:
        echo(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    host = settings.host if args.host is None else args.host
    port = settings.port if args.port is None else args.port
    url = f"http://{host}:{port}"
    server = subprocess.Popen([sys.executable, "-m", "api", "--host", host, "--port", str(port)],
                              start_new_session=True)
    client: Client | None = None
    job_id: str | None = None
    try:
        wait_healthy(url, server)
        token = configured_token(settings)
        if token is None:
            raise BadInput(f"the control plane wrote no admin token to {settings.admin_token_file}")
        shown = shown_token(settings, token, sys.stdout.isatty())
        client = Client(url, token)
        job = client.request("POST", "/api/v1/jobs", json=spec)
        job_id = job["id"]
        named = f": {job['name']}" if job["name"] else ""
        echo("", f"Submitted {job_id}{named}, {job['spec']['replicas']} pods. Kill a pod while "
             "it trains:", f"  curl -X POST -H \"Authorization: Bearer {shown}\" "
             f"{url}/api/v1/jobs/{job_id}/pods/1/kill", "")
        final = watch(client, job_id)
        job_id = None  # finished: nothing left to cancel
        if final["status"] != "succeeded":
            reason = f": {final['reason']}" if final["reason"] else ""
            echo("", f"The demo job {final['status']}{reason}")
            return 1
        metrics = final["metrics"]
        echo("", f"Done: test accuracy {100 * metrics.get('test_accuracy', 0):.1f}%, "
             f"F1 {100 * metrics.get('test_f1', 0):.1f}%. Model {final['model_id']}:",
             f"  curl -H \"Authorization: Bearer {shown}\" -o model.tar.gz "
             f"{url}/api/v1/models/{final['model_id']}/download")
        if sys.stdin.isatty():
            echo("", f"The control plane keeps running on {url}; Ctrl-C stops it.")
            server.wait()
        return 0
    except KeyboardInterrupt:
        if client is not None and job_id is not None:
            cancel(client, job_id)
        return 130
    except CliError as exc:
        echo(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        if server.poll() is None:
            echo("Stopping the control plane.")
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


def shown_token(settings: Settings, token: str, terminal: bool) -> str:
    """The token as the printed commands show it: itself only on a terminal, else where to
    read it (the demo's output may go to a log)."""
    if terminal:
        return token
    if settings.admin_token:
        return "$MIGRATOR_ADMIN_TOKEN"
    return f"$(cat {settings.admin_token_file})"


def cancel(client: Client, job_id: str) -> None:
    """Cancel the demo's job: its supervisor is detached and would otherwise train on."""
    echo("", f"Interrupted: cancelling {job_id} ...")
    try:
        answer = client.cancel(job_id)
    except (CliError, KeyboardInterrupt) as exc:
        reason = str(exc) or "interrupted again"
        echo(f"error: {job_id} was not cancelled ({reason}); it trains on", file=sys.stderr)
        return
    echo(f"Cancelled {job_id}: {answer['detail']}")


if __name__ == "__main__":
    sys.exit(main())
