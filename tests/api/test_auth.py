"""api/auth.py on its own: bearer parsing, signed links, report tokens, and authentication
that happens before a request's body is read."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from starlette.requests import Request

from api.auth import LinkSigner, ReportTokens, bearer, hash_token
from tests.api.conftest import AUTH, create_job
from tests.api.fakes import FakeBackend


def request_with(authorization: str | None) -> Request:
    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers})


@pytest.mark.parametrize(("header", "token"), [
    ("Bearer abc", "abc"),
    ("bearer abc", "abc"),  # the scheme is case-insensitive (RFC 7235)
    ("BEARER  abc ", "abc"),
    ("Bearer ", None),
    ("Basic YWxhZGRpbjpvcGVu", None),
    ("abc", None),
    (None, None),
])
def test_bearer_takes_a_bearer_token_alone(header: str | None, token: str | None) -> None:
    assert bearer(request_with(header)) == token


def test_a_signed_link_is_good_for_its_path_until_its_expiry_only() -> None:
    signer = LinkSigner(b"k" * 32)
    asked_at = time.time()
    url, expires = signer.sign("/api/v1/models/m1/download", seconds=60)
    path, _, query = url.partition("?")
    params = dict(pair.split("=") for pair in query.split("&"))
    assert path == "/api/v1/models/m1/download" and params["expires"] == str(expires)
    assert expires >= asked_at + 60  # never earlier than asked (a whole second)
    assert signer.verify(path, params["expires"], params["signature"])

    assert not signer.verify("/api/v1/models/m2/download", params["expires"], params["signature"])
    assert not signer.verify(path, str(expires + 1), params["signature"])  # a longer life
    altered = params["signature"][:-1] + ("1" if params["signature"].endswith("0") else "0")
    assert not signer.verify(path, params["expires"], altered)
    assert not LinkSigner(b"x" * 32).verify(path, params["expires"], params["signature"])
    for expiry, signature in [(None, params["signature"]), ("", params["signature"]),
                              ("-5", params["signature"]), ("1e9", params["signature"]),
                              (params["expires"], None), (params["expires"], "")]:
        assert not signer.verify(path, expiry, signature)

    stale, _ = signer.sign(path, seconds=-2)
    stale_params = dict(pair.split("=") for pair in stale.partition("?")[2].split("&"))
    assert not signer.verify(path, stale_params["expires"], stale_params["signature"])


def test_report_tokens_answer_for_their_own_job_alone(client: TestClient,
                                                      backend: FakeBackend) -> None:
    first, second = create_job(client), create_job(client)
    tokens: ReportTokens = client.app.state.report_tokens
    token = {launch.job_id: launch.report_token for launch in backend.launches}

    def verify(job_id: str, candidate: str) -> bool:
        return client.portal.call(tokens.verify, job_id, candidate)

    assert verify(first["id"], token[first["id"]])
    assert not verify(first["id"], token[second["id"]])
    assert not verify(first["id"], "nope")
    assert not verify("job-unknown", token[first["id"]])
    # Only the hash is kept: the cache holds no token.
    assert tokens._hashes[first["id"]] == hash_token(token[first["id"]])
    assert token[first["id"]] not in tokens._hashes.values()
    tokens.forget(first["id"])
    assert first["id"] not in tokens._hashes
    assert verify(first["id"], token[first["id"]])  # read again from the database


def test_a_stranger_is_refused_before_the_body_is_read(client: TestClient,
                                                      backend: FakeBackend) -> None:
    # A body that would be a 422 if it were parsed: authentication answers first.
    garbage = {"content": b"{not json", "headers": {"Content-Type": "application/json"}}
    assert client.post("/api/v1/jobs", **garbage).status_code == 401
    wrong = {"Authorization": "Bearer nope", "Content-Type": "application/json"}
    assert client.post("/api/v1/jobs", content=b"{not json", headers=wrong).status_code == 403
    assert client.post("/api/v1/jobs", content=b"{not json",
                       headers={**AUTH, "Content-Type": "application/json"}).status_code == 422

    job = create_job(client)
    reports = f"/api/v1/jobs/{job['id']}/reports"
    assert client.post(reports, **garbage).status_code == 401
    refused = client.post(reports, content=b"{not json", headers=wrong)
    assert refused.status_code == 403 and job["id"] in refused.json()["detail"]
    # The admin token is no report token, and an unknown job answers as a wrong token does.
    assert client.post(reports, content=b"{not json",
                       headers={**AUTH, "Content-Type": "application/json"}).status_code == 403
    unknown = client.post("/api/v1/jobs/job-unknown0/reports", content=b"{not json",
                          headers={"Authorization": f"Bearer {backend.launches[0].report_token}",
                                   "Content-Type": "application/json"})
    assert unknown.status_code == 403
