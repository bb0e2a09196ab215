"""The dashboard in real headless Chromium against the real control plane and real pods."""

from __future__ import annotations

import io
import itertools
import json
import re
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from api.backends.local.backend import LocalBackend
from tests.api.conftest import ADMIN_TOKEN
from tests.api.control_plane import ControlPlane
from tests.conftest import Processes
from tests.factories import evaluation, metric_data, record, tiny_spec
from tests.support import wait_for
from tests.web.conftest import save_artifact
from trainer.contract.records import Joined, Left, RecordData

pytestmark = [pytest.mark.browser, pytest.mark.slow]

XSS = "<img src=x onerror=alert(1)>"
# Two samples per pod and step: steps cost about what they cost with eight (the tiny model's step
# is mostly synchronisation), so the job lasts long enough for a killed pod to come back (its new
# process needs seconds to import torch) and rejoin before training ends.
SPEC = tiny_spec(replicas=2, epochs=3, batch_size=2, checkpoint_every_steps=200,
                 max_train_samples=1600, max_eval_samples=200)
# The form's job needs less: the job's warm standby takes the killed pod's place (in a suite run,
# pod 1 took part again from step 94, 2 s after its kill at step 23); 600 steps, not 1,200.
FORM_SPEC = {**SPEC, "max_train_samples": 800}


def login_url(plane: ControlPlane) -> str:
    """A single-use login URL, as `migrator login-url` prints it."""
    answer = plane.http.post("/api/v1/login-codes")
    assert answer.status_code == 200, answer.text
    return plane.url + answer.json()["url"]


def login(page: Any, plane: ControlPlane, hash_: str = "#/") -> None:
    page.goto(login_url(plane))
    page.wait_for_selector("#logout:not([hidden])")
    if hash_ != "#/":
        page.goto(f"{plane.url}/{hash_}")


def js(page: Any, expression: str) -> Any:
    """Evaluate in the page (CDP, outside the page's CSP, which forbids string evaluation)."""
    return page.evaluate(f"() => {expression}")


def chart_points(page: Any, chart: str) -> int:
    return int(js(page, f"document.querySelector('[data-chart={chart}]')?.dataset.points ?? 0"))


def pod_state(page: Any, ordinal: int) -> dict[str, str]:
    row = page.locator(f"tr[data-ordinal='{ordinal}']")
    return {"phase": row.get_attribute("data-phase") or "",
            "rejoined": row.get_attribute("data-rejoined") or "",
            "restarts": row.locator("td").nth(3).inner_text()}


def drawn_markers(page: Any, chart: str) -> list[str]:
    """The kinds of the markers the chart drew last (those inside its x range)."""
    return str(js(page, f"document.querySelector('[data-chart={chart}]')?.dataset.markers ?? ''"
                  )).split()


def marker_labels(page: Any) -> list[str]:
    return list(page.evaluate(
        "async () => (await import('/static/state.js')).state.job.markers.map(m => m.label)"))


Report = Callable[..., None]


def reporter(plane: ControlPlane, job_id: str) -> Report:
    """`report(ordinal, *data, incarnation=...)` posts records as that pod would, timed now."""
    token, seqs = plane.report_token(job_id), itertools.count(1)

    def report(ordinal: int, *data: RecordData, incarnation: str = "web-test") -> None:
        response = plane.http.post(
            f"/api/v1/jobs/{job_id}/reports", headers={"Authorization": f"Bearer {token}"},
            json={"pod": f"{job_id}-{ordinal}", "incarnation": incarnation,
                  "records": [record(next(seqs), item, time.time()) for item in data]})
        assert response.status_code == 200, response.text

    return report


def joined(pod: str, step: int) -> Joined:
    return Joined(message=f"{pod} takes part", pod=pod, step=step, epoch=1, participants=2,
                  heal_bytes=2_000_000, heal_seconds=0.4)


def notice_says(page: Any, text: str) -> bool:
    return text in page.inner_text("p.notice")


def downloaded(page: Any, selector: str) -> bytes:
    """Click a download link; the browser fetches a signed URL that holds no token."""
    with page.expect_download(timeout=60_000) as started:
        page.click(selector)
    download = started.value
    assert download.url.split("?")[1].startswith("expires=") and ADMIN_TOKEN not in download.url
    return Path(download.path()).read_bytes()


def test_login_with_a_single_use_code_never_the_token_in_a_url(control_plane: ControlPlane,
                                                                browser: Any, page: Any) -> None:
    prompt = page.locator("#login-message")
    page.goto(f"{control_plane.url}/#login=not-a-code-at-all")
    wait_for(lambda: "refused" in prompt.inner_text(), timeout=10, what="the refusal")
    assert "login=" not in page.url
    assert js(page, "sessionStorage.getItem('migrator.token')") is None

    page.goto(f"{control_plane.url}/")  # no code at all: the prompt says where to find one
    assert "migrator login-url" in prompt.inner_text()

    url = login_url(control_plane)
    page.goto(url)
    page.wait_for_selector("table.jobs")
    assert page.url == f"{control_plane.url}/#/"  # the code left the address bar ...
    assert js(page, "sessionStorage.getItem('migrator.token')") == ADMIN_TOKEN  # ... for here
    page.reload()
    page.wait_for_selector("table.jobs")  # still logged in, from session storage

    # A code works once; the old login URL with the token in it logs nobody in.
    for reused in (url, f"{control_plane.url}/?token={ADMIN_TOKEN}"):
        other = browser.new_context()  # a tab of its own (not checked for the token in URLs)
        tab = other.new_page()
        tab.goto(reused)
        tab.wait_for_selector("#login-message")
        assert tab.locator("#logout").is_hidden()
        assert tab.evaluate("() => sessionStorage.getItem('migrator.token')") is None
        other.close()

    page.click("#logout")
    page.fill("#token", ADMIN_TOKEN)  # the prompt itself logs in too
    page.keyboard.press("Enter")
    page.wait_for_selector("table.jobs")
    assert page.console.unexpected(403) == []


def test_a_job_from_the_form_to_a_model(control_plane: ControlPlane, page: Any,
                                        artifacts_dir: Path) -> None:
    login(page, control_plane, "#/new")
    page.wait_for_selector("#field-replicas")
    assert page.input_value("#field-replicas") == "2"  # defaults come from the API's schema
    assert page.input_value("#field-fault_tolerance") == "live"
    for name, value in {**FORM_SPEC, "replicas": 0}.items():
        page.fill(f"#field-{name}", str(value))
    page.click("button[type=submit]")
    error = page.locator("#field-replicas-error")
    error.wait_for()
    assert "greater than or equal to 1" in error.inner_text()  # the server's 422, by its field
    assert page.get_attribute("#field-replicas", "aria-invalid") == "true"

    page.fill("#field-replicas", "2")
    page.fill("#field-name", "form job")
    page.click("button[type=submit]")
    page.wait_for_url("**/#/jobs/job-*")
    job_id = page.url.rsplit("/", 1)[1]
    assert control_plane.job(job_id)["spec"]["epochs"] == FORM_SPEC["epochs"]

    # Pods come up and points arrive live.
    wait_for(lambda: pod_state(page, 0)["phase"] == pod_state(page, 1)["phase"] == "Running",
             timeout=90, what="both pods Running")
    first = wait_for(lambda: chart_points(page, "loss"), timeout=90, what="loss points")
    wait_for(lambda: chart_points(page, "loss") > first, timeout=30, what="more loss points, live")
    assert chart_points(page, "speed") > 0 and chart_points(page, "participants") > 0
    # The global batch as submitted (2 pods x 2), in its shards.
    batch = page.locator("dl.stats div:has(dt:text-is('Global batch')) dd")
    assert batch.inner_text() == "4 (2 shards)"

    # Kill pod 1 from the keyboard: it goes down, comes back and rejoins.
    page.focus("tr[data-ordinal='1'] button")
    page.keyboard.press("Enter")
    page.wait_for_selector("#confirm[open]")
    page.click("#confirm-ok")
    wait_for(lambda: pod_state(page, 1)["phase"] == "Killed", timeout=10, what="pod 1 shown killed")
    assert page.locator(".timeline li[data-tag=kill]").count() == 1
    wait_for(lambda: pod_state(page, 1) == {"phase": "Running", "rejoined": "true",
                                            "restarts": "1"},
             timeout=90, what="pod 1 back and rejoined")
    healed = page.locator(f".timeline li[data-tag=healed]:has-text('{job_id}-1')")
    assert "after the kill" in healed.first.inner_text()
    save_artifact(page, artifacts_dir, "dashboard-job-live.png")

    # Finished after the epoch under way, from its button: the job ends early as a whole run
    # ends, with test metrics, the model archive, a prediction.
    page.click(".title-row button.finish")
    page.wait_for_selector("#confirm[open]")
    with page.expect_request(lambda r: r.method == "POST"
                             and r.url.endswith(f"/api/v1/jobs/{job_id}/finish")):
        page.click("#confirm-ok")
    page.locator(".title-row button.finish").wait_for(state="hidden", timeout=10_000)
    assert "Finishing: asked to finish after epoch" in page.inner_text(".notice")
    page.locator("#model-download").wait_for(timeout=180_000)
    assert control_plane.job(job_id)["status"] == "succeeded"
    assert page.locator("#test-accuracy").inner_text().endswith("%")
    archive = downloaded(page, "#model-download")
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        assert any(name.endswith("/config.json") for name in tar.getnames())
    page.fill("#try-text", "a brilliant warm and clever film")
    page.get_by_role("button", name="Classify").click()
    page.locator("#try-output[data-label]").wait_for(timeout=60_000)
    assert page.get_attribute("#try-output", "data-label") in ("positive", "negative")
    assert "score" in page.inner_text("#try-output")
    assert downloaded(page, ".checkpoints a[download] >> nth=0")[:2] == b"\x1f\x8b"
    save_artifact(page, artifacts_dir, "dashboard-job.png")
    assert page.console.unexpected(422) == []

    # A tab opened late reads the whole history: the steps' series, the kill and the rejoin.
    late = page.context.new_page()  # session storage is per tab: it logs in with the URL
    login(late, control_plane, f"#/jobs/{job_id}")
    steps = control_plane.job(job_id)["progress"]["step"]
    # Every step, or the series' bounded cut of them (web/static/history.js asks for 2,000).
    series = control_plane.http.get(f"/api/v1/jobs/{job_id}/series",
                                    params={"points": 2000}).json()
    assert series["steps"] == steps
    wait_for(lambda: chart_points(late, "loss") == len(series["points"]),
             timeout=20, what="the full history in a late tab")
    assert late.locator(".timeline li[data-tag=kill]").count() == 1
    assert late.locator(".timeline li[data-tag=healed]").count() >= 1
    epochs = control_plane.job(job_id)["progress"]["epochs"]  # the one it finished after
    assert chart_points(late, "accuracy") == epochs <= FORM_SPEC["epochs"]
    assert late.locator(".timeline li[data-tag=finish_requested]").count() == 1
    assert page.console.unexpected(422) == []


def test_the_new_job_form_offers_only_what_the_trainer_runs(control_plane: ControlPlane,
                                                           page: Any) -> None:
    login(page, control_plane, "#/new")
    page.wait_for_selector("#field-parallelism")

    def options(name: str) -> list[str]:
        return list(page.eval_on_selector_all(f"#field-{name} option",
                                              "options => options.map(o => o.value)"))

    assert options("parallelism") == ["data", "pipeline"]
    assert options("schedule") == ["1f1b", "gpipe"]
    assert options("finetune") == ["full", "lora"]
    assert options("quantization") == ["none", "8bit"]

    # Nested objects of the spec get a group of fields each, with their defaults.
    def nested(name: str) -> Any:
        return page.locator(f'[id="field-{name}"]')

    assert nested("lora.r").input_value() == "8"
    assert nested("lora.target_modules").input_value() == "query, value"
    assert nested("resources.gpus").input_value() == "0"
    # Only the nested values changed are sent; the server's 422 shows by the nested field.
    page.select_option("#field-finetune", "lora")
    nested("lora.r").fill("0")
    nested("lora.target_modules").fill("query, key, value")
    with page.expect_request(lambda r: r.method == "POST"
                             and r.url.endswith("/api/v1/jobs")) as sent:
        page.click("button[type=submit]")
    body = json.loads(sent.value.post_data or "{}")
    assert body["finetune"] == "lora" and "resources" not in body
    assert body["lora"] == {"r": 0, "target_modules": ["query", "key", "value"]}
    error = nested("lora.r-error")
    error.wait_for()
    assert "greater than or equal to 1" in error.inner_text()
    assert nested("lora.r").get_attribute("aria-invalid") == "true"
    assert page.console.unexpected(422) == []


def test_the_cancel_button_cancels_the_job(control_plane: ControlPlane, page: Any) -> None:
    created = control_plane.http.post("/api/v1/jobs", json={**SPEC, "replicas": 1})
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    try:
        login(page, control_plane, f"#/jobs/{job_id}")
        page.click(".title-row button.danger")
        page.wait_for_selector("#confirm[open]")
        with page.expect_request(lambda r: r.method == "POST"
                                 and r.url.endswith(f"/api/v1/jobs/{job_id}/cancel")):
            page.click("#confirm-ok")
        page.wait_for_selector(".timeline li[data-tag=cancelled]")
        assert control_plane.job(job_id)["status"] == "cancelled"
        assert page.locator(".title-row button.danger").is_hidden()
        assert page.console.unexpected() == []
    finally:  # its pod would slow the other tests down
        LocalBackend(control_plane.data_dir / "jobs").delete(job_id)


def test_a_pipeline_job_shows_each_pods_replica_and_stage(control_plane: ControlPlane,
                                                          page: Any) -> None:
    created = control_plane.http.post("/api/v1/jobs", json={
        **SPEC, "replicas": 2, "parallelism": "pipeline", "fault_tolerance": "restart",
        "microbatches": 2})
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    try:
        login(page, control_plane, f"#/jobs/{job_id}")
        page.wait_for_selector("table.pods tr[data-ordinal='3']")
        names = page.eval_on_selector_all("table.pods tbody tr td.mono",
                                          "cells => cells.map(c => c.textContent)")
        assert names == [f"{job_id}-{o} · replica {o // 2}, stage {o % 2}" for o in range(4)]
        assert "2 x 2 pods" in page.inner_text(".summary")
        assert page.locator("form.replicas").is_hidden()  # a pipeline cannot be scaled yet
        control_plane.wait_status(job_id, "running", timeout=120)
        page.wait_for_selector(".badge[data-status=running]")
        page.wait_for_selector("table.pods tr[data-ordinal='0'][data-phase='Running']")
        migrate = page.locator("table.pods tr[data-ordinal='0'] button", has_text="Migrate")
        assert migrate.is_disabled()  # nor its pods migrated
        assert page.console.unexpected() == []
    finally:  # its pods would slow the other tests down
        LocalBackend(control_plane.data_dir / "jobs").delete(job_id)


def test_user_text_renders_as_text_and_the_layout_fits_a_phone(control_plane: ControlPlane,
                                                              page: Any) -> None:
    login(page, control_plane)
    page.wait_for_selector("table.jobs")
    created = control_plane.http.post("/api/v1/jobs", json={**SPEC, "name": XSS, "replicas": 1})
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    assert control_plane.http.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
    link = page.locator(f"tr[data-job='{job_id}'] a")  # the list updates by itself
    link.wait_for(timeout=10_000)
    page.locator(f"tr[data-job='{job_id}'] .badge[data-status=cancelled]").wait_for()
    assert link.inner_text() == XSS
    assert page.locator("main img").count() == 0

    page.click(f"tr[data-job='{job_id}'] a")
    page.wait_for_selector(".timeline li[data-tag=cancelled]")
    assert page.inner_text("h1") == XSS
    assert page.locator("main img").count() == 0 and page.console.dialogs == []

    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_selector("[data-chart=loss] canvas")
    # The charts follow their container through a ResizeObserver, a frame or so later.
    # (Polled through js: wait_for_function evaluates a string in the page, which its CSP forbids.)
    wait_for(lambda: js(page, "document.documentElement.scrollWidth") <= 390, timeout=5,
             what="the page to fit a phone's width")
    page.emulate_media(color_scheme="dark")
    background = js(page, "getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(17, 20, 24)"  # --bg of the dark scheme
    page.goto(f"{control_plane.url}/#/")
    page.wait_for_selector(f"tr[data-job='{job_id}']")
    assert js(page, "document.documentElement.scrollWidth") <= 390
    assert page.console.unexpected() == [] and page.console.dialogs == []


def test_series_combine_pods_and_cut_pauses(control_plane: ControlPlane, page: Any) -> None:
    login(page, control_plane)
    result = page.evaluate("""async () => {
        const { KeyedSeries, TimeSeries } = await import('/static/series.js');
        const loss = new KeyedSeries(['mean']);
        loss.add(2, [1.0]); loss.add(1, [3.0]); loss.add(2, [2.0]); loss.add(3, [NaN]);
        const speed = new TimeSeries(['mean']);
        for (let step = 1; step <= 20; step += 1) speed.add(100 + step * 0.1, step, [10]);
        speed.add(100.15, 1, [20]);  // pod 2's report of step 1
        speed.add(110, 21, [5]);     // after a 8 s pause
        return { loss: loss.data(), speed: speed.data(), at: speed.keyAt(105) };
    }""")
    assert result["loss"] == [[1, 2, 3], [3.0, 1.5, None]]
    x, y = result["speed"]
    assert len(x) == 22 and y[0] == 15 and y[-2] is None and y[-1] == 5  # merged; a gap
    assert x == sorted(x) and result["at"] == 20
    assert page.console.unexpected() == []


def test_a_misspelled_contract_name_throws_where_it_is_read(control_plane: ControlPlane,
                                                            page: Any) -> None:
    login(page, control_plane)
    read = page.evaluate("""async () => {
        const { EVENT, KIND } = await import('/static/contract.js');
        let misspelled = null;
        try { misspelled = KIND.evall; } catch (error) { misspelled = error.message; }
        return [KIND.eval, misspelled, Object.isFrozen(EVENT), Object.keys(KIND)];
    }""")
    known, misspelled, frozen, listed = read
    assert known == "eval" and misspelled == "KIND has no name evall" and frozen
    assert listed == ["metric", "eval", "checkpoint", "samples", "event"]
    assert page.console.unexpected() == []


def cancelled_job(plane: ControlPlane) -> str:
    """A job whose pod stopped at once: only what a test reports happens to it."""
    created = plane.http.post("/api/v1/jobs", json={**SPEC, "replicas": 1})
    assert created.status_code == 201, created.text
    job_id = str(created.json()["id"])
    assert plane.http.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
    return job_id


def report_evaluations(plane: ControlPlane, job_id: str, first: int, last: int) -> None:
    """Epochs `first` to `last`'s validation results, as the job's pod 0 reports them."""
    records = [record(n, evaluation(epoch=n, step=10 * n, accuracy=0.5 + n / 20), time.time())
               for n in range(first, last + 1)]
    response = plane.http.post(
        f"/api/v1/jobs/{job_id}/reports",
        headers={"Authorization": f"Bearer {plane.report_token(job_id)}"},
        json={"pod": f"{job_id}-0", "incarnation": "web-test", "records": records})
    assert response.status_code == 200, response.text


def test_a_long_history_loads_as_a_bounded_series_and_the_stream_goes_on_from_it(
        control_plane: ControlPlane, page: Any) -> None:
    job_id = cancelled_job(control_plane)
    steps, start = 6000, time.time() - 6000
    seq = itertools.count(1)

    def send(records: list[dict]) -> None:
        response = control_plane.http.post(
            f"/api/v1/jobs/{job_id}/reports",
            headers={"Authorization": f"Bearer {control_plane.report_token(job_id)}"},
            json={"pod": f"{job_id}-0", "incarnation": "web-test", "records": records})
        assert response.status_code == 200, response.text

    def validation(epoch: int) -> dict:
        return record(next(seq), evaluation(epoch=epoch, accuracy=0.5 + epoch / 20), time.time())

    for first in range(1, steps + 1, 1000):
        send([record(next(seq), metric_data(step, loss=9.0 if step == 4321 else 1.0 / step),
                     start + step) for step in range(first, first + 1000)])
    send([validation(1), validation(2)])

    login(page, control_plane, f"#/jobs/{job_id}")
    page.wait_for_selector(".connection[data-state=live]")
    wait_for(lambda: chart_points(page, "accuracy") == 2, timeout=20, what="the history")
    drawn = chart_points(page, "loss")
    assert 400 <= drawn <= 2002  # the series' bound (web/static/history.js), not every step
    losses = page.evaluate("async () => (await import('/static/state.js')).state.job"
                           ".series.loss.ys[0]")
    assert max(losses) == 9.0  # the spike is among the points kept
    assert page.locator(".timeline li[data-tag='validation eval']").count() == 2

    # What arrives next comes through the stream, once.
    send([record(next(seq), metric_data(steps + 1, loss=0.25), time.time())])
    wait_for(lambda: chart_points(page, "loss") == drawn + 1, timeout=10, what="the new step")
    send([validation(3)])
    wait_for(lambda: chart_points(page, "accuracy") == 3, timeout=10, what="the new evaluation")
    assert page.locator(".timeline li[data-tag='validation eval']").count() == 3


def test_the_timeline_shows_the_latest_events_and_older_ones_on_demand(
        control_plane: ControlPlane, page: Any) -> None:
    job_id = cancelled_job(control_plane)
    epochs = 450  # more than two of the timeline's pages (200 events, web/static/history.js)
    response = control_plane.http.post(
        f"/api/v1/jobs/{job_id}/reports",
        headers={"Authorization": f"Bearer {control_plane.report_token(job_id)}"},
        json={"pod": f"{job_id}-0", "incarnation": "web-test", "records": [
            record(n, evaluation(epoch=n, step=n), time.time()) for n in range(1, epochs + 1)]})
    assert response.status_code == 200, response.text
    reads = []
    page.on("request", lambda r: "/events?" in r.url and reads.append(r.url))

    login(page, control_plane, f"#/jobs/{job_id}")
    page.wait_for_selector(".connection[data-state=live]")
    rows = page.locator(".timeline li[data-tag='validation eval']")
    wait_for(lambda: rows.count() > 0, timeout=10, what="the latest events")
    older = page.get_by_role("button", name="Show older events")
    said = page.locator(".older [role=status]")
    older.wait_for()

    def epochs_shown() -> list[int]:
        texts = rows.evaluate_all("rows => rows.map(row => row.textContent)")
        return [int(text.rsplit("(epoch ", 1)[1].rstrip(")")) for text in texts]

    # The newest page only (a few of the job's own pod events may be among it), newest first;
    # the accuracy chart has every evaluation all the same.
    latest = epochs_shown()
    assert latest == list(range(epochs, epochs - len(latest), -1)) and 190 <= len(latest) <= 200
    assert chart_points(page, "accuracy") == epochs
    assert len(reads) == 2 and all("before=" in url for url in reads)  # evaluations, the page

    older.click()
    wait_for(lambda: rows.count() > len(latest), timeout=10, what="the older page")
    shown = epochs_shown()
    assert shown[:len(latest)] == latest and len(shown) >= len(latest) + 190
    assert shown == list(range(epochs, epochs - len(shown), -1))  # the page below, in order
    assert said.inner_text() == f"{len(shown) - len(latest)} older events loaded."

    older.focus()  # the button works from the keyboard, and says when nothing is older
    page.keyboard.press("Enter")
    wait_for(lambda: rows.count() == epochs, timeout=10, what="the oldest page")
    assert epochs_shown() == list(range(epochs, 0, -1))
    assert said.inner_text().endswith("No older events.") and older.is_hidden()
    assert page.evaluate("() => document.activeElement.getAttribute('role')") == "status"
    assert page.locator(".timeline li").last.get_attribute("data-tag") == "pending"
    assert page.console.unexpected() == []


def watch_connection(page: Any) -> None:
    """From now on, every state the connection indicator takes, in order, seen as it changes:
    after a restart the page may be live again before `restart` returns."""
    page.evaluate("""() => {
      const connection = document.querySelector('.connection');
      window.connectionStates = [];
      new MutationObserver(() => window.connectionStates.push(connection.dataset.state))
        .observe(connection, { attributes: true, attributeFilter: ['data-state'] });
    }""")


def wait_live_again(page: Any) -> None:
    """The watched stream broke (the indicator said so first) and is live again."""
    wait_for(lambda: page.evaluate("window.connectionStates").count("live") >= 1, timeout=30,
             what="the stream live again")
    assert page.evaluate("window.connectionStates")[0] == "reconnecting"


def test_the_stream_reconnects_after_a_control_plane_restart_and_misses_nothing(
        control_plane: ControlPlane, page: Any) -> None:
    job_id = cancelled_job(control_plane)

    login(page, control_plane, f"#/jobs/{job_id}")
    page.wait_for_selector(".connection[data-state=live]")
    report_evaluations(control_plane, job_id, 1, 3)
    rows = page.locator(".timeline li[data-tag='validation eval']")
    wait_for(lambda: rows.count() == 3, timeout=10, what="three evaluations")

    watch_connection(page)
    control_plane.restart()
    wait_live_again(page)
    report_evaluations(control_plane, job_id, 4, 6)
    wait_for(lambda: rows.count() == 6, timeout=15, what="the evaluations sent after the restart")
    ids = [rows.nth(i).get_attribute("data-event") for i in range(6)]
    assert len(set(ids)) == 6 and chart_points(page, "accuracy") == 6
    # The browser notes the stream cut by the kill and its retries while the API was down.
    assert page.console.unexpected("net::ERR_INCOMPLETE_CHUNKED_ENCODING",
                                   "net::ERR_CONNECTION_REFUSED") == []


@pytest.fixture
def short_links(tmp_path: Path, control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """A control plane of its own whose stream links last 3 s (the first one's inputs)."""
    processes = Processes()
    plane = ControlPlane(processes, tmp_path / "data", control_plane.inputs_dir,
                         env={"MIGRATOR_STREAM_LINK_SECONDS": "3"})
    try:
        plane.start()
        yield plane
    finally:
        plane.close()
        processes.cleanup()


def link_expiry(url: str) -> int:
    return int(parse_qs(urlsplit(url).query)["expires"][0])


def test_the_stream_outlives_its_link_and_a_reconnect_takes_a_new_one(
        short_links: ControlPlane, page: Any) -> None:
    plane = short_links
    job_id = cancelled_job(plane)
    streams: list[tuple[float, str]] = []  # when the page opened the stream, and its URL
    page.context.on("request", lambda r: "/stream?" in r.url
                    and streams.append((time.time(), r.url)))
    login(page, plane, f"#/jobs/{job_id}")
    page.wait_for_selector(".connection[data-state=live]")
    rows = page.locator(".timeline li[data-tag='validation eval']")

    first = link_expiry(streams[0][1])
    wait_for(lambda: time.time() > first + 1, timeout=10, what="the stream's link to expire")
    report_evaluations(plane, job_id, 1, 2)
    wait_for(lambda: rows.count() == 2, timeout=10, what="evaluations on the open stream")
    assert len(streams) == 1  # the same stream, open past its link's expiry

    watch_connection(page)
    plane.restart()  # the stream breaks, long after its link expired
    wait_live_again(page)
    report_evaluations(plane, job_id, 3, 4)
    wait_for(lambda: rows.count() == 4, timeout=15, what="the evaluations after the reconnect")
    opened, url = streams[-1]
    assert link_expiry(url) > first and opened <= link_expiry(url)  # a new link, in time
    assert all("signature=" in url and "token" not in url for _, url in streams)
    # Connection errors while the API was down; no 403: no expired link was ever tried.
    assert page.console.unexpected("net::ERR_INCOMPLETE_CHUNKED_ENCODING",
                                   "net::ERR_CONNECTION_REFUSED") == []


def test_the_replicas_control_scales_the_job(control_plane: ControlPlane, page: Any,
                                             artifacts_dir: Path) -> None:
    created = control_plane.http.post("/api/v1/jobs",
                                      json={**SPEC, "replicas": 1, "max_replicas": 2})
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    report = reporter(control_plane, job_id)
    try:
        login(page, control_plane, f"#/jobs/{job_id}")
        field, scale = page.locator("#replicas"), page.locator("form.replicas button")
        field.wait_for()
        assert field.input_value() == "1" and field.get_attribute("max") == "2"
        report(0, metric_data(1, participants=1))  # a first point of the participants chart

        field.fill("3")  # above max_replicas: the API's 422 says why
        with page.expect_response(lambda r: r.request.method == "PATCH") as answered:
            scale.click()
        assert answered.value.status == 422
        wait_for(lambda: notice_says(page, "at most the job's max_replicas (2)"), timeout=10,
                 what="the 422's message")
        assert field.get_attribute("aria-invalid") == "true"
        assert control_plane.job(job_id)["spec"]["replicas"] == 1

        field.fill("2")
        with page.expect_request(lambda r: r.method == "PATCH"
                                 and r.url.endswith(f"/api/v1/jobs/{job_id}")) as sent:
            scale.click()
        assert sent.value.post_data_json == {"replicas": 2}
        wait_for(lambda: "2 pods" in page.inner_text(".stats"), timeout=10, what="2 pods shown")
        assert field.input_value() == "2" and field.get_attribute("aria-invalid") is None
        assert control_plane.job(job_id)["spec"]["replicas"] == 2
        scaled = page.locator(".timeline li[data-tag=scaled]")
        scaled.wait_for()
        assert "scale 1→2" in scaled.inner_text()
        note = page.locator("tr[data-ordinal='1'] .note")
        wait_for(lambda: note.inner_text() == "joining", timeout=10, what="pod 1 joining")

        report(1, joined(f"{job_id}-1", step=3), metric_data(3), incarnation="web-test-1")
        page.locator(".timeline li[data-tag=joined]:has-text('pod 1 joined at step 3')").wait_for()
        assert note.inner_text() != "joining"

        field.fill("1")
        with page.expect_request(lambda r: r.method == "PATCH") as sent:
            scale.click()
        assert sent.value.post_data_json == {"replicas": 1}
        page.locator(".timeline li[data-tag=scaled]:has-text('scale 2→1')").wait_for()
        report(1, Left(message="left", pod=f"{job_id}-1", step=4, epoch=1),
               incarnation="web-test-1")
        left = page.locator(".timeline li[data-tag=left]")
        left.wait_for()
        assert "pod 1 left (scale-down) after step 4" in left.inner_text()
        report(0, metric_data(5, participants=1))  # the chart's x range covers every change
        wait_for(lambda: {"scale", "join", "leave"} <= set(drawn_markers(page, "participants")),
                 timeout=10, what="the membership markers on the participants chart")
        assert {"scale 1→2", "pod 1 joined", "scale 2→1",
                "pod 1 left (scale-down)"} <= set(marker_labels(page))
        save_artifact(page, artifacts_dir, "dashboard-job-scaled.png")
        assert page.console.unexpected(422) == []
    finally:  # its pods would slow the other tests down
        LocalBackend(control_plane.data_dir / "jobs").delete(job_id)


def test_the_migrate_button_moves_a_pod(control_plane: ControlPlane, page: Any) -> None:
    created = control_plane.http.post("/api/v1/jobs", json=SPEC)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    report = reporter(control_plane, job_id)
    try:
        login(page, control_plane, f"#/jobs/{job_id}")
        migrate = page.locator("tr[data-ordinal='1'] button", has_text="Migrate")
        migrate.wait_for()
        assert migrate.is_disabled()  # the job is starting: nothing to migrate yet
        report(0, metric_data(1))  # training: the job runs
        wait_for(migrate.is_enabled, timeout=60, what="pod 1 running in a running job")

        def click_migrate() -> Any:
            migrate.click()
            page.wait_for_selector("#confirm[open]")
            with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith(
                    f"/api/v1/jobs/{job_id}/pods/1/migrate")) as answered:
                page.click("#confirm-ok")
            return answered.value

        assert click_migrate().status == 202
        # The confirmation goes after 10 s: look for it before what the next polls bring.
        wait_for(lambda: notice_says(page, "Pod 1 is migrating"), timeout=5,
                 what="the migration's confirmation")
        page.locator(".timeline li[data-tag=migrate]").wait_for()
        note = page.locator("tr[data-ordinal='1'] .note")
        wait_for(lambda: note.inner_text() == "migrating", timeout=10, what="pod 1 migrating")

        assert click_migrate().status == 409  # the API's detail is shown
        wait_for(lambda: notice_says(page, f"{job_id}-1 is already migrating"), timeout=10,
                 what="the 409's detail")

        # The replacement takes part in a step: the API records the migration as done.
        report(1, joined(f"{job_id}-1", step=3), incarnation="replacement")
        migrated = page.locator(".timeline li[data-tag=migrated]")
        migrated.wait_for()
        assert re.search(r"pod 1 migrated in [\d.]+ s", migrated.inner_text())
        report(0, metric_data(4))
        wait_for(lambda: {"migrate", "migrated"} <= set(drawn_markers(page, "participants")),
                 timeout=10, what="the migration's markers on the participants chart")
        wait_for(lambda: note.inner_text() != "migrating", timeout=10, what="the note to go")
        assert "migrate 1" in marker_labels(page)
        assert "join" not in drawn_markers(page, "participants")  # its own marker says it

        assert control_plane.http.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
        page.wait_for_selector(".title-row .badge[data-status=cancelled]")
        wait_for(migrate.is_disabled, timeout=10, what="no migration of a cancelled job")
        assert page.locator("form.replicas").is_hidden()
        assert page.console.unexpected(409) == []
    finally:
        LocalBackend(control_plane.data_dir / "jobs").delete(job_id)
