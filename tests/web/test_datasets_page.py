"""The datasets page in real Chromium: upload, what the checks found, the new-job form's choice,
a refused file, delete; imports shown with their progress."""

from __future__ import annotations

import csv
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


class HeldBack(BaseHTTPRequestHandler):
    """A CSV of reviews sent half at once, the rest once `release` is set; 404 elsewhere."""

    body = b""
    release = threading.Event()

    def do_GET(self) -> None:
        if self.path != "/reviews.csv":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        half = len(self.body) // 2
        self.wfile.write(self.body[:half])
        self.wfile.flush()
        self.release.wait(60)
        self.wfile.write(self.body[half:])

    def log_message(self, *args: Any) -> None:
        pass


def test_an_import_is_shown_with_its_progress_until_it_ends(
        control_plane: ControlPlane, page: Any, tmp_path: Path) -> None:
    """A real import (an initializer fetching from a web server the test holds back), shown
    running with a progress bar and an ETA, then done; a failed one with its reason, deleted."""
    HeldBack.body = three_classes(tmp_path / "held.csv").read_bytes()
    HeldBack.release.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), HeldBack)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        running = control_plane.http.post("/api/v1/datasets/imports",
                                          json={"source": f"{url}/reviews.csv",
                                                "label_column": "mood"}).json()
        failed = control_plane.http.post("/api/v1/datasets/imports",
                                         json={"source": f"{url}/absent.csv"}).json()
        login(page, control_plane, "#/datasets")
        row = page.locator(f"table.stagings tr[data-staging='{running['id']}']")
        wait_for(lambda: row.count() and row.locator("progress").count()
                 and "s left" in row.inner_text(), timeout=60,
                 what="the import shown running, with its progress and ETA")
        assert f"{url}/reviews.csv" in row.inner_text()
        assert int(row.locator("progress").get_attribute("max") or 0) == len(HeldBack.body)
        refused = page.locator(f"table.stagings tr[data-staging='{failed['id']}']")
        wait_for(lambda: "404" in refused.inner_text(), timeout=60,
                 what="the failed import's reason")
        HeldBack.release.set()
        wait_for(lambda: "succeeded" in row.inner_text(), timeout=60,
                 what="the page to show the import done")
        assert row.locator("progress").count() == 0
        # Ended: it can be deleted.
        refused.locator("button", has_text="Delete").click()
        page.click("#confirm-ok")
        refused.wait_for(state="detached")
        # An import that the API refuses says why, next to the form.
        page.fill("#import-repo", "../etc")
        page.click("form.import button[type=submit]")
        wait_for(lambda: "repo_id" in page.inner_text("section.stagings p.notice"), timeout=20,
                 what="the refusal of a repository id that is not one")
    finally:
        HeldBack.release.set()
        server.shutdown()
        server.server_close()
        thread.join()
