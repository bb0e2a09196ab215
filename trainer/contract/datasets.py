"""Where an uploaded dataset lives, as the API writes it and the trainer reads it.

An upload (`POST /api/v1/datasets`) is checked and written once, in a normal form, under the
inputs dir that every pod already mounts read-only: `datasets/<id>/data.parquet` holds the rows
that train (a `text` string column and a `label` integer column, 0 to classes - 1, duplicates
and empty rows dropped) and `datasets/<id>/dataset.json` what the API showed (the label names in
label order among it). A job names the dataset by its id; its pods read the Parquet file and
never see the upload itself. The id is derived from the upload's bytes and the columns it was
read with, so the same file uploaded twice is one dataset.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

DATASETS_DIR = "datasets"
"""The inputs dir's folder of uploaded datasets."""
INCOMING_DIR = ".incoming"
"""Inside DATASETS_DIR: uploads being received or checked (removed when the API starts)."""
DATA_FILE = "data.parquet"
META_FILE = "dataset.json"
TEXT, LABEL = "text", "label"
"""The columns of DATA_FILE."""
DATASET_ID = re.compile(r"^ds-[0-9a-f]{16}$")
BINARY_LABELS = ("negative", "positive")
"""The label names of the built-in datasets and of local files, in label order."""
SENTIMENT_WORDS = {"negative": 0, "neg": 0, "false": 0, "rotten": 0,
                   "positive": 1, "pos": 1, "true": 1, "fresh": 1}
"""Label values read as negative (0) or positive (1), in any case."""


class JsonLineError(ValueError):
    """A line of a JSON-lines file that is not a JSON object: `number`, and what is wrong."""

    def __init__(self, number: int, problem: str) -> None:
        super().__init__(f"line {number}: {problem}")
        self.number, self.problem = number, problem


def json_objects(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSON-lines file; JsonLineError for
    one that is not a JSON object."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise JsonLineError(number, f"not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise JsonLineError(number, "expected a JSON object")
        yield number, row


def is_dataset_id(name: str) -> bool:
    return DATASET_ID.match(name) is not None


def dataset_dir(inputs_dir: Path, dataset_id: str) -> Path:
    if not is_dataset_id(dataset_id):
        raise ValueError(f"not a dataset id: {dataset_id!r}")
    return inputs_dir / DATASETS_DIR / dataset_id
