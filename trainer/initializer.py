"""Stage one hub repository, a job's tokenized splits, or a dataset file imported by its URL,
under the inputs dir, once, for every job and pod that names them; or push a succeeded job's
model to the hub (trainer.hub_push).

    python -m trainer.initializer model org/name --revision main --inputs DIR [--progress FILE]
    python -m trainer.initializer tokens KEY --spec JSON --inputs DIR [--progress FILE]
    python -m trainer.initializer file KEY --spec '{"source": URL, ...}' --inputs DIR
    python -m trainer.initializer push org/name --revision JOB --spec '{"model_dir": ...}' ...

The control plane runs this before a job's pods start (a process of its own on the local
backend; on Kubernetes an initializer Job, the only pod allowed to reach the hub). It lists the
repository's files at the revision, downloads those a job needs into a folder of its own, writes
`staged.json` and moves the folder into place with one rename (trainer.contract.staged), so
that pods find the repository whole or not at all. While it works, its progress file (by
default the one trainer.contract.staged names, under the inputs dir) holds a JSON object that
the control plane shows: bytes done and in all, files, and at the end the outcome.
Exit status 0: staged (now, or already); 1: it could not be (the progress file says why).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from trainer.contract.staged import (
    DEFAULT_REVISION,
    HUB_DIR,
    PARTIAL_DIR,
    STAGED_FILE,
    TOKENS_DIR,
    Kind,
    progress_file,
    staged,
    staged_dir,
    staging_id,
    tokens_key,
    write_staged,
)

logger = logging.getLogger("trainer.initializer")

MODEL_SKIPPED = ("*.bin", "*.h5", "*.msgpack", "*.ot", "*.onnx", "*.tflite", "*.mlmodel",
                 "onnx/*", "coreml/*", "openvino/*", "*.gguf")
"""A model's files that no job loads when it has safetensors weights: other frameworks'
weights, and PyTorch's pickled ones."""
PROGRESS_EVERY = 0.5


def wanted(kind: Kind, files: list[str]) -> list[str]:
    """The files of a repository that a job reads."""
    if kind == "dataset" or not any(name.endswith(".safetensors") for name in files):
        return files
    return [name for name in files
            if not any(fnmatch.fnmatch(name, pattern) for pattern in MODEL_SKIPPED)]


class Progress:
    """The progress file, rewritten whole (write, then rename) as bytes arrive."""

    def __init__(self, path: Path) -> None:
        self.path, self.state = path, {"state": "running", "bytes_done": 0,
                                       "bytes_total": None, "files": 0, "error": None}

    def update(self, **changes: Any) -> None:
        self.state |= changes | {"updated": time.time()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(f".{os.getpid()}.tmp")  # one per writer
        partial.write_text(json.dumps(self.state))
        partial.replace(self.path)

    def watch(self, folder: Path, stop: threading.Event) -> threading.Thread:
        """Count the bytes under `folder` (finished and incomplete files) until `stop`."""
        def run() -> None:
            while not stop.wait(PROGRESS_EVERY):
                self.update(bytes_done=folder_bytes(folder))
        thread = threading.Thread(target=run, name="progress", daemon=True)
        thread.start()
        return thread


def folder_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(FileNotFoundError):  # an incomplete file renamed as it finished
            total += path.stat().st_size if path.is_file() else 0
    return total


def list_files(kind: Kind, repo_id: str, revision: str) -> tuple[str, dict[str, int | None]]:
    """(the commit the revision names, each file's size where the hub tells it)."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        info = api.repo_info(repo_id, repo_type=kind, revision=revision, files_metadata=True)
    except Exception:  # a mirror may not serve blob sizes: the names alone will do
        info = api.repo_info(repo_id, repo_type=kind, revision=revision)
    siblings = getattr(info, "siblings", None) or []
    return str(info.sha), {s.rfilename: s.size for s in siblings}


def stage(kind: Kind, repo_id: str, revision: str, inputs: Path, progress: Progress) -> Path:
    """Stage the repository (unless it is already) and return its directory."""
    done = staged(inputs, kind, repo_id, revision)
    if done is not None:
        progress.update(state="succeeded", already=True)
        return done
    from huggingface_hub import snapshot_download

    target = staged_dir(inputs, kind, repo_id, revision)
    sha, sizes = list_files(kind, repo_id, revision)
    files = wanted(kind, sorted(sizes))
    known = [sizes[name] for name in files]
    total = sum(size or 0 for size in known) if all(s is not None for s in known) else None
    progress.update(bytes_total=total, files=len(files), commit=sha)
    partial = inputs / HUB_DIR / PARTIAL_DIR / staging_id(kind, repo_id, revision)
    shutil.rmtree(partial, ignore_errors=True)  # a killed staging's leftovers
    partial.mkdir(parents=True)
    stop = threading.Event()
    watcher = progress.watch(partial, stop)
    try:
        snapshot_download(repo_id, repo_type=kind, revision=sha, local_dir=partial,
                          allow_patterns=files)
    finally:
        stop.set()
        watcher.join()
    shutil.rmtree(partial / ".cache", ignore_errors=True)  # the hub client's own bookkeeping
    size = folder_bytes(partial)
    meta = {"kind": kind, "repo_id": repo_id, "revision": revision, "commit": sha,
            "files": files, "bytes": size, "staged_at": time.time()}
    (partial / STAGED_FILE).write_text(json.dumps(meta, indent=2))
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        partial.rename(target)
    except OSError:  # staged meanwhile by another initializer: theirs stands
        if staged(inputs, kind, repo_id, revision) is None:
            raise
        shutil.rmtree(partial, ignore_errors=True)
    progress.update(state="succeeded", bytes_done=size, bytes_total=total or size)
    return target


def stage_tokens(key: str, spec_json: str, inputs: Path, progress: Progress) -> Path:
    """Tokenize the spec's splits into the staged tokens (unless they are there) and return
    the folder that says so."""
    done = staged(inputs, "tokens", key)
    if done is not None:
        progress.update(state="succeeded", already=True)
        return done
    from trainer.contract.spec import JobSpec
    from trainer.data import load_source, make_splits, token_file, tokenize
    from trainer.model import load_tokenizer, resolve_model

    spec = JobSpec.model_validate_json(spec_json)
    if tokens_key(spec, inputs) != key:
        raise ValueError(f"the spec's tokens key is {tokens_key(spec, inputs)}, not {key}")
    folder = inputs / HUB_DIR / TOKENS_DIR
    tokenizer = load_tokenizer(resolve_model(spec.model, inputs, spec.model_revision))
    with tempfile.TemporaryDirectory() as scratch:  # the datasets library's own cache
        splits = make_splits(load_source(spec, inputs, Path(scratch)), spec)
    parts = {"train": splits.train, "validation": splits.validation, "test": splits.test}
    progress.update(files=len(parts))
    files = {}
    for name, split in parts.items():
        tokenize(split, tokenizer, spec.max_length, folder.parent)  # into folder (its cache)
        files[name] = token_file(split, tokenizer, spec.max_length)
    size = sum((folder / file).stat().st_size for file in files.values())
    target = staged_dir(inputs, "tokens", key)
    write_staged(target, {"kind": "tokens", "repo_id": key, "files": files, "bytes": size,
                          "rows": {name: len(split) for name, split in parts.items()},
                          "staged_at": time.time()})
    progress.update(state="succeeded", bytes_done=size, bytes_total=size)
    return target


def run(args: argparse.Namespace, progress: Progress) -> Path:
    if args.kind == "tokens":
        return stage_tokens(args.repo_id, args.spec or "{}", args.inputs, progress)
    if args.kind == "file":
        from trainer.dataset_import import stage_file

        return stage_file(args.repo_id, args.spec or "{}", args.inputs, progress.update)
    if args.kind == "push":
        from trainer.hub_push import push

        return push(args.repo_id, args.revision, args.spec or "{}", args.inputs, progress.update)
    return stage(args.kind, args.repo_id, args.revision, args.inputs, progress)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.initializer",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["model", "dataset", "tokens", "file", "push"])
    parser.add_argument("repo_id", help="a hub repository; for tokens and file, their key")
    parser.add_argument("--revision", default=DEFAULT_REVISION,
                        help="a branch, tag or commit; for push, the job's id")
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--progress", type=Path)
    parser.add_argument("--spec", help="as JSON: the job spec (tokens), the import (file), the "
                                       "model and its repository's visibility (push)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    staging = staging_id(args.kind, args.repo_id, args.revision)
    progress = Progress(args.progress or progress_file(args.inputs, staging))
    progress.update()
    lock = args.inputs / HUB_DIR / PARTIAL_DIR / f"{staging}.lock"
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        with lock.open("w") as handle:
            # One initializer of a staging at a time (one left running by a control plane that
            # stopped, and the one its successor started): the second finds it staged.
            fcntl.flock(handle, fcntl.LOCK_EX)
            directory = run(args, progress)
    except Exception as exc:  # the hub client raises many types; each ends the staging alike
        logger.error("staging %s %s@%s failed: %s", args.kind, args.repo_id, args.revision, exc)
        progress.update(state="failed", error=f"{type(exc).__name__}: {exc}"[:2000])
        return 1
    logger.info("staged %s %s@%s in %s", args.kind, args.repo_id, args.revision, directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
