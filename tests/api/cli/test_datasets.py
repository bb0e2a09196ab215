"""`migrator datasets ...` against the real app (TestClient)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.cli.commands import main
from tests.api.conftest import ADMIN_TOKEN
from tests.api.fakes import FakeBackend
from trainer.contract.staged import STAGED_FILE, staged_dir, staging_id


@pytest.fixture
def database_url() -> None:
    """SQLite alone (tests/api/routes/test_datasets.py covers the routes)."""


def run(client: TestClient, capsys: pytest.CaptureFixture[str], *argv: str,
        ) -> tuple[int, str, str]:
    code = main(["--token", ADMIN_TOKEN, "datasets", *argv], http=client)
    out, err = capsys.readouterr()
    return code, out, err


def test_upload_list_show_and_delete(client: TestClient, capsys: pytest.CaptureFixture[str],
                                     tmp_path: Path) -> None:
    upload = tmp_path / "moods.csv"
    upload.write_text("review,mood\n" + "".join(
        f"review {i},{['sad', 'happy', 'calm'][i % 3]}\n" for i in range(30)) + "review 0,sad\n")
    code, out, err = run(client, capsys, "upload", str(upload), "--label-column", "mood")
    assert code == 0, err
    dataset_id = out.split()[0]
    assert dataset_id.startswith("ds-") and "moods.csv" in out.splitlines()[0]
    assert "30 rows: calm 10, happy 10, sad 10; dropped 1 duplicate and 0 empty" in out
    assert "review 0" in out  # the preview

    code, out, _ = run(client, capsys, "list")
    assert code == 0
    assert out.splitlines()[0].split() == ["ID", "NAME", "ROWS", "BALANCE", "LABELS", "SIZE"]
    assert dataset_id in out and "10/10/10" in out and "calm, happy, sad" in out
    code, out, _ = run(client, capsys, "show", dataset_id)
    assert (code, out.split()[0]) == (0, dataset_id)

    assert run(client, capsys, "delete", dataset_id)[:2] == (0, f"deleted {dataset_id}\n")
    code, _, err = run(client, capsys, "show", dataset_id)
    assert code == 1 and "no dataset" in err


def test_a_file_that_cannot_train_or_cannot_be_read_says_why(
        client: TestClient, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    one_class = tmp_path / "one.csv"
    one_class.write_text("text,label\n" + "".join(f"t{i},x\n" for i in range(20)))
    code, _, err = run(client, capsys, "upload", str(one_class))
    assert code == 1 and "1 class" in err
    code, _, err = run(client, capsys, "upload", str(tmp_path / "missing.csv"))
    assert code == 2 and "cannot read" in err and "missing.csv" in err


def test_stagings_lists_each_repository_with_its_progress(
        client: TestClient, capsys: pytest.CaptureFixture[str], backend: FakeBackend) -> None:
    from datetime import timedelta

    from sqlmodel import Session

    from api.asset_models import Staging, StagingStatus
    from api.models import utc_now

    started = staging_id("model", "acme/bert")
    backend.initializing.add(started)  # its initializer runs: the reconciler leaves it be
    with Session(client.app.state.engine) as session:  # type: ignore[attr-defined]
        session.add(Staging(id=started, kind="model", repo_id="acme/bert",
                            revision="main", status=StagingStatus.running, bytes_done=104_857_600,
                            bytes_total=419_430_400,
                            started_at=utc_now() - timedelta(seconds=1000)))
        session.add(Staging(id=staging_id("dataset", "acme/reviews", "v1"), kind="dataset",
                            repo_id="acme/reviews",
                            revision="v1", status=StagingStatus.failed, error="401 Unauthorized"))
        session.commit()
    code = main(["--token", ADMIN_TOKEN, "stagings"], http=client)
    out, err = capsys.readouterr()
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "KIND", "REPOSITORY", "STATUS", "PROGRESS", "ETA", "ERROR"]
    running = next(row for row in rows if "acme/bert@main" in row)
    # A quarter in 1,000 s (and the moments the test takes): the rest in 3,000 s (and 3 times
    # those moments).
    assert "running" in running and "104.9 MB of 419.4 MB" in running
    eta = int(running.split(" s")[0].split()[-1])
    assert 3000 <= eta <= 3100
    failed = next(row for row in rows if "acme/reviews@v1" in row)
    assert "failed" in failed and "401 Unauthorized" in failed
    shown = client.get(f"/api/v1/stagings/{started}",
                       headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    assert shown["status"] == "running" and shown["bytes_total"] == 419_430_400
    assert client.get("/api/v1/stagings/st-absent",
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 404


def test_stagings_import_and_delete(client: TestClient, capsys: pytest.CaptureFixture[str],
                                    backend: FakeBackend) -> None:
    def run_stagings(*argv: str) -> tuple[int, str, str]:
        code = main(["--token", ADMIN_TOKEN, "stagings", *argv], http=client)
        return code, *capsys.readouterr()

    code, out, err = run_stagings("import", "model", "acme/bert", "--revision", "v1")
    assert code == 0 and "acme/bert@v1" in out and "running" in out, err
    request = backend.stagings[0]
    code, _, err = run_stagings("delete", request.staging_id)
    assert code == 1 and "is running" in err  # the 409's reason
    directory = staged_dir(request.inputs_dir, "model", "acme/bert", "v1")
    directory.mkdir(parents=True)
    (directory / STAGED_FILE).write_text('{"files": ["config.json"], "bytes": 10}')
    backend.end_staging(request.staging_id)
    code, out, _ = run_stagings("import", "model", "acme/bert", "--revision", "v1")
    assert code == 0 and "succeeded" in out  # staged: nothing started again
    assert run_stagings("delete", request.staging_id)[:2] == (0, f"deleted {request.staging_id}\n")
    code, out, _ = run_stagings()
    assert code == 0 and out.splitlines()[1:] == []


def test_datasets_import_starts_one_and_says_how_to_follow_it(
        client: TestClient, capsys: pytest.CaptureFixture[str], backend: FakeBackend) -> None:
    code, out, err = run(client, capsys, "import", "s3://reviews/2026/imdb.csv",
                         "--label-column", "sentiment")
    assert code == 0, err
    assert "s3://reviews/2026/imdb.csv" in out and "running" in out
    assert "migrator stagings" in out
    options = json.loads(backend.stagings[0].spec or "")
    assert (backend.stagings[0].kind, options["label_column"]) == ("file", "sentiment")
    code, _, err = run(client, capsys, "import", "ftp://reviews/imdb.csv")
    assert code == 1 and "source" in err


def test_stagings_list_of_one_kind(client: TestClient, capsys: pytest.CaptureFixture[str],
                                   backend: FakeBackend) -> None:
    def run_stagings(*argv: str) -> tuple[int, str, str]:
        code = main(["--token", ADMIN_TOKEN, "stagings", *argv], http=client)
        return code, *capsys.readouterr()

    assert run_stagings("import", "model", "acme/bert")[0] == 0
    assert run_stagings("import", "dataset", "acme/reviews")[0] == 0
    code, out, err = run_stagings("list", "--kind", "model")
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["ID", "KIND", "REPOSITORY"]
    assert [row.split()[1:3] for row in rows] == [["model", "acme/bert@main"]]
    code, out, _ = run_stagings("list", "--kind", "dataset")
    assert [row.split()[1:3] for row in out.splitlines()[1:]] == [["dataset", "acme/reviews@main"]]
    code, out, _ = run_stagings("list")
    assert code == 0 and len(out.splitlines()[1:]) == 2
    with pytest.raises(SystemExit) as refused:
        run_stagings("list", "--kind", "weights")
    assert refused.value.code == 2 and "invalid choice: 'weights'" in capsys.readouterr().err
