"""Where a job's artifacts (checkpoints, the exported model) live: a local directory, or an object
store through fsspec (R50). The trainer writes there; the API lists, streams and deletes.

`location()` reads an artifacts URL: a plain path or `file://...` is a directory (a
`pathlib.Path`, as before stores existed); `az://container/prefix` is Azure Blob (adlfs) and
`s3://bucket/prefix` S3 or MinIO (obstore's fsspec filesystem), both with pathlib's interface
(universal_pathlib). Credentials and endpoints come only from the client libraries' standard
environment variables (`AZURE_STORAGE_CONNECTION_STRING`; `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL`, `AWS_REGION`), never from a URL, so that no secret
reaches a spec, an event or a log.

An object store differs from a directory in what the writers rely on: nothing is durable before
an upload completes (there is no fsync), there is no atomic rename, and other processes' writes
must be seen at once (so directory listings are never cached). Writers stage under a temporary
prefix, `move()` file by file with the completion marker last, and delete the marker first
(`remove()`); readers trust nothing without the marker.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Annotated, Any, cast
from urllib.parse import urlsplit

from pydantic import PlainSerializer, PlainValidator
from upath import UPath

PROTOCOLS = ("az", "abfs", "s3")
"""The object stores an artifacts URL may name, besides `file://` and plain paths.

S3 goes through obstore (Rust's object_store), not s3fs: s3fs's botocore wants
python-dateutil<3, which the kubernetes client (>=36) does not allow beside it."""

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT")
"""Where an S3-compatible server (MinIO, a test server) is, as the AWS clients read it."""


class StoreError(ValueError):
    """An artifacts URL that names no supported store, or carries credentials."""


def location(value: str | os.PathLike[str] | UPath) -> Path | UPath:
    """The directory or object-store prefix `value` names (see the module's docstring)."""
    if isinstance(value, Path | UPath):
        return value
    text = os.fspath(value)
    parts = urlsplit(text)
    if parts.scheme in ("", "file"):
        return Path(parts.path if parts.scheme else text)
    if parts.scheme not in PROTOCOLS:
        raise StoreError(f"unsupported artifacts URL {text!r}: use a path, file://, "
                         f"{', '.join(f'{p}://' for p in PROTOCOLS)}")
    if parts.username or parts.password or parts.query:
        raise StoreError("an artifacts URL carries no credentials or options: the store's "
                         "client reads them from its standard environment variables")
    if not parts.netloc:
        raise StoreError(f"artifacts URL {text!r} names no bucket or container")
    if parts.scheme == "s3":
        return UPath(text.rstrip("/"), **_s3_options())
    # Every process must see the others' writes at once: no cached listings.
    return UPath(text.rstrip("/"), use_listings_cache=False)


@functools.cache
def _use_obstore_for_s3() -> None:
    """fsspec's s3:// is obstore's filesystem in this process (once: each registration makes a
    new class, and with it new clients)."""
    import obstore.fsspec

    obstore.fsspec.register("s3")


def _s3_options() -> dict[str, Any]:
    """S3 through obstore's fsspec filesystem, which caches no listings. obstore reads the AWS
    variables itself; it refuses plain HTTP unless told, and an `http://` endpoint the user set
    is that telling (MinIO in a cluster, a test server)."""
    _use_obstore_for_s3()
    endpoint = next((os.environ[name] for name in ENDPOINT_VARIABLES if os.environ.get(name)), "")
    return {"client_options": {"allow_http": True}} if endpoint.startswith("http://") else {}


Location = Annotated[Path | UPath, PlainValidator(location), PlainSerializer(str)]
"""A field holding a `location()`: validated from a path or URL, written as its string."""


def is_local(path: Path | UPath) -> bool:
    return isinstance(path, Path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(path: Path | UPath) -> None:
    """Make a directory's entries durable (nothing to do in an object store)."""
    if isinstance(path, Path):
        _fsync(path)


def write_durable(path: Path | UPath, write: Callable[[IO[bytes]], Any]) -> None:
    """Write a file through `write(handle)`; durable on return (fsynced, or fully uploaded)."""
    with path.open("wb") as handle:
        if isinstance(path, Path):
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        else:
            write(cast(IO[bytes], _Copying(handle)))


class _Copying:
    """A writable handle that copies what it is given before passing it on. obstore's writer
    keeps the buffer it is handed until it uploads it, while torch.save hands out memoryviews
    of a buffer it then reuses: uncopied, the upload would carry later bytes."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle

    def write(self, data: bytes | memoryview) -> int:
        return self._handle.write(bytes(data))

    def flush(self) -> None:
        self._handle.flush()


def entries(directory: Path | UPath) -> list[Path | UPath]:
    """What lies directly in `directory`: none when it does not exist (as an object store's
    prefix does not until it holds a file). In a store, one listing request."""
    if isinstance(directory, Path):
        return list(directory.iterdir()) if directory.is_dir() else []
    root = directory.path.rstrip("/")
    try:
        found = directory.fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    return [directory / name.rsplit("/", 1)[-1] for name in found if name.rstrip("/") != root]


def files(directory: Path | UPath) -> Iterator[tuple[str, Path | UPath]]:
    """(path relative to `directory`, path) of every file below it, sorted; no symlinks."""
    if isinstance(directory, Path):
        for path in sorted(directory.rglob("*")):
            if path.is_file() and not path.is_symlink():
                yield path.relative_to(directory).as_posix(), path
        return
    root = directory.path.rstrip("/")
    for found in sorted(directory.fs.find(root)):
        relative = found[len(root):].lstrip("/")
        if relative:
            yield relative, directory.joinpath(*relative.split("/"))


def size(directory: Path | UPath) -> int:
    """Bytes of every file below `directory`."""
    if isinstance(directory, Path):
        return sum(p.stat().st_size for _, p in files(directory))
    details = directory.fs.find(directory.path.rstrip("/"), detail=True)
    return sum(int(info.get("size") or 0) for info in details.values())


def remove(directory: Path | UPath, first: str | None = None) -> None:
    """Delete `directory` and all below it; the file `first` (a completion marker) before the
    rest, so that a deletion cut short never leaves something that looks whole."""
    if first is not None:
        (directory / first).unlink(missing_ok=True)
    if isinstance(directory, Path):
        shutil.rmtree(directory, ignore_errors=True)
    elif directory.exists():
        with contextlib.suppress(FileNotFoundError):  # another writer deleted it meanwhile
            directory.fs.rm(directory.path.rstrip("/"), recursive=True)


def move(source: Path | UPath, target: Path | UPath, last: str | None = None) -> None:
    """Move the directory `source` to `target`, which must not exist as a directory.

    A directory is renamed at once (atomic; OSError when `target` exists). In an object store
    every file is moved by a server-side copy, the file `last` (what readers wait for) after
    all others, and `target` may already hold the same files from a concurrent writer.
    """
    if isinstance(source, Path):
        assert isinstance(target, Path), (source, target)
        source.rename(target)
        return
    assert isinstance(target, UPath) and target.protocol == source.protocol, (source, target)
    relatives = sorted((relative for relative, _ in files(source)), key=lambda r: r == last)
    for relative in relatives:
        parts = relative.split("/")
        source.fs.mv(source.joinpath(*parts).path, target.joinpath(*parts).path)
    remove(source)


def upload(local: Path, target: UPath) -> None:
    """Copy the local directory `local` into the object store at `target`."""
    for relative, path in files(local):
        target.fs.put_file(str(path), target.joinpath(*relative.split("/")).path)


def download(source: UPath, local: Path) -> None:
    """Copy `source`, a prefix in an object store, to the local directory `local` (created)."""
    local.mkdir(parents=True, exist_ok=True)
    for relative, _ in files(source):
        destination = local / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        source.fs.get_file(source.joinpath(*relative.split("/")).path, str(destination))
