"""A table (CSV, TSV, JSONL or Parquet: uploaded, or imported by an initializer) read in batches,
checked, and written once in the normal form pods train on (trainer.contract.datasets).

Memory stays flat whatever the file's size: the file is read twice, a block at a time. The
first pass keeps 9 bytes per usable row (a hash of its text and its label's code), in two
growing arrays, to find duplicates and count the classes; the second writes the rows kept. A
file that cannot train a classifier raises TableError saying why: not a table, no text or
label column, one class, too few rows, not UTF-8.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from array import array
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from trainer.contract.datasets import (
    DATA_FILE,
    LABEL,
    META_FILE,
    SENTIMENT_WORDS,
    TEXT,
    JsonLineError,
    dataset_dir,
    json_objects,
)

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl",
           ".parquet": "parquet"}
MEDIA_TYPES = {"text/csv": "csv", "text/tab-separated-values": "tsv",
               "application/x-ndjson": "jsonl", "application/jsonl": "jsonl",
               "application/vnd.apache.parquet": "parquet", "application/x-parquet": "parquet"}
TEXT_COLUMNS = ("text", "review", "sentence", "content", "comment", "body")
"""Looked for, in this order, when the upload names no text column."""
LABEL_COLUMNS = ("label", "labels", "sentiment", "class", "category", "target")
MIN_ROWS = 10
MAX_CLASSES = 256
"""More distinct labels than this and the column is not taken for a label (a code is a byte)."""
PREVIEW_ROWS, PREVIEW_CHARS = 5, 300
BATCH_ROWS = 8192
BLOCK_BYTES = 1 << 16
"""CSV read a block at a time: the reader holds about 40 blocks (it reads 32 ahead)."""
ROW_GROUP_BYTES = 8 << 20
"""Rows written to the normal form together (a Parquet row group)."""
INTEGER = re.compile(r"^-?\d+$")
UTF16_MARKS = (b"\xff\xfe", b"\xfe\xff")
"""The byte order marks of UTF-16 text, which is read too (what spreadsheets save as
"Unicode text")."""
NOT_UTF8 = "the file is not UTF-8 (nor UTF-16 with a byte order mark): save it as UTF-8"


class TableError(ValueError):
    """The file cannot train a classifier; the message says why."""


@dataclass
class Summary:
    """What the checks found, shown by the API as the dataset's record."""

    format: str
    text_column: str
    label_column: str
    rows: int
    labels: list[str]
    """Label names in label order: the label `i` of the normal form is `labels[i]`."""
    class_counts: list[int]
    duplicates: int
    """Rows dropped because their text came earlier in the file."""
    empty: int
    """Rows dropped because their text or label was missing or blank."""
    preview: list[dict[str, Any]] = field(default_factory=list)


def detect_format(name: str | None, media_type: str, head: bytes) -> str:
    """By the file name's suffix, else its media type, else its first bytes."""
    suffix = PurePosixPath(name or "").suffix.lower()
    if suffix in FORMATS:
        return FORMATS[suffix]
    if media_type in MEDIA_TYPES:
        return MEDIA_TYPES[media_type]
    if head.startswith(b"PAR1"):
        return "parquet"
    return "jsonl" if head.lstrip().startswith(b"{") else "csv"


def _encoding(path: Path) -> str:
    with path.open("rb") as handle:
        head = handle.read(4)
    return "utf-16" if head[:2] in UTF16_MARKS else "utf8"


def _csv(path: Path, fmt: str, columns: list[str] | None) -> pcsv.CSVStreamingReader:
    read = pcsv.ReadOptions(block_size=BLOCK_BYTES, encoding=_encoding(path), use_threads=False)
    parse = pcsv.ParseOptions(delimiter="\t" if fmt == "tsv" else ",", newlines_in_values=True)
    convert = pcsv.ConvertOptions(
        include_columns=columns, strings_can_be_null=True,
        column_types=dict.fromkeys(columns or [], pa.string()))
    # A plain file stream, not a memory map, whose pages would count as the process's memory.
    return pcsv.open_csv(pa.OSFile(str(path)), read_options=read, parse_options=parse,
                         convert_options=convert)


def _jsonl(path: Path, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
    """JSON lines read line by line (pyarrow's reader refuses a field that appears late), each
    value kept as text; with `columns=None`, one empty batch whose schema names the fields of
    the first object."""
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as handle:
        try:
            for _, row in json_objects(handle):
                if columns is None:
                    yield _strings(list(map(str, row)), [])
                    return
                rows.append({c: _text(row.get(c)) for c in columns})
                if len(rows) == BATCH_ROWS:
                    yield _strings(columns, rows)
                    rows = []
        except JsonLineError as exc:
            raise TableError(str(exc)) from None
    if columns is not None and rows:
        yield _strings(columns, rows)


def _strings(columns: list[str], rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, pa.schema([(c, pa.string()) for c in columns]))


def _text(value: Any) -> str | None:
    """A JSON value as the text a CSV would hold: objects and lists as JSON, booleans in
    lower case."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def batches(path: Path, fmt: str, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """The file's rows a batch at a time, `columns` only (as strings), or every column."""
    try:
        if fmt == "parquet":
            parquet = pq.ParquetFile(path)
            if columns is None:
                yield pa.RecordBatch.from_pylist([], parquet.schema_arrow)
                return
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns):
                yield pa.RecordBatch.from_arrays(
                    [pc.cast(batch.column(c), pa.string()) for c in columns], names=columns)
        elif fmt == "jsonl":
            yield from _jsonl(path, columns)
        else:
            with _csv(path, fmt, columns) as reader:
                if columns is None:
                    yield pa.RecordBatch.from_pylist([], reader.schema)
                    return
                yield from reader
    except UnicodeDecodeError:
        raise TableError(NOT_UTF8) from None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "UTF8" in message:  # pyarrow's CSV reader: "invalid UTF8 data"
            raise TableError(NOT_UTF8) from None
        raise TableError(f"not a readable {fmt.upper()} table ({message})") from None


def choose_columns(path: Path, fmt: str, text: str | None, label: str | None) -> tuple[str, str]:
    names = next(batches(path, fmt)).schema.names
    shown = ", ".join(names[:20]) or "none"

    def pick(given: str | None, candidates: tuple[str, ...], what: str) -> str:
        if given is not None:
            if given not in names:
                raise TableError(f"no {what} column '{given}' (columns: {shown})")
            return given
        lowered = {n.lower(): n for n in names}
        for candidate in candidates:
            if candidate in lowered:
                return lowered[candidate]
        raise TableError(f"no {what} column: name it with `{what}_column` (columns: {shown}; "
                         f"looked for {', '.join(candidates)})")

    chosen = pick(text, TEXT_COLUMNS, "text"), pick(label, LABEL_COLUMNS, "label")
    if chosen[0] == chosen[1]:
        raise TableError(f"the text and label columns are both '{chosen[0]}'")
    return chosen


def _usable(batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array, int]:
    """The batch's texts and trimmed labels where both are present and not blank, and how
    many rows were not."""
    texts, labels = batch.column(0), pc.utf8_trim_whitespace(batch.column(1))
    blank = pc.or_kleene(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(texts)), 0),
                         pc.equal(pc.utf8_length(labels), 0))
    keep = pc.fill_null(pc.invert(blank), False)
    return pc.filter(texts, keep), pc.filter(labels, keep), len(batch) - pc.sum(keep).as_py()


def _ordered(names: list[str]) -> list[str]:
    """Integers by value, sentiment words negative first, anything else alphabetically."""
    if all(INTEGER.match(n) for n in names):
        return sorted(names, key=int)
    lowered = [n.lower() for n in names]
    if all(n in SENTIMENT_WORDS for n in lowered) and len(
            {SENTIMENT_WORDS[n] for n in lowered}) == len(names):
        return sorted(names, key=lambda n: SENTIMENT_WORDS[n.lower()])
    return sorted(names)


def normalise(path: Path, fmt: str, text: str, label: str, target: Path) -> Summary:
    """Check the table in `path` (its `text` and `label` columns, from choose_columns) and
    write its usable, first-seen rows to `target` (Parquet: `text`, `label` as 0 to
    classes - 1)."""
    columns = [text, label]
    # One growing buffer each, not an array a batch: thousands of small arrays kept among the
    # batches' freed memory held several times their size.
    hashes, codes = array("Q"), array("B")
    seen: dict[str, int] = {}
    empty = 0
    for batch in batches(path, fmt, columns):
        texts, labels, blank = _usable(batch)
        empty += blank
        for value in pc.unique(labels).to_pylist():
            if value not in seen:
                seen[value] = len(seen)
                if len(seen) > MAX_CLASSES:
                    raise TableError(f"label column '{columns[1]}' has more than {MAX_CLASSES} "
                                     "distinct values: is it a label?")
        # Hashed one by one: categorizing first (the default) pays for a table of texts that
        # are nearly all distinct.
        hashed = pd.util.hash_array(texts.to_numpy(zero_copy_only=False), categorize=False)
        hashes.frombytes(hashed.tobytes())
        lookup = pa.array(list(seen))
        codes.frombytes(pc.index_in(labels, value_set=lookup).to_numpy().astype(np.uint8).tobytes())
    every_code = np.frombuffer(codes, np.uint8)
    # A hash set (pandas' duplicated), not a sort: no copies of the hashes beside them.
    first = ~pd.Series(np.frombuffer(hashes, np.uint64), copy=False).duplicated().to_numpy()
    del hashes
    pa.default_memory_pool().release_unused()  # the first pass's blocks, for the second
    present = set(np.unique(every_code[first]).tolist())
    names = _ordered([name for name, code in seen.items() if code in present])
    if len(names) < 2:
        raise TableError(f"label column '{columns[1]}' has {len(names)} class"
                         f"{'' if len(names) == 1 else 'es'} ({', '.join(names) or 'no labels'}): "
                         "a classifier needs at least 2")
    rows = int(first.sum())
    if rows < MIN_ROWS:
        raise TableError(f"{rows} usable rows (after dropping {empty} empty and "
                         f"{len(first) - rows} duplicate ones): at least {MIN_ROWS} are needed")
    final = np.full(len(seen), -1, dtype=np.int64)
    for order, name in enumerate(names):
        final[seen[name]] = order
    counts = np.bincount(final[every_code[first]], minlength=len(names))
    preview = _write(path, fmt, columns, first, every_code, final, target)
    pa.default_memory_pool().release_unused()  # the readers' blocks, back to the system
    return Summary(fmt, columns[0], columns[1], rows, names, [int(c) for c in counts],
                   len(first) - rows, empty,
                   [{TEXT: row[TEXT], LABEL: names[row[LABEL]]} for row in preview])


def _write(path: Path, fmt: str, columns: list[str], first: np.ndarray, every_code: np.ndarray,
           final: np.ndarray, target: Path) -> list[dict[str, Any]]:
    """Second pass: the first-seen usable rows to `target`; the first few as a preview."""
    schema = pa.schema([(TEXT, pa.string()), (LABEL, pa.int64())])
    preview: list[dict[str, Any]] = []
    pending: list[pa.RecordBatch] = []
    pending_bytes = start = 0
    # No dictionary for the texts, nearly all distinct: it would be built and dropped.
    with pq.ParquetWriter(target, schema, use_dictionary=[LABEL]) as writer:
        for batch in batches(path, fmt, columns):
            texts, _, _ = _usable(batch)
            end = start + len(texts)
            keep = first[start:end]
            labels = final[every_code[start:end][keep]]
            kept = pa.RecordBatch.from_arrays([pc.filter(texts, pa.array(keep)),
                                               pa.array(labels)], schema=schema)
            pending.append(kept)
            pending_bytes += kept.nbytes
            if pending_bytes >= ROW_GROUP_BYTES:
                writer.write_table(pa.Table.from_batches(pending))
                pending, pending_bytes = [], 0
                # Else the allocator keeps the freed row groups' pages: about twice the peak.
                pa.default_memory_pool().release_unused()
            for row in kept.slice(0, PREVIEW_ROWS - len(preview)).to_pylist():
                preview.append({TEXT: row[TEXT][:PREVIEW_CHARS], LABEL: row[LABEL]})
            start = end
        if pending:
            writer.write_table(pa.Table.from_batches(pending, schema))
    return preview


SNIFF_BYTES = 8192
"""How much of a file's start decides its format, where its name and media type do not."""


def keep(path: Path, sha256: str, name: str | None, media_type: str, text: str | None,
         label: str | None, inputs: Path) -> tuple[dict[str, Any], bool]:
    """Check the file at `path` and keep its normal form under `inputs`, unless the same bytes
    read with the same columns are kept already: (the dataset's record, as dataset.json holds
    it; whether it is new). The record lacks `created_at`, which its reader adds. The same
    dataset is kept once, whoever keeps it first (an upload, an import)."""
    size = path.stat().st_size
    if size == 0:
        raise TableError("the file is empty")
    with path.open("rb") as handle:
        head = handle.read(SNIFF_BYTES)
    fmt = detect_format(name, media_type, head)
    if fmt != "parquet" and head[:2] not in UTF16_MARKS and b"\0" in head:  # UTF-16 has NULs
        raise TableError(f"not a table: the file is binary, not {fmt.upper()} text (upload "
                         "CSV, TSV, JSONL or Parquet)")
    text, label = choose_columns(path, fmt, text, label)
    key = f"{sha256}\0{fmt}\0{text}\0{label}".encode()
    dataset_id = "ds-" + hashlib.sha256(key).hexdigest()[:16]
    target = dataset_dir(inputs, dataset_id)
    if (target / META_FILE).is_file():
        kept: dict[str, Any] = json.loads((target / META_FILE).read_text())
        return kept, False
    staging = path.parent / f"{path.name}.d"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        summary = normalise(path, fmt, text, label, staging / DATA_FILE)
        record = {"id": dataset_id, "name": name or dataset_id, "upload_bytes": size,
                  "sha256": sha256, "size_bytes": (staging / DATA_FILE).stat().st_size,
                  **asdict(summary)}
        (staging / META_FILE).write_text(json.dumps(record, indent=2))
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            staging.rename(target)
        except OSError:  # the same file, kept first by another upload or import: theirs stands
            if not (target / META_FILE).is_file():
                raise
            return json.loads((target / META_FILE).read_text()), False
        return record, True
    finally:
        shutil.rmtree(staging, ignore_errors=True)
