"""`python -m api.cli`: submit, list, watch, kill and download from the terminal."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from api.settings import Settings

FINISHED = ("succeeded", "failed", "cancelled")


class CliError(Exception):
    pass


def resolve_token(explicit: str | None) -> str:
    """--token, else MIGRATOR_ADMIN_TOKEN, else the token the server generated in its data dir."""
    if explicit:
        return explicit
    settings = Settings()
    if settings.admin_token:
        return settings.admin_token
    path = settings.data_dir / "admin_token"
    if path.is_file():
        return path.read_text().strip()
    raise CliError("no token: pass --token, set MIGRATOR_ADMIN_TOKEN, or run where the server's "
                   "data dir is")


class Client:
    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(base_url=url.rstrip("/"), timeout=30,
                                 headers={"Authorization": f"Bearer {token}"})

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach {self.http.base_url}: {exc}") from None
        if response.is_error:
            raise CliError(f"{response.status_code}: {response.text}")
        return response.json()


def progress_line(job: dict[str, Any]) -> str:
    progress, metrics = job["progress"], job["metrics"]
    total = progress["total_samples"]
    share = f"{100 * progress['samples_seen'] / total:5.1f}%" if total else "  ...%"
    pods = " ".join(f"{p['ordinal']}:{p['phase'][:4]}" + (f"(r{p['restarts']})"
                                                           if p["restarts"] else "")
                    for p in job["pods"])
    loss = f"loss {metrics['loss']:.3f}" if "loss" in metrics else ""
    speed = f"{metrics['samples_per_second']:.0f} samples/s" if "samples_per_second" in metrics \
        else ""
    eta = f"eta {progress['eta_seconds']:.0f}s" if progress.get("eta_seconds") else ""
    return (f"{job['id']} {job['status']:<9} epoch {progress['epoch']}/{progress['epochs']} "
            f"step {progress['step']} {share} {loss} {speed} {eta} pods [{pods}]")


def watch(client: Client, job_id: str, interval: float = 1.0) -> dict[str, Any]:
    """Print new job/pod/checkpoint events and the progress line until the job finishes.

    On a terminal the progress line is redrawn in place; otherwise it is printed when it changes.
    """
    after, shown, tty = 0, "", sys.stdout.isatty()
    while True:
        job = client.request("GET", f"/api/v1/jobs/{job_id}")
        events = client.request("GET", f"/api/v1/jobs/{job_id}/events",
                                params={"after": after, "type": ["job", "pod", "checkpoint"]})
        for event in events["data"]:
            after = event["id"]
            data = event["data"]
            text = data.get("message") or f"checkpoint {data.get('path')} (step {data.get('step')})"
            source = f"{data['pod']}: " if "pod" in data else ""
            print(("\r\033[K" if tty else "") + f"  [{event['type']}] {source}{text}")
        line = progress_line(job)
        if tty:
            print(f"\r\033[K{line}", end="", flush=True)
        elif line != shown:
            print(line, flush=True)
        shown = line
        if job["status"] in FINISHED:
            if tty:
                print()
            return job
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m api.cli", description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--token")
    commands = parser.add_subparsers(dest="command", required=True)
    submit = commands.add_parser("submit", help="start a job from a JSON spec")
    submit.add_argument("spec", nargs="?", default="{}", help="JSON object or @file.json")
    submit.add_argument("--watch", action="store_true")
    commands.add_parser("list", help="list jobs")
    for name in ("get", "watch", "cancel"):
        commands.add_parser(name).add_argument("job_id")
    kill = commands.add_parser("kill", help="kill one pod of a job")
    kill.add_argument("job_id")
    kill.add_argument("ordinal", type=int)
    kill.add_argument("--grace-seconds", type=float, default=0)
    download = commands.add_parser("download", help="download a model as .tar.gz")
    download.add_argument("model_id")
    download.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    try:
        client = Client(args.url, resolve_token(args.token))
        return run(client, args)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def run(client: Client, args: argparse.Namespace) -> int:
    if args.command == "submit":
        text = Path(args.spec[1:]).read_text() if args.spec.startswith("@") else args.spec
        job = client.request("POST", "/api/v1/jobs", json=json.loads(text))
        print(job["id"])
        if args.watch:
            return 0 if watch(client, job["id"])["status"] == "succeeded" else 1
    elif args.command == "list":
        for job in client.request("GET", "/api/v1/jobs")["data"]:
            print(progress_line(job))
    elif args.command == "get":
        print(json.dumps(client.request("GET", f"/api/v1/jobs/{args.job_id}"), indent=2))
    elif args.command == "watch":
        return 0 if watch(client, args.job_id)["status"] == "succeeded" else 1
    elif args.command == "cancel":
        print(client.request("DELETE", f"/api/v1/jobs/{args.job_id}")["detail"])
    elif args.command == "kill":
        answer = client.request("POST", f"/api/v1/jobs/{args.job_id}/pods/{args.ordinal}/kill",
                                json={"grace_seconds": args.grace_seconds})
        print(answer["detail"])
    elif args.command == "download":
        target = args.output or Path(f"{args.model_id}.tar.gz")
        with client.http.stream("GET", f"/api/v1/models/{args.model_id}/download") as response:
            if response.is_error:
                raise CliError(f"{response.status_code}: {response.read().decode()}")
            with target.open("wb") as handle:
                for chunk in response.iter_bytes():
                    handle.write(chunk)
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
