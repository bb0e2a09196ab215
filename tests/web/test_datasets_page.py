"""The datasets page in real Chromium: upload, what the checks found, the new-job form's choice,
a refused file, delete."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from tests.api.control_plane import ControlPlane
from tests.support import wait_for
from tests.web.test_dashboard import login

pytestmark = pytest.mark.browser


def three_classes(path: Path) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["review", "mood"])
        for index in range(30):
            writer.writerow([f"review number {index}", ["sad", "happy", "calm"][index % 3]])
        writer.writerow(["review number 0", "sad"])  # a duplicate
    return path


def test_a_dataset_uploaded_in_the_browser_is_shown_offered_and_deleted(
        control_plane: ControlPlane, page: Any, tmp_path: Path) -> None:
    login(page, control_plane, "#/datasets")
    chooser = page.locator("#dataset-file")
    chooser.wait_for(state="attached")
    page.fill("#label-column", "mood")  # not one of the names looked for
    with page.expect_response(lambda r: r.request.method == "POST"
                              and "/api/v1/datasets" in r.url) as answered:
        chooser.set_input_files(str(three_classes(tmp_path / "moods.csv")))
    assert answered.value.status == 201
    shown = page.locator("section.dataset")
    shown.wait_for()
    dataset_id = shown.get_attribute("data-dataset")
    assert control_plane.http.get(f"/api/v1/datasets/{dataset_id}").json()["rows"] == 30
    text = shown.inner_text()
    assert "30 rows" in text and "dropped 1 duplicate and 0 empty" in text
    assert "label column “mood”" in text
    assert page.locator(".balance li").all_inner_texts() == [
        "calm\n10 (33%)", "happy\n10 (33%)", "sad\n10 (33%)"]
    assert page.locator("table.preview tbody tr").count() == 5
    row = page.locator(f"table.datasets tr[data-dataset='{dataset_id}']")
    row.wait_for()
    assert "calm 10 · happy 10 · sad 10" in row.inner_text()

    # A file that cannot train a classifier: the 422's reason, and nothing listed.
    one_class = tmp_path / "one.csv"
    one_class.write_text("text,mood\n" + "".join(f"t{i},x\n" for i in range(20)))
    chooser.set_input_files(str(one_class))
    wait_for(lambda: "one.csv was not kept" in page.inner_text(".upload p.notice")
             and "1 class" in page.inner_text(".upload p.notice"), timeout=20,
             what="the refusal's reason")
    assert page.locator("table.datasets tbody tr").count() == 1

    # The new-job form offers it, and the dataset's link fills it in.
    shown.locator("a", has_text="new job with this dataset").click()
    field = page.locator("#field-dataset")
    wait_for(lambda: field.count() and field.input_value() == dataset_id, timeout=20,
             what="the form's dataset field to hold the dataset")
    page.locator("#field-dataset-choices").wait_for(state="attached")
    assert page.locator(f"#field-dataset-choices option[value='{dataset_id}']").count() == 1

    page.goto(f"{control_plane.url}/#/datasets")
    page.locator(f"table.datasets tr[data-dataset='{dataset_id}'] button").click()
    page.click("#confirm-ok")
    row.wait_for(state="detached")
    assert control_plane.http.get(f"/api/v1/datasets/{dataset_id}").status_code == 404


def test_stagings_are_shown_with_their_progress_until_they_end(control_plane: ControlPlane,
                                                              page: Any) -> None:
    from datetime import timedelta

    from sqlmodel import Session, create_engine

    from api.asset_models import Staging, StagingStatus
    from api.models import utc_now

    engine = create_engine(f"sqlite:///{control_plane.data_dir / 'migrator.db'}")
    running = Staging(id="st-00000000000000aa", kind="model", repo_id="acme/bert",
                      revision="main", status=StagingStatus.running, bytes_done=100_000_000,
                      bytes_total=400_000_000, started_at=utc_now() - timedelta(seconds=10))
    with Session(engine) as session:
        session.add(running)
        session.add(Staging(id="st-00000000000000bb", kind="dataset", repo_id="acme/reviews",
                            revision="main", status=StagingStatus.failed,
                            error="RepositoryNotFoundError: 404"))
        session.commit()
    try:
        login(page, control_plane, "#/datasets")
        row = page.locator("table.stagings tr[data-staging='st-00000000000000aa']")
        row.wait_for()
        assert row.locator("progress").get_attribute("value") == "100000000"
        assert "running" in row.inner_text() and "s left" in row.inner_text()
        failed = page.locator("table.stagings tr[data-staging='st-00000000000000bb']")
        assert "RepositoryNotFoundError: 404" in failed.inner_text()
        with Session(engine) as session:
            done = session.get(Staging, running.id)
            assert done is not None
            done.status, done.bytes_done, done.finished_at = (
                StagingStatus.succeeded, 400_000_000, utc_now())
            session.commit()
        wait_for(lambda: "succeeded" in row.inner_text(), timeout=20,
                 what="the page to show the staging done")
        assert row.locator("progress").count() == 0
        # Ended: it can be deleted (the control plane's own initializers are not involved).
        failed.locator("button", has_text="Delete").click()
        page.click("#confirm-ok")
        failed.wait_for(state="detached")
        # An import that the API refuses says why, next to the form.
        page.fill("#import-repo", "../etc")
        page.click("form.import button[type=submit]")
        wait_for(lambda: "repo_id" in page.inner_text("section.stagings p.notice"), timeout=20,
                 what="the refusal of a repository id that is not one")
    finally:
        with Session(engine) as session:
            for staging_id in ("st-00000000000000aa", "st-00000000000000bb"):
                if (left := session.get(Staging, staging_id)) is not None:
                    session.delete(left)
            session.commit()
        engine.dispose()
