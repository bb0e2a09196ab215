from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.errors import add_exception_handlers
from api.routes.web import UPLOT_DIST, WEB_DIR, mount_web


def test_the_page_needs_no_token_and_runs_only_its_own_scripts(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/static/app.js">' in page.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "unsafe-eval" not in policy
    assert page.headers["referrer-policy"] == "no-referrer"  # the login URL holds the token
    script = client.get("/static/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert script.headers["cache-control"] == "no-cache"  # revalidated: no stale module mix
    again = client.get("/static/app.js", headers={"If-None-Match": script.headers["etag"]})
    assert again.status_code == 304
    assert client.get("/static/style.css").headers["content-type"].startswith("text/css")


@pytest.mark.parametrize("path", [
    "/static/../api/app.py", "/static/%2e%2e/%2e%2e/api/app.py", "/static/..%2f..%2fapi%2fapp.py",
    "/static/%2e%2e/package.json", "/vendor/uplot/..%2f..%2f..%2fpackage.json",
    "/static//etc/passwd", "/static/%2fetc%2fpasswd",
])
def test_no_path_leaves_the_served_directories(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404, response.text
    assert "live-migrator" not in response.text and "root:" not in response.text


def test_the_api_keeps_its_json_errors_next_to_the_page(client: TestClient) -> None:
    assert client.get("/api/v1/nothing-here").json()["error"] == "not_found"
    assert client.get("/no-such-page").json()["error"] == "not_found"
    assert "/" not in client.get("/openapi.json").json()["paths"]


def _app(web_dir: Path) -> TestClient:
    app = FastAPI()
    add_exception_handlers(app)
    mount_web(app, web_dir)
    return TestClient(app)


def test_uplot_is_served_from_node_modules_and_missing_it_says_how_to_install(
        tmp_path: Path) -> None:
    web = tmp_path / "web"
    (web / "static").mkdir(parents=True)
    (web / "index.html").write_text("<!doctype html><title>t</title>")
    missing = _app(web).get("/vendor/uplot/uPlot.esm.js")
    assert missing.status_code == 404 and "make setup" in missing.json()["detail"]

    (web / UPLOT_DIST).mkdir(parents=True)
    (web / UPLOT_DIST / "uPlot.esm.js").write_text("export default 1;")
    served = _app(web).get("/vendor/uplot/uPlot.esm.js")
    assert served.status_code == 200 and served.text == "export default 1;"


def test_without_web_files_the_api_still_starts(tmp_path: Path) -> None:
    client = _app(tmp_path / "absent")
    assert client.get("/").status_code == 404
    assert client.get("/static/app.js").status_code == 404


@pytest.mark.skipif(not (WEB_DIR / UPLOT_DIST / "uPlot.esm.js").is_file(),
                    reason="uPlot is not installed (make setup runs npm ci in web/)")
def test_the_pinned_uplot_is_served(client: TestClient) -> None:
    module = client.get("/vendor/uplot/uPlot.esm.js")
    assert module.status_code == 200 and "export { uPlot as default }" in module.text
    assert client.get("/vendor/uplot/uPlot.min.css").status_code == 200
