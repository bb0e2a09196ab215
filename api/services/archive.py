"""Streamed .tar.gz of a directory: produced in a thread, consumed chunk by chunk."""

from __future__ import annotations

import queue
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

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


def iter_tar_gz(directory: Path, arcname: str) -> Iterator[bytes]:
    """Yield a gzip'd tar of `directory` (entries under `arcname/`), never all in memory."""
    chunks: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=32)
    stop = threading.Event()

    def produce() -> None:
        try:
            writer = _QueueWriter(chunks, stop)
            with tarfile.open(fileobj=writer, mode="w|gz") as tar:  # type: ignore[call-overload]
                for path in sorted(directory.rglob("*")):
                    if path.is_file() and not path.is_symlink():
                        tar.add(path, arcname=f"{arcname}/{path.relative_to(directory)}")
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


def directory_size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
