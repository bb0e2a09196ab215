"""The object-store fixtures (tests/stores.py) serve real stores: through fsspec (adlfs for
Azurite, obstore for moto's S3), configured by nothing but `Store.env`, a file is written, listed
and read back, and every location starts empty; a server that cannot start says why and leaves
nothing behind."""

from __future__ import annotations

import socket

import fsspec
import pytest
from upath import UPath

from tests.conftest import unavailable
from tests.stores import SERVERS, Store
from trainer.contract.artifact_store import files as store_files
from trainer.contract.artifact_store import location


def names(url: str) -> list[str]:
    """The files under `url`, relative to it."""
    fs, root = fs_and_root(url)
    return sorted(path.removeprefix(f"{root}/") for path in fs.find(root))


def fs_and_root(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and path the product's own `location` gives (with its S3 client)."""
    path = location(url)
    assert isinstance(path, UPath)
    return path.fs, path.path.rstrip("/")  # a bucket's own path ends in "/"


def test_a_file_is_written_listed_and_read_back(object_store: Store) -> None:
    url = object_store.new_location("round-trip")
    assert url.startswith(object_store.url_prefix)
    fs, root = fs_and_root(url)
    with fs.open(f"{root}/dir/hello.txt", "wb") as handle:
        handle.write(b"hello, store")

    assert names(url) == ["dir/hello.txt"]
    assert [entry["size"] for entry in fs.ls(f"{root}/dir", detail=True)] == [12]
    with fs.open(f"{root}/dir/hello.txt", "rb") as handle:
        assert handle.read() == b"hello, store"

    other = object_store.new_location("round-trip")
    assert other != url
    assert list(store_files(location(other))) == []


def test_location_names_are_unique_and_valid(object_store: Store) -> None:
    created = [object_store.new_location(name).removeprefix(object_store.url_prefix)
               for name in ("Checkpoints_Of JOB 7", "x" * 80, "--", "", "a")]
    assert created[0].startswith("checkpoints-of-job-7-")
    assert len(set(created)) == len(created)
    for name in created:
        assert 3 <= len(name) <= 63 and name == name.lower() and "--" not in name
        assert name[0].isalnum() and name[-1].isalnum()


@pytest.mark.parametrize("kind", list(SERVERS))
def test_a_server_that_cannot_listen_fails_and_leaves_nothing_behind(kind: str) -> None:
    binary = SERVERS[kind].installed()
    if binary is None:
        unavailable(SERVERS[kind].missing)
    server = SERVERS[kind](binary)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", server.port))
        taken.listen()
        with pytest.raises(AssertionError, match=r"exited before .* to listen; its output:"):
            server.start()
    assert server.process is not None and server.process.returncode is not None
    assert not server.root.exists()
