"""Datasets imported by URL (`POST /api/v1/datasets/imports`), end to end: `python -m api` with
the local backend, real initializer processes fetching from a real web server, S3 (moto's
server) and Azure Blob (Azurite), each file checked and kept as an upload is."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import AUTH
from tests.api.control_plane import ControlPlane
from tests.api.fakes import FakeBackend
from tests.conftest import Processes
from tests.factories import make_reviews_csv
from tests.stores import Store
from tests.support import wait_for
from trainer.contract.artifact_store import location

pytestmark = pytest.mark.slow


@contextmanager
def web_server(folder: Path) -> Iterator[str]:
    """The files under `folder` over HTTP on a free 127.0.0.1 port: its base URL."""
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def plane_for(processes: Processes, tmp_path: Path, inputs_dir: Path) -> ControlPlane:
    """The control plane, its initializers inheriting this test's environment (a store's
    credentials and endpoint, where the test set them)."""
    plane = ControlPlane(processes, tmp_path / "data", inputs_dir)
    plane.start()
    return plane


def imported(plane: ControlPlane, body: dict[str, Any], expected: int = 202) -> dict[str, Any]:
    """The import's staging once it has ended."""
    started = plane.http.post("/api/v1/datasets/imports", json=body)
    assert started.status_code == expected, started.text
    location_ = started.headers["Location"]
    return wait_for(lambda: (row := plane.http.get(location_).json())["status"] != "running"
                    and row, timeout=120, what=f"the import of {body['source']}")


def test_a_file_imported_from_an_object_store_is_the_dataset_its_upload_would_be(
        object_store: Store, processes: Processes, tmp_path: Path, inputs_dir: Path) -> None:
    reviews = make_reviews_csv(tmp_path / "reviews.csv", rows=120)
    source = f"{object_store.new_location('imports')}/2026/reviews.csv"
    location(source).write_bytes(reviews.read_bytes())
    plane = plane_for(processes, tmp_path, inputs_dir)
    try:
        staging = imported(plane, {"source": source})
        assert staging["status"] == "succeeded", staging["error"]
        assert staging["kind"] == "file" and staging["source"] == source
        assert staging["bytes_done"] == reviews.stat().st_size
        dataset = plane.http.get(f"/api/v1/datasets/{staging['dataset_id']}").json()
        assert dataset["name"] == "reviews.csv" and dataset["rows"] == 120
        assert dataset["labels"] == ["negative", "positive"]
        # The same file again: imported already; uploaded: the same dataset.
        again = imported(plane, {"source": source}, expected=200)
        assert again["dataset_id"] == dataset["id"] and again["attempts"] == 1
        uploaded = plane.http.post("/api/v1/datasets", params={"name": "reviews.csv"},
                                   content=reviews.read_bytes())
        assert uploaded.status_code == 200 and uploaded.json()["id"] == dataset["id"]
        # No secret of the store's in what the API shows.
        shown = plane.http.get("/api/v1/stagings").text
        assert object_store.secret not in shown
    finally:
        plane.close()


def test_a_file_from_the_web_is_imported_and_one_that_cannot_train_says_why(
        processes: Processes, tmp_path: Path, inputs_dir: Path) -> None:
    served = tmp_path / "served"
    make_reviews_csv(served / "moods.csv", rows=60)
    (served / "one-class.csv").write_text(
        "text,label\n" + "".join(f"review {i},positive\n" for i in range(30)))
    plane = plane_for(processes, tmp_path, inputs_dir)
    try:
        with web_server(served) as url:
            good = imported(plane, {"source": f"{url}/moods.csv", "name": "moods"})
            assert good["status"] == "succeeded", good["error"]
            dataset = plane.http.get(f"/api/v1/datasets/{good['dataset_id']}").json()
            assert (dataset["name"], dataset["rows"]) == ("moods", 60)
            bad = imported(plane, {"source": f"{url}/one-class.csv"})
            assert bad["status"] == "failed" and "1 class" in bad["error"]
            missing = imported(plane, {"source": f"{url}/absent.csv"})
            assert missing["status"] == "failed" and "404" in missing["error"]
        assert plane.http.get("/api/v1/datasets").json()["count"] == 1
        leftovers = list((inputs_dir / "hub" / ".partial").glob("*.download*"))
        assert leftovers == []
    finally:
        plane.close()


@pytest.mark.parametrize("source", ["ftp://host/reviews.csv", "file:///etc/passwd",
                                    "/etc/passwd", "s3://bucket-only", "https://"])
def test_a_source_that_is_not_a_url_of_a_known_kind_is_a_422(
        client: TestClient, backend: FakeBackend, source: str) -> None:
    refused = client.post("/api/v1/datasets/imports", json={"source": source}, headers=AUTH)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["body", "source"]
    assert backend.stagings == []
