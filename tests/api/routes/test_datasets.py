"""Uploaded datasets through the API: the checks, the normal form on disk, list/show/delete."""

from __future__ import annotations

import concurrent.futures
import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from tests.api.conftest import AUTH, create_job
from tests.api.fakes import FakeBackend
from tests.api.live import serve
from tests.support import wait_for
from trainer.contract.datasets import DATA_FILE, DATASETS_DIR, INCOMING_DIR, META_FILE

URL = "/api/v1/datasets"


@pytest.fixture
def database_url() -> None:
    """SQLite alone: the dataset's row is an ordinary one (tests/api/test_db.py covers both)."""


def upload(client: TestClient, body: bytes | Iterator[bytes], name: str | None = "reviews.csv",
           **params: str) -> tuple[int, dict]:
    query = {**({"name": name} if name else {}), **params}
    response = client.post(URL, content=body, params=query, headers=AUTH)
    return response.status_code, response.json() if response.content else {}


def reviews_csv(rows: int = 12) -> bytes:
    lines = ["review,sentiment"] + [f"\"film {i}, {'good' if i % 2 else 'bad'}\","
                                    f"{'positive' if i % 2 else 'negative'}" for i in range(rows)]
    return ("\n".join(lines) + "\n").encode()


def leftovers(settings: Settings) -> list[Path]:
    incoming = settings.resolved_inputs_dir / DATASETS_DIR / INCOMING_DIR
    return list(incoming.iterdir()) if incoming.is_dir() else []


def test_an_uploaded_csv_is_checked_kept_in_normal_form_and_listed(
        client: TestClient, settings: Settings) -> None:
    body = reviews_csv() + b"\"film 1, good\",positive\n,positive\n\"blank label\",  \n"
    status, dataset = upload(client, body)
    assert status == 201, dataset
    assert (dataset["format"], dataset["text_column"], dataset["label_column"]) == (
        "csv", "review", "sentiment")
    assert (dataset["rows"], dataset["duplicates"], dataset["empty"]) == (12, 1, 2)
    assert dataset["labels"] == ["negative", "positive"]
    assert dataset["class_counts"] == [6, 6]
    assert dataset["preview"][0] == {"text": "film 0, bad", "label": "negative"}
    assert len(dataset["preview"]) == 5
    assert dataset["upload_bytes"] == len(body)

    directory = settings.resolved_inputs_dir / DATASETS_DIR / dataset["id"]
    table = pq.read_table(directory / DATA_FILE)
    assert table.column_names == ["text", "label"]
    assert table.column("label").to_pylist() == [i % 2 for i in range(12)]
    assert json.loads((directory / META_FILE).read_text())["labels"] == ["negative", "positive"]
    assert leftovers(settings) == []

    assert client.get(f"{URL}/{dataset['id']}", headers=AUTH).json() == dataset
    listed = client.get(URL, headers=AUTH).json()
    assert (listed["count"], [d["id"] for d in listed["data"]]) == (1, [dataset["id"]])
    # The same bytes read with the same columns: the same dataset, kept once.
    assert upload(client, body, name="again.csv") == (200, dataset)
    assert client.get(URL, headers=AUTH).json()["count"] == 1


def test_jsonl_and_parquet_with_any_number_of_classes(client: TestClient) -> None:
    lines = [json.dumps({"sentence": f"text {i}", "class": i % 3, "extra": [i]})
             for i in range(30)]
    status, dataset = upload(client, ("\n".join(lines) + "\n\n").encode(), name="three.jsonl")
    assert status == 201, dataset
    assert (dataset["format"], dataset["labels"], dataset["class_counts"]) == (
        "jsonl", ["0", "1", "2"], [10, 10, 10])

    frame = pa.table({"body": [f"note {i}" for i in range(40)],
                      "target": [["sports", "arts", "science", "world"][i % 4]
                                 for i in range(40)]})
    buffer = io.BytesIO()
    pq.write_table(frame, buffer)
    status, dataset = upload(client, buffer.getvalue(), name=None,
                             text_column="body", label_column="target")
    assert status == 201, dataset
    assert dataset["format"] == "parquet"  # from the file's first bytes
    assert dataset["labels"] == ["arts", "science", "sports", "world"]


@pytest.mark.parametrize(("body", "name", "message"), [
    (b"", "a.csv", "the file is empty"),
    (b"\x00\x01PK\x03\x04binary", "a.csv", "the file is binary"),
    (b"a,b\n1,2\n", "a.csv", "no text column"),
    (b"text,label\n" + b"".join(b"t%d,pos\n" % i for i in range(20)), "a.csv", "1 class"),
    (b"text,label\n" + b"".join(b"t%d,%d\n" % (i, i % 2) for i in range(5)), "a.csv",
     "at least 10"),
    ("text,label\n" + "".join(f"caf\xe9 {i},{i % 2}\n" for i in range(20)),
     "latin1.csv", "not UTF-8"),
    (b'{"text": "a", "label": 1}\n{"text": oops}\n', "a.jsonl", "line 2: not valid JSON"),
    (b"text,label\n" + b"".join(b"t%d,%d\n" % (i, i) for i in range(300)), "a.csv",
     "more than 256 distinct values"),
    (b"PAR1 not really parquet", "a.parquet", "not a readable PARQUET table"),
])
def test_a_file_that_cannot_train_a_classifier_is_a_422_saying_why(
        client: TestClient, settings: Settings, body: bytes | str, name: str,
        message: str) -> None:
    data = body.encode("latin-1") if isinstance(body, str) else body
    status, answer = upload(client, data, name=name)
    assert status == 422, answer
    assert message in answer["detail"]
    assert leftovers(settings) == []
    assert client.get(URL, headers=AUTH).json()["count"] == 0


def test_a_named_column_that_is_missing_is_named(client: TestClient) -> None:
    status, answer = upload(client, reviews_csv(), text_column="comment")
    assert status == 422
    assert "no text column 'comment' (columns: review, sentiment)" in answer["detail"]


def test_an_upload_past_the_cap_is_a_413_and_leaves_nothing(settings: Settings) -> None:
    capped = settings.model_copy(update={"max_upload_bytes": 64 * 1024})
    with TestClient(create_app(capped, FakeBackend())) as client:
        def chunks() -> Iterator[bytes]:  # no Content-Length: stopped while it streams
            yield reviews_csv()
            for _ in range(100):
                yield b"\"more text, more text\",positive\n" * 100

        status, _ = upload(client, chunks())
        assert status == 413
        assert leftovers(capped) == []
        assert upload(client, reviews_csv())[0] == 201


def test_a_form_is_refused_with_how_to_send_the_file(client: TestClient) -> None:
    response = client.post(URL, files={"file": ("reviews.csv", reviews_csv())}, headers=AUTH)
    assert response.status_code == 415
    assert "--data-binary" in response.json()["detail"]


def test_uploads_need_the_admin_token(client: TestClient) -> None:
    assert client.post(URL, content=reviews_csv(), params={"name": "a.csv"}).status_code == 401
    assert client.get(URL).status_code == 401


def test_a_job_trains_on_a_dataset_by_id_which_cannot_be_deleted_while_it_runs(
        client: TestClient, settings: Settings, backend: FakeBackend) -> None:
    _, dataset = upload(client, reviews_csv())
    job = create_job(client, model="tiny", dataset=dataset["id"])
    # Its splits are tokenized once, before its pods start (api.services.preparation).
    assert job["status"] == "preparing" and backend.launches == []
    tokens = backend.stagings[-1]
    assert tokens.kind == "tokens" and json.loads(tokens.spec or "")["dataset"] == dataset["id"]
    response = client.delete(f"{URL}/{dataset['id']}", headers=AUTH)
    assert response.status_code == 409
    assert job["id"] in response.json()["detail"]

    assert client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH).status_code == 202
    assert client.delete(f"{URL}/{dataset['id']}", headers=AUTH).status_code == 204
    assert not (settings.resolved_inputs_dir / DATASETS_DIR / dataset["id"]).exists()
    assert client.get(f"{URL}/{dataset['id']}", headers=AUTH).status_code == 404
    assert client.delete(f"{URL}/{dataset['id']}", headers=AUTH).status_code == 404
    response = client.post("/api/v1/jobs", json={"dataset": dataset["id"]}, headers=AUTH)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "dataset"]
    assert "upload one" in response.json()["detail"][0]["msg"]


def test_what_an_upload_cut_short_left_is_removed_when_the_api_starts(
        settings: Settings) -> None:
    incoming = settings.resolved_inputs_dir / DATASETS_DIR / INCOMING_DIR
    incoming.mkdir(parents=True)
    (incoming / "cut-short.upload").write_bytes(b"text,label\n")
    with TestClient(create_app(settings, FakeBackend())):
        assert leftovers(settings) == []


def test_an_upload_whose_client_hangs_up_midway_leaves_nothing(settings: Settings) -> None:
    """A real server and a real socket: the client declares 1 MB, sends 64 kB and goes."""
    with serve(create_app(settings, FakeBackend())) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as raw:
            raw.sendall(b"POST /api/v1/datasets?name=big.csv HTTP/1.1\r\nHost: x\r\n"
                        b"Authorization: " + AUTH["Authorization"].encode() + b"\r\n"
                        b"Content-Type: text/csv\r\nContent-Length: 1000000\r\n\r\n"
                        + reviews_csv() + b"x" * 65536)
            incoming = settings.resolved_inputs_dir / DATASETS_DIR / INCOMING_DIR
            wait_for(lambda: any(p.stat().st_size > 0 for p in leftovers(settings)),
                     what="the upload to be written", timeout=20)
            assert incoming.is_dir()
        wait_for(lambda: leftovers(settings) == [], what="the cut upload to be removed",
                 timeout=20)
        response = httpx.get(f"{url}{URL}", headers=AUTH)
        assert response.json()["count"] == 0


def test_concurrent_uploads_of_one_file_make_one_dataset_and_of_others_their_own(
        settings: Settings) -> None:
    """A real server: four uploads at once, two of them the same bytes."""
    bodies = [reviews_csv(12), reviews_csv(12), reviews_csv(14), reviews_csv(16)]
    with serve(create_app(settings, FakeBackend())) as url, \
            concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda body: httpx.post(
            f"{url}{URL}", params={"name": "r.csv"}, content=body, headers=AUTH,
            timeout=60), bodies))
        assert sorted(a.status_code for a in answers[:2]) == [200, 201]
        assert [a.status_code for a in answers[2:]] == [201, 201]
        ids = [a.json()["id"] for a in answers]
        assert ids[0] == ids[1] and len(set(ids)) == 3
        assert httpx.get(f"{url}{URL}", headers=AUTH).json()["count"] == 3
    kept = sorted(p.name for p in (settings.resolved_inputs_dir / DATASETS_DIR).iterdir()
                  if p.name != INCOMING_DIR)
    assert kept == sorted(set(ids))
    assert leftovers(settings) == []


def test_a_name_without_a_known_suffix_leaves_the_format_to_the_content_type(
        client: TestClient) -> None:
    body = "".join(f"text {i}\t{i % 2}\n" for i in range(12)).encode()
    response = client.post(URL, content=b"review\tlabel\n" + body, headers={
        **AUTH, "Content-Type": "text/tab-separated-values"}, params={"name": "export"})
    assert response.status_code == 201, response.text
    assert (response.json()["format"], response.json()["rows"]) == ("tsv", 12)


def test_a_utf16_csv_with_its_byte_order_mark_is_read(client: TestClient) -> None:
    """What spreadsheet programs save as "Unicode text"."""
    body = ("text,label\n" + "".join(f"café {i},{'oui' if i % 2 else 'non'}\n"
                                     for i in range(12))).encode("utf-16")
    status, dataset = upload(client, body, name="export.csv")
    assert status == 201, dataset
    assert (dataset["rows"], dataset["labels"]) == (12, ["non", "oui"])
    assert dataset["preview"][0]["text"] == "café 0"
