"""The object-store fixture (tests/stores.py) serves a real store: through fsspec (adlfs),
configured by nothing but `Store.env`, a file is written, listed and read back, and every
location starts empty; a server that cannot start says why and leaves nothing behind."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import fsspec
import pytest

from tests.conftest import unavailable
from tests.stores import AzuriteServer, Store, azurite_bin


@pytest.fixture
def store(azurite: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """The store, its variables in os.environ for this test, where the client libraries look.
    fsspec keeps filesystems by their arguments, not by the environment they read: those made
    here are forgotten afterwards, so that no later test gets one bound to this server."""
    for name, value in azurite.env.items():
        monkeypatch.setenv(name, value)
    filesystem = fsspec.get_filesystem_class(azurite.url_prefix.removesuffix("://"))
    filesystem.clear_instance_cache()
    yield azurite
    filesystem.clear_instance_cache()


def names(location: str) -> list[str]:
    """The files under `location`, relative to it."""
    fs, root = fsspec.url_to_fs(location)
    return sorted(path.removeprefix(f"{root}/") for path in fs.find(root))


def test_a_file_is_written_listed_and_read_back(store: Store) -> None:
    location = store.new_location("round-trip")
    assert location.startswith(store.url_prefix)
    with fsspec.open(f"{location}/dir/hello.txt", "wb") as handle:
        handle.write(b"hello, store")

    assert names(location) == ["dir/hello.txt"]
    fs, root = fsspec.url_to_fs(location)
    assert [entry["size"] for entry in fs.ls(f"{root}/dir", detail=True)] == [12]
    with fsspec.open(f"{location}/dir/hello.txt", "rb") as handle:
        assert handle.read() == b"hello, store"

    other = store.new_location("round-trip")
    assert other != location
    assert names(other) == []


def test_location_names_are_unique_and_valid(store: Store) -> None:
    created = [store.new_location(name).removeprefix(store.url_prefix)
               for name in ("Checkpoints_Of JOB 7", "x" * 80, "--", "", "a")]
    assert created[0].startswith("checkpoints-of-job-7-")
    assert len(set(created)) == len(created)
    for name in created:
        assert 3 <= len(name) <= 63 and name == name.lower() and "--" not in name
        assert name[0].isalnum() and name[-1].isalnum()


def test_a_server_that_cannot_listen_fails_and_leaves_nothing_behind() -> None:
    binary = azurite_bin()
    if binary is None:
        unavailable("Azurite is not installed (make setup: npm ci in tests/stores; Node.js)")
    server = AzuriteServer(binary)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", server.port))
        taken.listen()
        with pytest.raises(AssertionError, match=r"exited before .* to listen; its output:"):
            server.start()
    assert server.process is not None and server.process.returncode is not None
    assert not server.root.exists()
