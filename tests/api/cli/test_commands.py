"""`migrator` (api/cli.py) against the real app (TestClient) or a recording transport."""

from __future__ import annotations

import json
import pkgutil
import shutil
import tomllib
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from api.cli.commands import main
from tests.api.conftest import ADMIN_TOKEN, AUTH, create_job, metric, report
from tests.api.fakes import FakeBackend
from tests.api.test_reconciler import reconcile
from tests.conftest import ROOT
from tests.factories import completed, record
from tests.support import free_port
from trainer.contract.records import Joined

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(client: TestClient, capsys: pytest.CaptureFixture[str]) -> Run:
    """Run the CLI against the app; return its exit code, stdout and stderr."""

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(["--token", ADMIN_TOKEN, *argv], http=client)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def recorded(handler: Callable[[httpx.Request], httpx.Response],
             ) -> tuple[httpx.Client, list[httpx.Request]]:
    """An httpx client whose requests are answered by `handler` and kept in the list."""
    requests: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return handler(request)

    return httpx.Client(base_url="http://api", transport=httpx.MockTransport(record)), requests


@pytest.fixture
def model_id(client: TestClient, backend: FakeBackend, tiny_model_dir: Path) -> str:
    """A registered model: the tiny model exported by a job, with a test accuracy."""
    job = create_job(client, name="tiny job", model="tiny", dataset="reviews.csv")
    model_dir = backend.launches[0].model_dir
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "metrics.json").write_text(json.dumps({"metrics": {"test_accuracy": 0.8421}}))
    report(client, backend, job["id"], [record(1, completed("x"))])
    reconcile(client, backend)
    return str(client.get(f"/api/v1/jobs/{job['id']}", headers=AUTH).json()["model_id"])


def one_line(text: str) -> str:
    assert text.endswith("\n") and text.count("\n") == 1, text
    assert "Traceback" not in text
    return text.strip()


# --- bad input: exit 2, one line, nothing sent -----------------------------------------------


def test_a_bad_spec_exits_2_with_one_line(cli: Run, client: TestClient, tmp_path: Path) -> None:
    code, out, err = cli("submit", "{replicas: 2}")
    assert code == 2 and out == ""
    assert one_line(err).startswith("error: the spec is not valid JSON: Expecting property name")
    code, _, err = cli("submit", "[2]")
    assert code == 2 and "must be a JSON object" in one_line(err)
    code, _, err = cli("submit", f"@{tmp_path / 'missing.json'}")
    assert code == 2 and "cannot read the spec file" in one_line(err)
    assert client.get("/api/v1/jobs", headers=AUTH).json()["count"] == 0


def test_a_settings_error_exits_2_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MIGRATOR_BACKEND", "bogus")
    monkeypatch.delenv("MIGRATOR_ADMIN_TOKEN", raising=False)
    assert main(["list"]) == 2  # no --token: the token comes from the settings
    err = one_line(capsys.readouterr().err)
    assert err.startswith("error: invalid settings: MIGRATOR_BACKEND: Input should be 'local'")


def test_a_usage_error_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--token", ADMIN_TOKEN, "kill", "job-1", "one"])
    assert exit_.value.code == 2
    assert one_line(capsys.readouterr().err) == (
        "migrator kill: error: argument ordinal: invalid int value: 'one' (see --help)")


# --- the API's errors: exit 1, its error and detail ----------------------------------------


def test_an_unknown_job_exits_1_with_the_servers_detail(cli: Run) -> None:
    code, out, err = cli("get", "job-nope")
    assert (code, out) == (1, "")
    assert one_line(err) == "error: 404 not_found: job job-nope not found"


def test_a_refused_spec_names_the_field(cli: Run) -> None:
    code, _, err = cli("submit", '{"replicas": 0, "resources": {"cpu": "lots"}}')
    assert code == 1
    assert one_line(err).startswith("error: 422 invalid: replicas: Input should be greater than "
                                    "or equal to 1; resources.cpu: String should match pattern")


def test_a_body_that_is_not_the_apis_is_cut_to_one_line(capsys: pytest.CaptureFixture[str],
                                                        ) -> None:
    http, _ = recorded(lambda _: httpx.Response(502, text="<html>\n<b>Bad gateway</b>\n</html>"))
    assert main(["--token", ADMIN_TOKEN, "list"], http=http) == 1
    assert one_line(capsys.readouterr().err) == (
        "error: 502 Bad Gateway: <html> <b>Bad gateway</b> </html>")


def test_an_unreachable_server_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["--token", ADMIN_TOKEN, "--url", url, "list"]) == 1
    assert one_line(capsys.readouterr().err).startswith(f"error: cannot reach {url}: ")


# --- commands ---------------------------------------------------------------------------------


def test_submit_list_get_and_watch(cli: Run, client: TestClient) -> None:
    code, out, _ = cli("submit", '{"name": "cli job", "replicas": 2}')
    job_id = out.strip()
    assert code == 0 and job_id.startswith("job-")
    code, out, _ = cli("list")
    assert code == 0 and out.startswith(f"{job_id} ")
    assert "pods [0:Pending 1:Pending]" in out  # phases in full
    code, out, _ = cli("get", job_id)
    assert code == 0 and json.loads(out)["name"] == "cli job"

    assert cli("cancel", job_id)[0] == 0
    code, out, err = cli("watch", job_id)  # a finished job: one pass, then the end
    assert code == 1 and f"{job_id} cancelled" in out and "[job]" in out
    assert one_line(err).startswith(f"{job_id} cancelled")


def test_cancel_stops_the_job(cli: Run, client: TestClient, backend: FakeBackend) -> None:
    job_id = create_job(client)["id"]
    code, out, _ = cli("cancel", job_id)
    assert code == 0 and out.strip()
    assert client.get(f"/api/v1/jobs/{job_id}", headers=AUTH).json()["status"] == "cancelled"
    assert backend.deleted == [job_id]


def test_finish_asks_the_job_to_end_after_an_epoch(cli: Run, client: TestClient) -> None:
    job_id = create_job(client, epochs=3)["id"]
    code, out, _ = cli("finish", job_id, "--after-epoch", "2")
    assert code == 0 and out.startswith(f"{job_id}: asked to finish after epoch 2 of 3")
    assert client.get(f"/api/v1/jobs/{job_id}", headers=AUTH).json()["progress"]["epochs"] == 2
    code, _, err = cli("finish", job_id, "--after-epoch", "4")
    assert code == 1 and "after_epoch" in err and "at most the job's epochs (3)" in err


def test_cancel_posts_to_the_cancel_route(capsys: pytest.CaptureFixture[str]) -> None:
    http, requests = recorded(lambda _: httpx.Response(202, json={
        "id": "job-1", "status": "cancelled", "detail": "workload deleted; checkpoints kept"}))
    assert main(["--token", ADMIN_TOKEN, "cancel", "job-1"], http=http) == 0
    assert [(r.method, r.url.path) for r in requests] == [("POST", "/api/v1/jobs/job-1/cancel")]
    assert requests[0].headers["Authorization"] == f"Bearer {ADMIN_TOKEN}"
    assert capsys.readouterr().out == "workload deleted; checkpoints kept\n"


def test_cancel_falls_back_to_delete_on_an_older_server(capsys: pytest.CaptureFixture[str],
                                                       ) -> None:
    def older(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":  # no such route there
            return httpx.Response(404, json={"error": "not_found", "detail": "Not Found"})
        return httpx.Response(202, json={"id": "job-1", "status": "cancelled",
                                         "detail": "workload deleted"})

    http, requests = recorded(older)
    assert main(["--token", ADMIN_TOKEN, "cancel", "job-1"], http=http) == 0
    assert [(r.method, r.url.path) for r in requests] == [
        ("POST", "/api/v1/jobs/job-1/cancel"), ("DELETE", "/api/v1/jobs/job-1")]
    assert capsys.readouterr().out == "workload deleted\n"


def test_delete_removes_the_record_and_with_artifacts_the_files(
        capsys: pytest.CaptureFixture[str]) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("job-running"):
            return httpx.Response(409, json={"error": "conflict",
                                             "detail": "job job-running is running"})
        return httpx.Response(204)

    http, requests = recorded(answer)
    assert main(["--token", ADMIN_TOKEN, "delete", "job-1"], http=http) == 0
    assert "kept" in capsys.readouterr().out
    assert main(["--token", ADMIN_TOKEN, "delete", "job-1", "--artifacts"], http=http) == 0
    assert "with its checkpoints, logs and model" in capsys.readouterr().out
    assert main(["--token", ADMIN_TOKEN, "delete", "job-running"], http=http) == 1
    assert one_line(capsys.readouterr().err) == "error: 409 conflict: job job-running is running"
    assert [(r.method, r.url.path, dict(r.url.params)) for r in requests] == [
        ("DELETE", "/api/v1/jobs/job-1", {}),
        ("DELETE", "/api/v1/jobs/job-1", {"delete_artifacts": "true"}),
        ("DELETE", "/api/v1/jobs/job-running", {})]


def test_kill_and_logs(cli: Run, client: TestClient, backend: FakeBackend) -> None:
    job_id = create_job(client)["id"]
    code, out, _ = cli("kill", job_id, "1", "--grace-seconds", "2")
    assert code == 0 and "pod killed (grace 2 s)" in out
    assert backend.kills == [(job_id, 1, 2.0)]

    backend.logs[(job_id, 1)] = [f"line {i}" for i in range(10)]
    code, out, _ = cli("logs", job_id, "1", "--lines", "3")
    assert (code, out) == (0, "line 7\nline 8\nline 9\n")
    code, out, err = cli("logs", job_id, "5")
    assert (code, out) == (1, "") and one_line(err).startswith("error: 404 not_found: ")
    code, _, err = cli("logs", job_id, "1", "--lines", "0")
    assert code == 1 and one_line(err).startswith(
        "error: 422 invalid: lines: Input should be greater than or equal to 1")


def test_models_lists_what_a_user_compares(cli: Run, model_id: str) -> None:
    code, out, _ = cli("models")
    header, row = out.splitlines()
    assert code == 0 and header.split() == ["ID", "JOB", "BASE", "MODEL", "DATASET", "TEST",
                                            "ACC", "SIZE"]
    cells = row.split()
    assert cells[0] == model_id and cells[1].startswith("job-")
    assert cells[2:5] == ["tiny", "reviews.csv", "84.2%"]
    assert cells[6] in ("kB", "MB")


def test_predict_prints_a_label_and_score_per_text(cli: Run, model_id: str) -> None:
    code, out, _ = cli("predict", model_id, "a good film", "a dull plot")
    header, *rows = out.splitlines()
    assert code == 0 and header.split() == ["LABEL", "SCORE", "TEXT"] and len(rows) == 2
    for row, text in zip(rows, ["a good film", "a dull plot"], strict=True):
        label, score, *words = row.split()
        assert label and 0 <= float(score) <= 1 and " ".join(words) == text
    code, _, err = cli("predict", "model-nope", "x")
    assert code == 1 and one_line(err).startswith("error: 404 not_found: ")


def test_download(cli: Run, model_id: str, tmp_path: Path) -> None:
    target = tmp_path / "model.tar.gz"
    code, out, _ = cli("download", model_id, "--output", str(target))
    assert (code, out) == (0, f"{target}\n")
    assert target.read_bytes()[:2] == b"\x1f\x8b"
    missing = tmp_path / "missing.tar.gz"
    code, _, err = cli("download", "model-nope", "--output", str(missing))
    assert code == 1 and one_line(err).startswith("error: 404 not_found: ")
    assert not missing.exists()


def test_login_url_prints_a_dashboard_url_that_logs_in_once(cli: Run, client: TestClient,
                                                           ) -> None:
    code, out, _ = cli("login-url")
    url = one_line(out)
    assert code == 0 and url.startswith("http://127.0.0.1:8000/#login=")
    assert ADMIN_TOKEN not in url
    login_code = url.split("#login=")[1]
    assert client.post("/api/v1/login", json={"code": login_code}).json() == {
        "token": ADMIN_TOKEN}
    assert client.post("/api/v1/login", json={"code": login_code}).status_code == 403


def test_the_migrator_console_script_is_main() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["migrator"] == "api.cli.commands:main"
    assert pkgutil.resolve_name(project["scripts"]["migrator"]) is main


def test_scale_and_migrate(cli: Run, client: TestClient, backend: FakeBackend) -> None:
    job_id = create_job(client, replicas=2, max_replicas=4)["id"]
    code, out, _ = cli("scale", job_id, "3")
    assert (code, out.strip()) == (0, f"{job_id}: 3 pods (at most 4)")
    assert backend.scales == [(job_id, 3)]
    code, _, err = cli("scale", job_id, "5")
    assert code == 1 and "replicas" in err and "max_replicas (4)" in err
    code, _, err = cli("migrate", job_id, "1")
    assert code == 1 and "starting" in err  # only a running job's pods migrate
    report(client, backend, job_id, [metric(1, 1)])
    code, out, _ = cli("migrate", job_id, "1")
    assert code == 0 and "replacement starts" in out
    code, _, err = cli("migrate", job_id, "0", "--node", "node-b")
    assert code == 1 and "node" in err
    assert backend.migrations == [(job_id, 1, None)]


# --- what pods send never drives the terminal -------------------------------------------------

# Real sequences a pod could put in a log line, an event message or a failure reason.
EVIL = ("\x1b[2J\x1b[H"  # CSI: clear the screen, cursor home
        "\x1b]52;c;cm0gLXJmIH4=\x07"  # OSC 52: set the clipboard
        "\x1b]0;pwned\x1b\\"  # OSC: the window title, ST-terminated
        "\x9b31m"  # C1 CSI
        "ok\rFAKE\x08\x7f\u202e\n  [job] succeeded")  # CR, backspace, DEL, bidi, a forged line


def printable(text: str) -> bool:
    return all(c.isprintable() or c in "\t\n" for c in text)


def test_what_pods_send_prints_escaped(cli: Run, client: TestClient,
                                       backend: FakeBackend) -> None:
    job_id = create_job(client)["id"]
    report(client, backend, job_id, [
        record(1, Joined(message=EVIL, pod=f"{job_id}-0", step=1, epoch=1, participants=1))])
    backend.logs[(job_id, 0)] = [EVIL, "the next line"]
    assert cli("cancel", job_id)[0] == 0

    code, out, _ = cli("watch", job_id)
    assert code == 1 and printable(out)
    joined = next(line for line in out.splitlines() if "pwned" in line)
    assert joined == (f"  [job] {job_id}-0: \\x1b[2J\\x1b[H\\x1b]52;c;cm0gLXJmIH4=\\x07"
                      "\\x1b]0;pwned\\x1b\\\\x9b31mok\\x0dFAKE\\x08\\x7f\\u202e\\x0a"
                      "  [job] succeeded")
    code, out, _ = cli("logs", job_id, "0")
    assert code == 0 and printable(out) and out.count("\n") == 2
    assert out.endswith("\\x0a  [job] succeeded\nthe next line\n")


def test_a_failure_reason_and_labels_print_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    job = {"id": "job-1", "status": "failed", "reason": EVIL + "\ud800", "name": EVIL,
           "progress": {"epoch": 1, "epochs": 1, "step": 3, "samples_seen": 0,
                        "total_samples": None}, "metrics": {}, "pods": []}
    events = {"data": [{"id": 1, "type": "job", "data": {"message": EVIL + "\ud800"}}],
              "next_after": None}

    def answer(request: httpx.Request) -> httpx.Response:
        body: dict = job
        if request.url.path.endswith("/events"):
            body = events
        elif request.url.path.endswith("/predict"):  # a model's labels come from its pods
            body = {"model_id": "m", "predictions": [{"label": EVIL, "score": 0.5}]}
        return httpx.Response(200, content=json.dumps(body).encode(),  # \ud800 as JSON has it
                              headers={"Content-Type": "application/json"})

    http, _ = recorded(answer)
    for argv in (["watch", "job-1"], ["get", "job-1"], ["predict", "m", "text"]):
        main(["--token", ADMIN_TOKEN, *argv], http=http)
        out, err = capsys.readouterr()
        # Escaped by the CLI (`\x1b`), or by JSON (`\u001b`): shown, not obeyed.
        assert printable(out) and printable(err) and "[2J" in out + err, argv
    # A lone surrogate (JSON's \ud800) would not even encode: it prints as its escape.
    main(["--token", ADMIN_TOKEN, "watch", "job-1"], http=http)
    assert "\\ud800" in capsys.readouterr().err
