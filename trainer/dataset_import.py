"""A dataset file imported by reference (`https://`, `s3://`, `az://`): an initializer fetches it
into the inputs dir, then checks it and keeps its normal form as an upload is kept
(trainer.contract.tables), so that the same file, uploaded or imported, is one dataset.

S3 and Azure Blob are read through the artifact store's clients, with their credentials and
endpoints from the standard environment variables (trainer.contract.artifact_store), never
from the URL; the web with httpx, following redirects.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path, PurePosixPath
from typing import IO, Any
from urllib.parse import urlsplit

from trainer.contract import artifact_store, tables
from trainer.contract.staged import (
    HUB_DIR,
    IMPORT_SCHEMES,
    PARTIAL_DIR,
    Report,
    file_key,
    staged,
    staged_dir,
    staging_id,
    write_staged,
)

CHUNK = 1 << 20
PROGRESS_EVERY = 0.5


def fetch(source: str, target: Path, report: Report) -> tuple[str, str]:
    """Copy `source` to `target`, reporting the bytes as they come: (its SHA-256, the media
    type the server gave, if any)."""
    scheme = urlsplit(source).scheme
    if scheme not in IMPORT_SCHEMES:
        raise ValueError(f"cannot import from '{scheme}://': use one of "
                         f"{', '.join(s + '://' for s in IMPORT_SCHEMES)}")
    if scheme in ("http", "https"):
        import httpx

        timeout = httpx.Timeout(60.0, read=300.0)
        with httpx.stream("GET", source, follow_redirects=True, timeout=timeout) as response:
            response.raise_for_status()
            length = response.headers.get("content-length")
            report(bytes_total=int(length) if length else None)
            sha256 = _copy(response.iter_bytes(), target, report)  # as it arrives
            return sha256, response.headers.get("content-type", "").split(";")[0].strip()
    path = artifact_store.location(source)
    report(bytes_total=path.stat().st_size)
    with artifact_store.open_file(path) as handle:
        return _copy(_chunks(handle), target, report), ""


def _chunks(handle: IO[bytes]) -> Any:
    while chunk := handle.read(CHUNK):
        yield chunk


def _copy(chunks: Any, target: Path, report: Report) -> str:
    digest, done, shown = hashlib.sha256(), 0, 0.0
    with target.open("wb") as handle:
        for chunk in chunks:
            handle.write(chunk)
            digest.update(chunk)
            done += len(chunk)
            if time.monotonic() - shown > PROGRESS_EVERY:
                shown = time.monotonic()
                report(bytes_done=done)
    report(bytes_done=done)
    return digest.hexdigest()


def stage_file(key: str, options_json: str, inputs: Path, report: Report) -> Path:
    """Import the file the options name (unless it is already) and return the folder whose
    staged.json names the dataset it became."""
    done = staged(inputs, "file", key)
    if done is not None:
        report(state="succeeded", already=True)
        return done
    options: dict[str, Any] = json.loads(options_json)
    source, text, label = options["source"], options.get("text_column"), options.get(
        "label_column")
    if file_key(source, text, label) != key:
        raise ValueError(f"the import's key is {file_key(source, text, label)}, not {key}")
    partial = inputs / HUB_DIR / PARTIAL_DIR / f"{staging_id('file', key)}.download"
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        sha256, media_type = fetch(source, partial, report)
        name = options.get("name") or PurePosixPath(urlsplit(source).path).name or None
        record, _ = tables.keep(partial, sha256, name, media_type, text, label, inputs)
    finally:
        partial.unlink(missing_ok=True)
    target = staged_dir(inputs, "file", key)
    write_staged(target, {"kind": "file", "repo_id": key, "source": source,
                          "dataset_id": record["id"], "files": [record["name"]],
                          "bytes": record["upload_bytes"], "staged_at": time.time()})
    report(state="succeeded", bytes_done=record["upload_bytes"], dataset_id=record["id"])
    return target
