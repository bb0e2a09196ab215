"""The dashboard's login: a single-use, short-lived code in the URL, never the admin token."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from api.services.login import MAX_CODES, LoginCodes
from tests.api.conftest import ADMIN_TOKEN, AUTH


def code_of(link: dict) -> str:
    assert link["url"].startswith("/#login=")  # a fragment: no browser sends it to a server
    return str(link["url"].removeprefix("/#login="))


def test_a_login_code_buys_the_token_once(client: TestClient) -> None:
    assert client.post("/api/v1/login-codes").status_code == 401
    link = client.post("/api/v1/login-codes", headers=AUTH).json()
    assert ADMIN_TOKEN not in link["url"]
    assert 590 <= link["expires_at"] - time.time() <= 601
    code = code_of(link)
    answer = client.post("/api/v1/login", json={"code": code})
    assert answer.status_code == 200 and answer.json() == {"token": ADMIN_TOKEN}

    again = client.post("/api/v1/login", json={"code": code})
    assert again.status_code == 403 and "used or expired" in again.json()["detail"]
    assert client.post("/api/v1/login", json={"code": "not-a-code"}).status_code == 403
    assert client.post("/api/v1/login", json={"code": ADMIN_TOKEN}).status_code == 403


def test_a_malformed_exchange_names_the_field(client: TestClient) -> None:
    for body, field in (({}, "code"), ({"code": ""}, "code"), ({"code": "x" * 65}, "code"),
                        ({"code": "x", "token": "y"}, "token")):
        answer = client.post("/api/v1/login", json=body)
        assert answer.status_code == 422, body
        assert answer.json()["detail"][0]["loc"][-1] == field


def test_codes_expire_and_are_bounded() -> None:
    now = [1000.0]
    codes = LoginCodes(clock=lambda: now[0])
    late, expires = codes.issue(seconds=60)
    assert expires == 1060
    now[0] = 1060.5
    assert not codes.redeem(late)
    kept = [codes.issue(seconds=60)[0] for _ in range(MAX_CODES + 1)]
    assert not codes.redeem(kept[0])  # the oldest made room for the newest
    assert codes.redeem(kept[1]) and codes.redeem(kept[-1])
