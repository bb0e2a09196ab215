"""The Base models page in real Chromium: the staged hub models alone (not the other kinds),
an import that fails with its reason, the new-job form's model choices, and a Delete that the
API refuses (409) while a job reads the model, then allows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.api.control_plane import ControlPlane
from tests.factories import tiny_spec
from tests.support import wait_for
from tests.web.test_dashboard import login
from trainer.contract.staged import STAGED_FILE, staged_dir

pytestmark = pytest.mark.browser

MODEL = "acme/tiny"
COMMIT = "0123456789abcdef" * 2 + "01234567"


def shown(size: float) -> str:
    """A size as the dashboard writes it (dom.js bytes)."""
    names, index = ["B", "KB", "MB", "GB", "TB"], 0
    while size >= 1024 and index < len(names) - 1:
        size, index = size / 1024, index + 1
    return f"{size:.{1 if index else 0}f} {names[index]}"


def stage_model(plane: ControlPlane, tiny_model_dir: Path) -> dict[str, Any]:
    """The tiny model as an initializer leaves a hub model staged, recorded by an import."""
    directory = staged_dir(plane.inputs_dir, "model", MODEL)
    shutil.copytree(tiny_model_dir, directory)
    files = sorted(path.name for path in directory.iterdir())
    (directory / STAGED_FILE).write_text(json.dumps({
        "commit": COMMIT, "files": files,
        "bytes": sum(path.stat().st_size for path in directory.iterdir())}))
    answer = plane.http.post("/api/v1/stagings", json={"kind": "model", "repo_id": MODEL})
    assert answer.status_code == 200, answer.text  # staged already
    staging: dict[str, Any] = answer.json()
    assert (staging["status"], staging["files"]) == ("succeeded", len(files))
    return staging


def test_the_base_models_page_lists_imports_offers_and_deletes_staged_models(
        control_plane: ControlPlane, page: Any, tiny_model_dir: Path) -> None:
    staged = stage_model(control_plane, tiny_model_dir)
    # A hub dataset (offline here: it fails at once) is a staging of another kind.
    dataset = control_plane.http.post("/api/v1/stagings", json={
        "kind": "dataset", "repo_id": "acme/reviews"}).json()

    login(page, control_plane, "#/datasets")
    page.click("nav a:has-text('Base models')")
    page.wait_for_url("**/#/models/base")
    row = page.locator(f"table.stagings tr[data-staging='{staged['id']}']")
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[:6] == [MODEL, "main", COMMIT[:12], "succeeded", shown(staged["bytes_total"]),
                         str(staged["files"])]
    assert row.locator("td").nth(2).locator("span").get_attribute("title") == COMMIT
    assert page.locator("table.stagings th").all_inner_texts()[:2] == ["Repository", "Revision"]
    assert page.locator(f"tr[data-staging='{dataset['id']}']").count() == 0

    # An import from the page is of a model; offline, it fails with the hub client's reason.
    page.fill("#import-repo", "acme/absent")
    with page.expect_response(lambda r: r.request.method == "POST"
                              and r.url.endswith("/api/v1/stagings")) as answered:
        page.click("form.import button[type=submit]")
    assert answered.value.request.post_data_json == {
        "kind": "model", "repo_id": "acme/absent", "revision": "main"}
    absent = answered.value.json()
    failed = page.locator(f"table.stagings tr[data-staging='{absent['id']}']")
    wait_for(lambda: failed.count() and "failed" in failed.inner_text(), timeout=60,
             what="the offline import shown failed")
    error = control_plane.http.get(f"/api/v1/stagings/{absent['id']}").json()["error"]
    assert error and error[:40] in failed.inner_text()

    # The form offers the offline model and the staged one, not the one that failed; a staged
    # model's link fills it in.
    row.locator("a", has_text="New job").click()
    field = page.locator("#field-model")
    wait_for(lambda: field.count() and field.input_value() == MODEL, timeout=20,
             what="the form's model field to hold the staged model")
    page.locator("#field-model-choices").wait_for(state="attached")
    choices = page.locator("#field-model-choices option")
    assert [choices.nth(i).get_attribute("value") for i in range(choices.count())] == [
        "minilm", MODEL]
    assert page.locator("#field-model_revision").input_value() == "main"

    # Refused while a job reads it: the 409's reason beside the table, the row kept.
    job = control_plane.http.post("/api/v1/jobs", json=tiny_spec(
        model=MODEL, epochs=50, name="reads the staged model"))
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    try:
        page.goto(f"{control_plane.url}/#/models/base")
        row.locator("button", has_text="Delete").click()
        page.click("#confirm-ok")
        status = page.locator("section.stagings p.notice")
        wait_for(lambda: job_id in status.inner_text(), timeout=20, what="the 409's reason")
        assert "in use by" in status.inner_text()
        assert status.get_attribute("data-kind") == "error" and row.count() == 1
    finally:
        assert control_plane.http.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
    control_plane.wait_status(job_id, "cancelled", timeout=60)
    row.locator("button", has_text="Delete").click()
    page.click("#confirm-ok")
    row.wait_for(state="detached")
    assert control_plane.http.get(f"/api/v1/stagings/{staged['id']}").status_code == 404
    assert not staged_dir(control_plane.inputs_dir, "model", MODEL).exists()
    assert page.console.unexpected(409) == []
