"""Tiny models and datasets built in tmp_path: real transformers objects, well under a second."""

from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path
from typing import Any

from trainer.contract.records import Completed, Evaluation, Metric, RecordData
from trainer.contract.spec import JobSpec

POSITIVE = ["good", "great", "fun", "moving", "brilliant", "warm", "superb", "clever"]
NEGATIVE = ["bad", "dull", "boring", "awful", "weak", "tedious", "clumsy", "flat"]
NEUTRAL = ["the", "a", "film", "movie", "plot", "actors", "story", "was", "is", "and", "very",
           "this", "with", "its", "cast", "script"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_spec(**overrides: Any) -> dict[str, Any]:
    """A job spec, as the API takes it, for the tiny model on the reviews CSV (`tiny` and
    `reviews.csv` in the inputs_dir fixture) at a learning rate at which it learns in a few
    steps; every field not named here or in `overrides` keeps the contract's default."""
    return {"model": "tiny", "dataset": "reviews.csv", "batch_size": 8, "learning_rate": 0.003,
            **overrides}


def make_tiny_model(directory: Path, dropout: float = 0.1, seed: int = 0,
                    vocab_size: int | None = None) -> Path:
    """A 2-layer BERT with a handwritten vocabulary, saved with save_pretrained.

    `vocab_size` larger than the vocabulary adds unused embedding rows: a bigger checkpoint.
    """
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    vocab = directory / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + POSITIVE + NEGATIVE + NEUTRAL) + "\n")
    # transformers 5 ignores vocab_file in the constructor; from_pretrained(dir) reads it.
    tokenizer = BertTokenizer.from_pretrained(directory)
    # Head size 32: CUDA's bf16 SDPA kernels were seen not to learn with a head size of 16.
    words = len(SPECIAL + POSITIVE + NEGATIVE + NEUTRAL)
    config = BertConfig(vocab_size=max(words, vocab_size or 0), hidden_size=64,
                        num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                        max_position_embeddings=128, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def review(rng: random.Random, positive: bool) -> str:
    words = rng.sample(NEUTRAL, 4) + rng.sample(POSITIVE if positive else NEGATIVE, 2)
    rng.shuffle(words)
    return " ".join(words)


def make_reviews_csv(path: Path, rows: int = 200, seed: int = 0) -> Path:
    """A learnable two-class dataset: each text holds two words of its class."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        for index in range(rows):
            positive = index % 2 == 0
            writer.writerow([review(rng, positive), "positive" if positive else "negative"])
    return path


def make_uploaded_dataset(inputs_dir: Path, dataset_id: str = "ds-0123456789abcdef",
                          rows: int = 300, seed: int = 0) -> str:
    """An uploaded dataset as the API leaves it (trainer.contract.datasets): three learnable
    classes, `negative` (two negative words), `neutral` (none) and `positive` (two positive)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainer.contract.datasets import DATA_FILE, META_FILE, dataset_dir

    rng = random.Random(seed)
    labels = ["negative", "neutral", "positive"]
    texts, codes = [], []
    for index in range(rows):
        code = index % 3
        words = rng.sample(NEUTRAL, 6) if code == 1 else rng.sample(NEUTRAL, 4) + rng.sample(
            POSITIVE if code == 2 else NEGATIVE, 2)
        rng.shuffle(words)
        texts.append(" ".join(words))
        codes.append(code)
    directory = dataset_dir(inputs_dir, dataset_id)
    directory.mkdir(parents=True)
    pq.write_table(pa.table({"text": texts, "label": pa.array(codes, pa.int64())}),
                   directory / DATA_FILE)
    (directory / META_FILE).write_text(json.dumps({"id": dataset_id, "labels": labels}))
    return dataset_id


UNKNOWN_WORD = "zyzzyva"
"""A word outside the tiny vocabulary: it tokenizes to [UNK]."""


def make_poisoned_model(directory: Path) -> Path:
    """The tiny model with an infinite [UNK] embedding: the loss of any batch that holds a word
    outside its vocabulary is NaN (a corrupt weight that only some data reaches)."""
    from safetensors.torch import load_file, save_file

    make_tiny_model(directory)
    weights = load_file(directory / "model.safetensors")
    weights["bert.embeddings.word_embeddings.weight"][SPECIAL.index("[UNK]")] = float("inf")
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def make_poisoned_csv(path: Path, rows: int = 200, at: int = 3) -> Path:
    """make_reviews_csv's dataset with UNKNOWN_WORD in its row `at` (counted from 0). With the
    spec's default seed, row 3 of 200 lands in the training split, and not in the first 16 of
    any of the first three epochs' sample order (not in a live job's first step, in which the
    second replica only syncs the first one's weights)."""
    make_reviews_csv(path, rows)
    lines = path.read_text().splitlines()
    text, label = lines[at + 1].rsplit(",", 1)
    lines[at + 1] = f"{text} {UNKNOWN_WORD},{label}"
    path.write_text("\n".join(lines) + "\n")
    return path


def poisoned_steps(spec: JobSpec, inputs_dir: Path, epochs: int,
                   participants: int = 1) -> list[int]:
    """The steps whose window holds the training text with UNKNOWN_WORD: the spec's global
    batch a step, or (an elastic batch) `batch_size` for each of `participants`."""
    import numpy as np

    from trainer.data import load_source, make_splits
    from trainer.sampler import GlobalSampler

    train = make_splits(load_source(spec, inputs_dir, None), spec).train
    poisoned = [i for i, text in enumerate(train.texts) if UNKNOWN_WORD in text]
    assert len(poisoned) == 1, "the poisoned row must land in the training split"
    sampler = GlobalSampler(len(train), spec.batch_size, spec.seed)
    window = (spec.global_batch_size or 0 if spec.constant_batch
              else spec.batch_size * participants)
    per_epoch = math.ceil(len(train) / window)
    return [epoch * per_epoch + 1 + int(np.flatnonzero(sampler.order(epoch) == poisoned[0])[0])
            // window for epoch in range(epochs)]


def record(seq: int, data: RecordData, time: float | None = None) -> dict:
    """A report record as pods send it, built from the contract's typed data."""
    return {"seq": seq, "kind": data.KIND, "time": 1_700_000_000.0 + seq if time is None else time,
            "data": data.model_dump(mode="json")}


def metric_data(step: int, **fields: object) -> Metric:
    values: dict[str, object] = {"step": step, "epoch": 1, "loss": 0.5, "learning_rate": 1e-4,
                                 "samples_seen": step * 16, "samples_per_second": 32.0,
                                 "participants": 2, **fields}
    return Metric.model_validate(values)


def evaluation(split: str = "validation", **fields: object) -> Evaluation:
    values: dict[str, object] = {"split": split, "accuracy": 0.8, "f1": 0.81, "loss": 0.4,
                                 "samples": 100, "epoch": 1, "step": 10, **fields}
    return Evaluation.model_validate(values)


def completed(model_dir: str | None = "/somewhere/model", primary: bool = True) -> Completed:
    return Completed(message="done", step=10, model_dir=model_dir, metrics={},
                     checksum="0123456789abcdef", primary=primary)
