"""Streamed .tar.gz of a directory: produced in a thread, consumed chunk by chunk."""

from __future__ import annotations

import queue
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from upath import UPath

from api.errors import Conflict
from trainer.contract import artifact_store

_DONE = b""


class _Cancelled(Exception):
    pass


class _QueueWriter:
    """A write-only file object handing chunks to a bounded queue (back-pressure)."""

    def __init__(self, chunks: queue.Queue[bytes | BaseException], stop: threading.Event) -> None:
        self._chunks, self._stop = chunks, stop

    def write(self, data: bytes) -> int:
        while data:
            if self._stop.is_set():
                raise _Cancelled
            try:
                self._chunks.put(bytes(data), timeout=0.5)
                break
            except queue.Full:
                continue
        return len(data)

    def flush(self) -> None:
        pass


def refuse_links(directory: Path | UPath, what: str) -> None:
    """409 for a directory holding what the store layer follows nowhere (links, unsafe keys):
    an archive or a model loaded from it would lack them, or follow them."""
    refused = artifact_store.links(directory)
    if refused:
        shown = ", ".join(refused[:5]) + (f" and {len(refused) - 5} more" if len(refused) > 5
                                           else "")
        raise Conflict(f"{what} holds links that the API does not follow: {shown}")


def _add(tar: tarfile.TarFile, path: Path | UPath, name: str) -> None:
    # Opened without following a link (one may have replaced the file since it was listed).
    with artifact_store.open_file(path) as source:  # from an object store: streamed block by block
        if isinstance(path, Path):
            info = tar.gettarinfo(arcname=name, fileobj=source)
        else:
            info = tarfile.TarInfo(name)
            stat = path.stat()
            info.size, info.mtime = stat.st_size, int(stat.st_mtime or time.time())
            info.mode = 0o644
        tar.addfile(info, source)


def iter_tar_gz(directory: Path | UPath, arcname: str) -> Iterator[bytes]:
    """Yield a gzip'd tar of `directory` (a local one or an object store's prefix; entries
    under `arcname/`), never all in memory; links left out (`refuse_links` first)."""
    chunks: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=32)
    stop = threading.Event()

    def produce() -> None:
        try:
            writer = _QueueWriter(chunks, stop)
            with tarfile.open(fileobj=writer, mode="w|gz") as tar:  # type: ignore[call-overload]
                for relative, path in artifact_store.files(directory):
                    _add(tar, path, f"{arcname}/{relative}")
            chunks.put(_DONE)
        except _Cancelled:
            return
        except Exception as exc:  # handed to the consumer, which re-raises it
            chunks.put(exc)

    threading.Thread(target=produce, name="tar-stream", daemon=True).start()
    try:
        while True:
            chunk = chunks.get()
            if isinstance(chunk, BaseException):
                raise chunk
            if chunk == _DONE:
                return
            yield chunk
    finally:
        stop.set()  # the client went away or we are done: let the producer end

