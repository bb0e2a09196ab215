"""`migrator datasets ...` against the real app (TestClient)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.cli.commands import main
from tests.api.conftest import ADMIN_TOKEN


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
