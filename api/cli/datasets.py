"""`migrator datasets upload|import|list|show|delete`: the datasets jobs train on;
`migrator stagings [list|import|delete]`: the hub models and datasets staged for jobs."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import httpx

from api.cli.client import BadInput, Client
from api.cli.terminal import echo, printable, table
from api.sizes import human_size
from trainer.contract.staged import Kind

CHUNK = 1 << 20


def add_parser(commands: Any) -> None:
    datasets = commands.add_parser("datasets", help="upload, list, show or delete datasets")
    verbs = datasets.add_subparsers(dest="verb", required=True, metavar="VERB")
    upload = verbs.add_parser("upload", help="upload a CSV, TSV, JSONL or Parquet file")
    upload.add_argument("file", type=Path)
    upload.add_argument("--name", help="the name it is listed by (default: the file's)")
    upload.add_argument("--text-column", help="default: text, review, sentence, ...")
    upload.add_argument("--label-column", help="default: label, sentiment, class, ...")
    imported = verbs.add_parser("import", help="import a file by its URL (https, s3, az)")
    imported.add_argument("source", help="https://..., s3://bucket/key or az://container/blob")
    imported.add_argument("--name", help="the name it is listed by (default: the file's)")
    imported.add_argument("--text-column")
    imported.add_argument("--label-column")
    verbs.add_parser("list", help="list datasets")
    verbs.add_parser("show", help="a dataset's classes and first rows").add_argument("dataset_id")
    verbs.add_parser("delete", help="delete a dataset no running job uses").add_argument(
        "dataset_id")


def run(client: Client, args: argparse.Namespace) -> int:
    if args.verb == "upload":
        show(upload(client, args.file, args.name or args.file.name, args.text_column,
                    args.label_column))
    elif args.verb == "import":
        print_stagings([client.request("POST", "/api/v1/datasets/imports", json={
            "source": args.source, "name": args.name, "text_column": args.text_column,
            "label_column": args.label_column})])
        echo("follow it with: migrator stagings")
    elif args.verb == "list":
        rows = [[d["id"], d["name"], str(d["rows"]), "/".join(map(str, d["class_counts"])),
                 ", ".join(d["labels"]), human_size(d["size_bytes"])]
                for d in client.request("GET", "/api/v1/datasets")["data"]]
        echo(*table(["ID", "NAME", "ROWS", "BALANCE", "LABELS", "SIZE"], rows, right=[2, 5]))
    elif args.verb == "show":
        show(client.request("GET", f"/api/v1/datasets/{args.dataset_id}"))
    elif args.verb == "delete":
        client.request("DELETE", f"/api/v1/datasets/{args.dataset_id}")
        echo(f"deleted {args.dataset_id}")
    return 0


def upload(client: Client, path: Path, name: str, text_column: str | None,
           label_column: str | None) -> dict[str, Any]:
    try:
        total = path.stat().st_size
        handle = path.open("rb")
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    params = {key: value for key, value in (("name", name), ("text_column", text_column),
                                            ("label_column", label_column)) if value}
    with handle:
        answer: dict[str, Any] = client.request(
            "POST", "/api/v1/datasets", params=params, content=_sent(handle, total),
            headers={"Content-Length": str(total)},
            # No time limit while the body goes and the API checks it (minutes for gigabytes).
            extensions={"timeout": httpx.Timeout(None).as_dict()})
    return answer


def _sent(handle: Any, total: int) -> Iterator[bytes]:
    """The file a chunk at a time, with the share sent on stderr (where it is a terminal)."""
    sent, started, shown = 0, time.monotonic(), 0.0
    while chunk := handle.read(CHUNK):
        sent += len(chunk)
        yield chunk
        now = time.monotonic()
        if sys.stderr.isatty() and (now - shown > 0.2 or sent == total):
            shown = now
            rate = sent / max(now - started, 1e-6)
            sys.stderr.write(f"\r{100 * sent / max(total, 1):5.1f}%  {human_size(sent)} of "
                             f"{human_size(total)}  {human_size(rate)}/s")
            sys.stderr.flush()
    if sys.stderr.isatty():
        sys.stderr.write(" - checking\n")


def show(dataset: dict[str, Any]) -> None:
    counts = ", ".join(f"{printable(label)} {count}" for label, count in
                       zip(dataset["labels"], dataset["class_counts"], strict=True))
    echo(f"{dataset['id']}  {dataset['name']}  ({dataset['format']}, text column "
         f"'{dataset['text_column']}', label column '{dataset['label_column']}')",
         f"{dataset['rows']} rows: {counts}; dropped {dataset['duplicates']} duplicate and "
         f"{dataset['empty']} empty",
         *table(["LABEL", "TEXT"], [[row["label"], row["text"][:100]]
                                    for row in dataset["preview"]]))


def add_stagings_parser(commands: Any) -> None:
    stagings = commands.add_parser("stagings", help="hub models and datasets staged for jobs: "
                                                    "list (the default), import, delete")
    stagings.set_defaults(kind=None)  # `migrator stagings` alone lists every kind
    verbs = stagings.add_subparsers(dest="verb", metavar="VERB")
    verbs.add_parser("list", help="each staging with its progress").add_argument(
        "--kind", choices=get_args(Kind), help="only this kind (model: the base models)")
    staged = verbs.add_parser("import", help="stage a hub repository ahead of the jobs")
    staged.add_argument("kind", choices=["model", "dataset"])
    staged.add_argument("repo_id", help="org/name")
    staged.add_argument("--revision", default="main")
    verbs.add_parser("delete", help="remove a staging no running job reads").add_argument(
        "staging_id")


def run_stagings(client: Client, args: argparse.Namespace) -> int:
    if args.verb == "import":
        row = client.request("POST", "/api/v1/stagings", json={
            "kind": args.kind, "repo_id": args.repo_id, "revision": args.revision})
        print_stagings([row])
    elif args.verb == "delete":
        client.request("DELETE", f"/api/v1/stagings/{args.staging_id}")
        echo(f"deleted {args.staging_id}")
    else:
        params = {"kind": args.kind} if args.kind else {}
        print_stagings(client.request("GET", "/api/v1/stagings", params=params)["data"])
    return 0


def print_stagings(stagings: list[dict[str, Any]]) -> None:
    rows = []
    for row in stagings:
        done, total = row["bytes_done"], row["bytes_total"]
        progress = human_size(done) + (f" of {human_size(total)}" if total else "")
        eta = f"{row['eta_seconds']:.0f} s" if row.get("eta_seconds") is not None else ""
        named = row.get("source") or f"{row['repo_id']}@{row['revision']}"
        rows.append([row["id"], row["kind"], named,
                     row["status"], progress, eta, printable(row["error"] or "")[:80]])
    echo(*table(["ID", "KIND", "REPOSITORY", "STATUS", "PROGRESS", "ETA", "ERROR"], rows))
