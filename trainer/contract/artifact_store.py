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

A job's directory is written by its pods, which may plant symbolic links there (into another
job's directory, or anywhere the API can read). Nothing here follows a link at or below the
path it is given: a link is neither a file nor a directory, `files()` and `size()` leave it out,
`remove()` deletes the link and never what it points to, and `links()` names them, so that a
download or a prediction can refuse what holds one. What lies above the path is the caller's:
the API and the trainer resolve their roots once (the data dir, the artifacts URL, the API's
own links to a job's volumes). An object store has no links, but a key may hold `..` or empty
segments: `files()` leaves those out (a copy to a local directory must stay in it) and
`links()` names them too.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Annotated, Any, cast
from urllib.parse import urlsplit

from obstore.exceptions import InvalidPathError
from pydantic import PlainSerializer, PlainValidator
from upath import UPath

logger = logging.getLogger(__name__)

PROTOCOLS = ("az", "abfs", "s3")
"""The object stores an artifacts URL may name, besides `file://` and plain paths.

S3 goes through obstore (Rust's object_store), not s3fs: s3fs's botocore wants
python-dateutil<3, which the kubernetes client (>=36) does not allow beside it."""

STORE_VARIABLES = ("AZURE_", "AWS_")
"""Prefixes of the variables the stores' clients take credentials and endpoints from."""

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT")
"""Where an S3-compatible server (MinIO, a test server) is, as the AWS clients read it."""


class StoreError(ValueError):
    """An artifacts URL that names no supported store, or carries credentials."""


class UnlistableKey(OSError):
    """A prefix holding a key that is no path (`..`, `.` or empty segments): obstore refuses
    to list it at all, so nothing below the prefix can be listed."""


@contextlib.contextmanager
def _listing(directory: UPath) -> Iterator[None]:
    try:
        yield
    except InvalidPathError as exc:
        reason = str(exc).splitlines()[0]
        raise UnlistableKey(f"{directory} holds a key that is no path, which the store's "
                            f"client refuses to list: {reason}") from None


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


_NO_FOLLOW = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@contextlib.contextmanager
def _opened_dir(directory: Path) -> Iterator[int | None]:
    """A descriptor of the directory `directory`, opened without following a link there; None
    when it is missing, not a directory, or a link (said in a warning: a pod planted it)."""
    try:
        fd = os.open(directory, _NO_FOLLOW | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        if directory.is_symlink():
            logger.warning("not following the link %s (-> %s)", directory, _target(directory))
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _target(link: Path) -> str:
    with contextlib.suppress(OSError):
        return str(link.readlink())
    return "?"


def entries(directory: Path | UPath) -> list[Path | UPath]:
    """What lies directly in `directory`: none when it does not exist (as an object store's
    prefix does not until it holds a file), or is a link. In a store, one listing request."""
    if isinstance(directory, Path):
        with _opened_dir(directory) as fd:
            names = [] if fd is None else os.listdir(fd)  # noqa: PTH208 (by its descriptor)
        return [directory / name for name in sorted(names)]
    root = directory.path.rstrip("/")
    try:
        with _listing(directory):
            found = directory.fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    return [directory / name.rsplit("/", 1)[-1] for name in found if name.rstrip("/") != root]


def has_file(directory: Path | UPath, name: str) -> bool:
    """Whether `directory` (not a link) holds the file `name` (not a link)."""
    if isinstance(directory, UPath):
        return (directory / name).is_file()
    with _opened_dir(directory) as fd:
        if fd is None:
            return False
        try:
            return stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        except OSError:
            return False


def read_file(directory: Path | UPath, name: str) -> bytes:
    """The content of the file `name` in `directory`; OSError where either is a link."""
    if isinstance(directory, UPath):
        return (directory / name).read_bytes()
    with _opened_dir(directory) as fd:
        if fd is None:
            raise NotADirectoryError(f"{directory} is no directory (or a link, not followed)")
        with _open_regular(name, dir_fd=fd) as handle:
            return handle.read()


def open_file(path: Path | UPath) -> IO[bytes]:
    """`path` opened for reading; OSError where it is a link."""
    if isinstance(path, UPath):
        return cast(IO[bytes], path.open("rb"))
    return _open_regular(path)


def _open_regular(path: str | Path, dir_fd: int | None = None) -> IO[bytes]:
    """A regular file opened for reading, neither through a link nor blocking on a FIFO that
    replaced it after it was listed."""
    fd = os.open(path, _NO_FOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def _walk(directory: Path) -> Iterator[tuple[str, str, os.stat_result]]:
    """(relative directory, name, lstat) of everything below `directory`, never through a link
    (os.fwalk opens each directory by descriptor, without following one)."""
    if not stat.S_ISDIR(_lstat(directory)):
        return
    for parent, dirnames, filenames, fd in os.fwalk(directory, follow_symlinks=False):
        relative = os.path.relpath(parent, directory)
        for name in dirnames + filenames:
            with contextlib.suppress(FileNotFoundError):
                yield relative, name, os.stat(name, dir_fd=fd, follow_symlinks=False)


def _lstat(path: Path) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def _joined(relative: str, name: str) -> str:
    return name if relative == "." else f"{relative}/{name}"


def _unsafe(relative: str) -> bool:
    """A key that would climb out of a directory it is copied to, or names no file."""
    return any(part in ("", ".", "..") for part in relative.split("/"))


def links(directory: Path | UPath) -> list[str]:
    """What below `directory` the functions here will not follow, relative to it (`.` for
    `directory` itself): links in a directory, keys with `.`, `..` or empty segments in a store."""
    if isinstance(directory, UPath):
        root = directory.path.rstrip("/")
        with _listing(directory):
            found = directory.fs.find(root)
        return sorted(relative for key in found
                      if _unsafe(relative := key[len(root):].lstrip("/")))
    if stat.S_ISLNK(_lstat(directory)):
        return ["."]
    return sorted(_joined(relative, name) for relative, name, info in _walk(directory)
                  if stat.S_ISLNK(info.st_mode))


def files(directory: Path | UPath) -> Iterator[tuple[str, Path | UPath]]:
    """(path relative to `directory`, path) of every file below it, sorted; links (and unsafe
    keys, see `links`) left out, each with a warning."""
    if isinstance(directory, Path):
        if stat.S_ISLNK(_lstat(directory)):
            logger.warning("not following the link %s (-> %s)", directory, _target(directory))
        found = []
        for relative, name, info in _walk(directory):
            path = _joined(relative, name)
            if stat.S_ISLNK(info.st_mode):
                logger.warning("not following the link %s in %s", path, directory)
            elif stat.S_ISREG(info.st_mode):
                found.append(path)
        for path in sorted(found, key=lambda p: p.split("/")):
            yield path, directory / path
        return
    root = directory.path.rstrip("/")
    with _listing(directory):
        keys = directory.fs.find(root)
    for found in sorted(keys):
        relative = found[len(root):].lstrip("/")
        if relative and _unsafe(relative):
            logger.warning("leaving out the key %r in %s: it would not stay inside a copy",
                           relative, directory)
        elif relative:
            yield relative, directory.joinpath(*relative.split("/"))


def size(directory: Path | UPath) -> int:
    """Bytes of every file below `directory` (links not followed)."""
    if isinstance(directory, Path):
        return sum(info.st_size for _, _, info in _walk(directory) if stat.S_ISREG(info.st_mode))
    with _listing(directory):
        details = directory.fs.find(directory.path.rstrip("/"), detail=True)
    return sum(int(info.get("size") or 0) for info in details.values())


def remove(directory: Path | UPath, first: str | None = None) -> None:
    """Delete `directory` and all below it; the file `first` (a completion marker) before the
    rest, so that a deletion cut short never leaves something that looks whole. A link is
    deleted, never what it points to, be it `directory` itself or anything below it."""
    if isinstance(directory, UPath):
        if first is not None:
            (directory / first).unlink(missing_ok=True)
        with _listing(directory), contextlib.suppress(FileNotFoundError):
            # (another writer may delete it meanwhile)
            if directory.exists():
                directory.fs.rm(directory.path.rstrip("/"), recursive=True)
        return
    if stat.S_ISLNK(_lstat(directory)):
        logger.warning("deleting the link %s, not what it points to (%s)", directory,
                       _target(directory))
        directory.unlink(missing_ok=True)
        return
    with _opened_dir(directory) as fd:
        if fd is not None and first is not None:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(first, dir_fd=fd)
    # rmtree works by descriptors here: it unlinks the links below, never follows them, and
    # refuses a `directory` that became a link meanwhile.
    shutil.rmtree(directory, ignore_errors=True)


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
