"""Hub repositories staged once under the inputs dir, as the initializer writes them and pods
read them.

A job that names a Hugging Face hub model (`org/name`) or a hub dataset alias (`imdb`) does not
send its pods to the hub: the control plane first stages each repository it names, once per
(kind, repository, revision), with an initializer (`python -m trainer.initializer`), into
`hub/<kind>s/<org>/<name>/<revision>/` under the inputs dir that every pod mounts. The
directory appears whole, with one rename, and holds `staged.json` (what was fetched: the
commit, the files, their bytes) beside the repository's files. Pods run with the hub client
offline (`OFFLINE_ENV`) and load the staged directory as a local model or dataset, so after
staging no pod fetches a byte from the hub, however often it is recreated.

A dataset file named by its URL (kind `file`: `https://`, `s3://`, `az://`) is fetched by an
initializer, checked and kept as an upload is (trainer.contract.tables), with
`hub/files/<key>/main/staged.json` naming the dataset it became.

A succeeded job's model pushed to the hub (kind `push`, `export.hub_repo` in its spec) is an
outbound staging: once per (repository, job), by an initializer, the one process that holds the
hub token, with `hub/pushes/<org>/<name>/<job>/staged.json` naming the commit it made.

The job's tokenized splits are staged too (kind `tokens`), once per `tokens_key` (the spec's
fields that decide them: the model's tokenizer, the dataset, the split, max_length): into
`hub/tokens/`, where pods find them before tokenizing (trainer.data.tokenize), with
`hub/tokens/<key>/main/staged.json` saying they are there. A recreated pod, whose own cache is
empty on a cluster, reads them instead of tokenizing again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from trainer.contract.spec import HUB_SOURCES

Report = Callable[..., None]
"""An initializer's progress update (trainer.initializer's Progress.update): fields of its
progress file, such as `bytes_done`, `bytes_total`, `files`, `state`."""
HUB_DIR = "hub"
"""The inputs dir's folder of staged hub repositories."""
PARTIAL_DIR = ".partial"
"""Inside HUB_DIR: stagings under way (a killed one's leftovers are removed on the next try)."""
PROGRESS_DIR = ".progress"
"""Inside HUB_DIR: each staging's progress file, which its initializer writes and the control
plane reads (both mount the inputs dir: the initializer's pod and the API's, on Kubernetes)."""
STAGED_FILE = "staged.json"
DEFAULT_REVISION = "main"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
"""Every pod's hub client is offline: what it loads from the hub was staged before it started."""
HUB_TOKEN_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
"""The hub token (and the name older clients read): for initializers, never a job's pods."""
ONLINE_ENV = {name: "0" for name in OFFLINE_ENV}
"""The initializer's: the one process that reaches the hub."""

TOKENS_DIR = "tokens"
"""Inside HUB_DIR: tokenized splits (trainer.data.tokenize's cache files)."""
TOKENS_FIELDS = ("model", "model_revision", "dataset", "dataset_revision", "text_column",
                 "label_column", "seed", "preset", "validation_fraction", "max_train_samples",
                 "max_eval_samples", "max_length")
"""The spec's fields that decide its tokenized splits."""

Kind = Literal["model", "dataset", "tokens", "file", "push"]
KIND_DIRS = {"model": "models", "dataset": "datasets", "tokens": TOKENS_DIR, "file": "files",
             "push": "pushes"}
IMPORT_SCHEMES = ("https", "http", "s3", "az")
"""Where a dataset file may be imported from (kind `file`): the web, S3, Azure Blob."""
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
REVISION = re.compile(r"^[\w.-]{1,100}$")


def staged_dir(inputs: Path, kind: Kind, repo_id: str, revision: str = DEFAULT_REVISION) -> Path:
    """Where a repository at a revision is staged (checked names: nothing climbs out)."""
    if not REPO_ID.match(repo_id) or ".." in repo_id:
        raise ValueError(f"'{repo_id}' is not a hub repository id")
    if not REVISION.match(revision) or revision.strip(".") == "":
        raise ValueError(f"'{revision}' is not a revision (a branch, tag or commit)")
    return inputs / HUB_DIR / KIND_DIRS[kind] / repo_id / revision


def file_key(source: str, text_column: str | None, label_column: str | None) -> str:
    """The id of a dataset file's import (a `file` staging's repository id): the same file read
    with the same columns is imported once."""
    key = json.dumps([source, text_column, label_column])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def tokens_key(spec: Any, inputs: Path) -> str:
    """The id of a spec's tokenized splits (a `tokens` staging's repository id): its fields
    that decide them, and the commits of the hub model and dataset it names as staged under
    `inputs`, so that a repository staged anew at another commit is tokenized anew."""
    fields: dict[str, Any] = {name: getattr(spec, name) for name in TOKENS_FIELDS}
    named: list[tuple[Kind, str, str]] = (
        [("dataset", HUB_SOURCES[spec.dataset][0], spec.dataset_revision)]
        if spec.dataset in HUB_SOURCES else [])
    if REPO_ID.match(spec.model) and ".." not in spec.model:
        named.append(("model", spec.model, spec.model_revision))
    commits = [read_staged(found).get("commit") for kind, repo, revision in named
               if (found := staged(inputs, kind, repo, revision)) is not None]
    if commits:
        fields["commits"] = commits
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def staging_id(kind: Kind, repo_id: str, revision: str = DEFAULT_REVISION) -> str:
    """The staging's id: one per (kind, repository, revision), so the same one is shared."""
    key = f"{kind}\0{repo_id}\0{revision}".encode()
    return "st-" + hashlib.sha256(key).hexdigest()[:16]


def progress_file(inputs: Path, staging: str) -> Path:
    return inputs / HUB_DIR / PROGRESS_DIR / f"{staging}.json"


def staged(inputs: Path, kind: Kind, repo_id: str,
           revision: str = DEFAULT_REVISION) -> Path | None:
    """The staged directory, if the repository is staged whole."""
    directory = staged_dir(inputs, kind, repo_id, revision)
    return directory if (directory / STAGED_FILE).is_file() else None


def write_staged(directory: Path, meta: dict[str, Any]) -> None:
    """Record `directory` (created) staged, with `meta`: written whole, then renamed."""
    directory.mkdir(parents=True, exist_ok=True)
    written = directory / f"{STAGED_FILE}.{os.getpid()}.tmp"  # one per writer
    written.write_text(json.dumps(meta, indent=2))
    written.replace(directory / STAGED_FILE)


def read_staged(directory: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((directory / STAGED_FILE).read_text())
    return meta
