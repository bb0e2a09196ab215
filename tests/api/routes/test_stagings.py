"""The stagings through the API: the list of one kind (the base models) and its count."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.conftest import AUTH
from tests.api.fakes import FakeBackend

URL = "/api/v1/stagings"


def test_the_list_of_one_kind_holds_that_kind_alone_and_counts_it(
        client: TestClient, backend: FakeBackend) -> None:
    for body in ({"kind": "model", "repo_id": "acme/bert"},
                 {"kind": "model", "repo_id": "acme/bert", "revision": "v1"},
                 {"kind": "dataset", "repo_id": "acme/reviews"}):
        assert client.post(URL, json=body, headers=AUTH).status_code == 202
    imported = client.post("/api/v1/datasets/imports", json={"source": "s3://r/reviews.csv"},
                           headers=AUTH)
    assert imported.status_code == 202, imported.text
    assert len(backend.stagings) == 4

    models = client.get(URL, params={"kind": "model"}, headers=AUTH).json()
    assert models["count"] == 2
    assert sorted((row["kind"], row["repo_id"], row["revision"]) for row in models["data"]) == [
        ("model", "acme/bert", "main"), ("model", "acme/bert", "v1")]
    # The count is of the kind, not of the page.
    page = client.get(URL, params={"kind": "model", "limit": 1}, headers=AUTH).json()
    assert (page["count"], len(page["data"])) == (2, 1)
    files = client.get(URL, params={"kind": "file"}, headers=AUTH).json()
    assert (files["count"], files["data"][0]["source"]) == (1, "s3://r/reviews.csv")
    assert client.get(URL, params={"kind": "tokens"}, headers=AUTH).json() == {
        "data": [], "count": 0}
    assert client.get(URL, headers=AUTH).json()["count"] == 4


def test_an_unknown_kind_is_a_422_naming_it(client: TestClient) -> None:
    response = client.get(URL, params={"kind": "weights"}, headers=AUTH)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "kind"]
