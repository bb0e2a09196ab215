"""Tiny models and datasets built in tmp_path: real transformers objects, well under a second."""

from __future__ import annotations

import csv
import random
from pathlib import Path

from trainer.contract.records import Completed, Evaluation, Metric, RecordData

POSITIVE = ["good", "great", "fun", "moving", "brilliant", "warm", "superb", "clever"]
NEGATIVE = ["bad", "dull", "boring", "awful", "weak", "tedious", "clumsy", "flat"]
NEUTRAL = ["the", "a", "film", "movie", "plot", "actors", "story", "was", "is", "and", "very",
           "this", "with", "its", "cast", "script"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


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
                        max_position_embeddings=64, hidden_dropout_prob=dropout,
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
