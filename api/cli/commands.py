"""`migrator` (or `python -m api.cli`): jobs, pods, logs and models from the terminal.

Exit codes: 0 done, 1 the API refused or could not be reached (or a watched job did not
succeed), 2 bad arguments, spec or settings, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import httpx

from api.cli import datasets
from api.cli.client import BadInput, Client, CliError, resolve_token
from api.cli.follow import progress_line, watch
from api.cli.terminal import echo, table
from api.sizes import human_size

DEFAULT_URL = "http://127.0.0.1:8000"


class Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other bad input (argparse adds the whole usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def read_spec(text: str) -> dict[str, Any]:
    """A job spec from JSON text, or from a file named after `@`."""
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as exc:
            raise BadInput(f"cannot read the spec file {text[1:]}: {exc.strerror}") from None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"the spec is not valid JSON: {exc}") from None
    if not isinstance(spec, dict):
        raise BadInput("the spec must be a JSON object, such as '{\"replicas\": 2}'")
    return spec


def build_parser() -> Parser:
    parser = Parser(prog="migrator", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the control plane ({DEFAULT_URL})")
    parser.add_argument("--token", help="default: MIGRATOR_ADMIN_TOKEN, else <data dir>/"
                                        "admin_token")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    submit = commands.add_parser("submit", help="start a job from a JSON spec")
    submit.add_argument("spec", nargs="?", default="{}", help="JSON object or @file.json")
    submit.add_argument("--watch", action="store_true", help="then watch it to the end")
    commands.add_parser("list", help="list jobs")
    for name, text in (("get", "a job as JSON"), ("watch", "follow a job to its end"),
                       ("cancel", "stop a job's pods; its record and checkpoints stay")):
        commands.add_parser(name, help=text).add_argument("job_id")
    delete = commands.add_parser("delete", help="remove an ended job's record")
    delete.add_argument("job_id")
    delete.add_argument("--artifacts", action="store_true",
                        help="also delete its checkpoints, logs and model")
    kill = commands.add_parser("kill", help="kill one pod of a job")
    kill.add_argument("job_id")
    kill.add_argument("ordinal", type=int)
    kill.add_argument("--grace-seconds", type=float, default=0)
    finish = commands.add_parser("finish", help="end a job early, after an epoch, and export "
                                                "its model")
    finish.add_argument("job_id")
    finish.add_argument("--after-epoch", type=int, help="the epoch (from 1) to end after; "
                                                        "default: the one under way")
    scale = commands.add_parser("scale", help="run a job on N pods (1 to its max_replicas)")
    scale.add_argument("job_id")
    scale.add_argument("replicas", type=int)
    migrate = commands.add_parser("migrate", help="move one pod of a job, live")
    migrate.add_argument("job_id")
    migrate.add_argument("ordinal", type=int)
    migrate.add_argument("--node", help="the node to move it to (Kubernetes); default: any "
                                        "other")
    logs = commands.add_parser("logs", help="the last lines of a pod's log")
    logs.add_argument("job_id")
    logs.add_argument("ordinal", type=int)
    logs.add_argument("--lines", type=int, default=200)
    commands.add_parser("login-url", help="a dashboard login URL that works once, for 10 "
                                          "minutes")
    commands.add_parser("models", help="list trained models")
    predict = commands.add_parser("predict", help="classify texts with a model")
    predict.add_argument("model_id")
    predict.add_argument("texts", nargs="+", metavar="TEXT")
    download = commands.add_parser("download", help="download a model as .tar.gz")
    download.add_argument("model_id")
    download.add_argument("--output", type=Path)
    datasets.add_parser(commands)
    datasets.add_stagings_parser(commands)
    return parser


def main(argv: list[str] | None = None, http: httpx.Client | None = None) -> int:
    """The console script; `http` replaces the connection to the API (tests pass a TestClient)."""
    args = build_parser().parse_args(argv)
    try:
        client = Client(args.url, resolve_token(args.token), http)
        return run(client, args)
    except CliError as exc:
        echo(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        echo("", file=sys.stderr)
        return 130


def follow(client: Client, job_id: str) -> int:
    try:
        job = watch(client, job_id)
    except KeyboardInterrupt:
        # Supervisors are detached on purpose: leaving the watch leaves the job running.
        echo("", f"stopped watching; {job_id} goes on (migrator cancel {job_id} stops it)",
             file=sys.stderr)
        return 130
    if job["status"] != "succeeded":
        echo(f"{job_id} {job['status']}" + (f": {job['reason']}" if job["reason"] else ""),
             file=sys.stderr)
        return 1
    return 0


def run(client: Client, args: argparse.Namespace) -> int:
    if args.command == "submit":
        job = client.request("POST", "/api/v1/jobs", json=read_spec(args.spec))
        echo(job["id"])
        return follow(client, job["id"]) if args.watch else 0
    if args.command == "list":
        for job in client.request("GET", "/api/v1/jobs")["data"]:
            echo(progress_line(job))
    elif args.command == "get":
        echo(*json.dumps(client.request("GET", f"/api/v1/jobs/{args.job_id}"),
                         indent=2).splitlines())
    elif args.command == "watch":
        return follow(client, args.job_id)
    elif args.command == "cancel":
        echo(client.cancel(args.job_id)["detail"])
    elif args.command == "delete":
        params = {"delete_artifacts": "true"} if args.artifacts else {}
        client.request("DELETE", f"/api/v1/jobs/{args.job_id}", params=params)
        echo(f"deleted {args.job_id}" + (" with its checkpoints, logs and model"
                                         if args.artifacts else
                                         "; its checkpoints, logs and model are kept"))
    elif args.command == "kill":
        answer = client.request("POST", f"/api/v1/jobs/{args.job_id}/pods/{args.ordinal}/kill",
                                json={"grace_seconds": args.grace_seconds})
        echo(answer["detail"])
    elif args.command == "finish":
        answer = client.request("POST", f"/api/v1/jobs/{args.job_id}/finish",
                                json={"after_epoch": args.after_epoch})
        echo(f"{answer['id']}: {answer['detail']}")
    elif args.command == "scale":
        job = client.request("PATCH", f"/api/v1/jobs/{args.job_id}",
                             json={"replicas": args.replicas})
        echo(f"{job['id']}: {job['spec']['replicas']} pods (at most "
             f"{job['spec']['max_replicas']})")
    elif args.command == "migrate":
        body = {"node": args.node} if args.node else {}
        answer = client.request(
            "POST", f"/api/v1/jobs/{args.job_id}/pods/{args.ordinal}/migrate", json=body)
        echo(answer["detail"])
    elif args.command == "logs":
        answer = client.request("GET", f"/api/v1/jobs/{args.job_id}/pods/{args.ordinal}/logs",
                                params={"lines": args.lines})
        echo(*answer["lines"])
    elif args.command == "login-url":
        link = client.request("POST", "/api/v1/login-codes")
        echo(args.url.rstrip("/") + link["url"])
    elif args.command == "models":
        print_models(client.request("GET", "/api/v1/models")["data"])
    elif args.command == "predict":
        answer = client.request("POST", f"/api/v1/models/{args.model_id}/predict",
                                json={"texts": args.texts})
        predictions = answer["predictions"]
        echo(*table(["LABEL", "SCORE", "TEXT"],
                    [[p["label"], f"{p['score']:.3f}", text]
                     for p, text in zip(predictions, args.texts, strict=True)], right=[1]))
    elif args.command == "datasets":
        return datasets.run(client, args)
    elif args.command == "stagings":
        return datasets.run_stagings(client, args)
    elif args.command == "download":
        target = args.output or Path(f"{args.model_id}.tar.gz")
        client.download(f"/api/v1/models/{args.model_id}/download", target)
        echo(target)
    return 0


def print_models(models: list[dict[str, Any]]) -> None:
    rows = []
    for model in models:
        accuracy = model["metrics"].get("test_accuracy")
        rows.append([model["id"], model["job_id"], model["base_model"], model["dataset"],
                     "-" if accuracy is None else f"{100 * accuracy:.1f}%",
                     human_size(model["size_bytes"])])
    echo(*table(["ID", "JOB", "BASE MODEL", "DATASET", "TEST ACC", "SIZE"], rows, right=[4, 5]))


if __name__ == "__main__":
    sys.exit(main())
