"""LoRA fine-tuning in the trainer: only the adapters and the head train, are checkpointed and
resumed; the export is the merged model, with the adapters alone beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer.test_train import drop_checkpoints_after, records, run
from trainer import lora
from trainer.checkpoint import list_checkpoints, load_checkpoint
from trainer.config import JobSpec
from trainer.contract.checkpoints import ADAPTER_DIR
from trainer.contract.process import ExitCode
from trainer.model import load_model
from trainer.state import weights_checksum

HIDDEN, LAYERS, R = 64, 2, 8  # tests/factories.make_tiny_model's BERT


def test_only_the_adapters_and_the_head_train(inputs_dir: Path) -> None:
    spec = JobSpec(model="tiny", finetune="lora")
    model = lora.apply_lora(load_model(str(inputs_dir / "tiny"), seed=0), spec)
    # query and value of each layer: A (r x in) and B (out x r); the head: weight and bias.
    adapters = LAYERS * 2 * (R * HIDDEN + HIDDEN * R)
    head = HIDDEN * 2 + 2
    trainable, total = lora.trainable_parameters(model)
    assert trainable == adapters + head
    assert total > 15 * trainable
    names = set(lora.trainable_state(model))
    assert all("lora_" in name or "classifier" in name for name in names)
    assert spec.learning_rate == 2e-3  # LoRA's own default
    assert JobSpec(finetune="lora", learning_rate=1e-3).learning_rate == 1e-3


def test_an_unknown_target_module_is_refused(inputs_dir: Path) -> None:
    model = load_model(str(inputs_dir / "tiny"), seed=0)
    spec = JobSpec(model="tiny", finetune="lora", lora={"target_modules": ["query", "qkv"]})
    with pytest.raises(lora.LoraError, match="target_modules: 'qkv' not in the model"):
        lora.apply_lora(model, spec)


def test_a_lora_checkpoint_holds_only_the_trainable_state_and_resumes(make_config,
                                                                      tmp_path: Path) -> None:
    config = make_config(finetune="lora", learning_rate=1e-2, epochs=2,
                         checkpoint_every_steps=5, keep_checkpoints=10)
    full = run(config, tmp_path / "full.jsonl")
    checkpoints = list_checkpoints(config.runtime.checkpoint_dir)
    model_state, trainer_state, meta = load_checkpoint(checkpoints[0].path)
    assert set(model_state) == set(lora.trainable_state(full.model))
    assert (meta["finetune"], meta["base_model"]) == ("lora", "tiny")
    optimized = sum(len(group["params"]) for group in trainer_state["optimizer"]["param_groups"])
    assert optimized == len(model_state)  # AdamW's state covers the trainable tensors only
    whole = sum(v.numel() for v in full.model.state_dict().values())
    assert sum(v.numel() for v in model_state.values()) < whole / 15

    # Resumed mid-epoch from step 5, it ends where the uninterrupted run did.
    drop_checkpoints_after(config.runtime.checkpoint_dir, 5)
    resumed = run(config, tmp_path / "resumed.jsonl")
    assert resumed.resumed_from is not None and resumed.resumed_from.step == 5
    assert weights_checksum(resumed.model) == weights_checksum(full.model)


def test_the_export_is_the_merged_model_and_the_adapter_loads_with_peft(
        make_config, tmp_path: Path, inputs_dir: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    config = make_config(finetune="lora", learning_rate=3e-2, epochs=5)
    trainer = run(config, tmp_path / "reports.jsonl")
    assert trainer.metrics["test"]["accuracy"] >= 0.9
    model_dir = config.runtime.model_dir
    merged = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    assert not any("lora" in key for key in merged.state_dict())
    classify = pipeline("text-classification", model=str(model_dir))
    assert classify("a brilliant and warm film")[0]["label"] == "positive"
    assert classify("a dull and tedious plot")[0]["label"] == "negative"

    base = AutoModelForSequenceClassification.from_pretrained(inputs_dir / "tiny", num_labels=2)
    adapted = PeftModel.from_pretrained(base, model_dir / ADAPTER_DIR).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batch = tokenizer(["a brilliant and warm film", "a dull and tedious plot"],
                      padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(adapted(**batch).logits, merged(**batch).logits,
                                   atol=1e-5, rtol=0)
    card = (model_dir / "README.md").read_text()
    assert "adapters merged in" in card and "r 8, alpha 16" in card
    spec = json.loads((model_dir / "metrics.json").read_text())["spec"]
    assert spec["finetune"] == "lora"
    started = [e["data"] for e in records(tmp_path / "reports.jsonl", "event")
               if e["data"]["type"] == "started"]
    assert started[0]["parameters"]["trainable"] == LAYERS * 2 * 2 * R * HIDDEN + HIDDEN * 2 + 2


def test_gradient_checkpointing_trains_the_same_weights(make_config, tmp_path: Path) -> None:
    """Activations recomputed in the backward pass give the same gradients (the same dropout
    masks too: the recomputation replays the RNG state)."""
    runs = []
    for checkpointing in (False, True):
        config = make_config(finetune="lora", epochs=1, gradient_checkpointing=checkpointing)
        config.runtime.checkpoint_dir = tmp_path / f"checkpoints-{checkpointing}"
        config.runtime.model_dir = tmp_path / f"model-{checkpointing}"
        trainer = run(config, tmp_path / f"reports-{checkpointing}.jsonl")
        runs.append((trainer, records(tmp_path / f"reports-{checkpointing}.jsonl", "metric")))
    (plain, plain_steps), (recomputed, recomputed_steps) = runs
    assert getattr(recomputed.model, "is_gradient_checkpointing", False)
    assert [m["data"]["loss"] for m in recomputed_steps] == pytest.approx(
        [m["data"]["loss"] for m in plain_steps], abs=1e-5)
    for (name, a), (_, b) in zip(plain.model.named_parameters(),
                                 recomputed.model.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)


def test_an_8bit_base_needs_cuda(make_config, tmp_path: Path, inputs_dir: Path) -> None:
    config = make_config(finetune="lora", quantization="8bit")
    with pytest.raises(lora.LoraError, match="needs CUDA and bitsandbytes, and this pod runs "
                                             "on cpu"):
        lora.check_quantization(config.spec, torch.device("cpu"))
    # The pod process, handed one anyway: exit 2 naming the field, before loading anything.
    finished = subprocess.run(
        [sys.executable, "-m", "trainer", "--model", "tiny", "--dataset", "reviews.csv",
         "--finetune", "lora", "--quantization", "8bit", "--inputs-dir", str(inputs_dir),
         "--cache-dir", str(tmp_path / "cache"), "--checkpoint-dir", str(tmp_path / "ckpt"),
         "--model-dir", str(tmp_path / "model")],
        capture_output=True, text=True, timeout=120, check=False)
    assert finished.returncode == ExitCode.BAD_INPUT, finished.stderr
    assert "quantization: an 8-bit base model needs CUDA" in finished.stderr
    assert not (tmp_path / "cache").exists()


def test_an_8bit_base_trains_only_the_adapters_and_exports_a_float_model(
        make_config, tmp_path: Path) -> None:
    """bitsandbytes' LLM.int8() on the CPU stands in for CUDA (the product refuses the CPU:
    it is slower there than float32): the same code path, with real int8 layers."""
    from bitsandbytes.nn import Linear8bitLt
    from transformers import AutoModelForSequenceClassification, pipeline

    config = make_config(finetune="lora", quantization="8bit", learning_rate=3e-2, epochs=5,
                         checkpoint_every_steps=5, keep_checkpoints=10)
    config.runtime.quantize_on_cpu = True
    trainer = run(config, tmp_path / "reports.jsonl")
    query = trainer.model.base_model.model.bert.encoder.layer[0].attention.self.query
    assert isinstance(query.base_layer, Linear8bitLt)
    assert query.base_layer.weight.dtype == torch.int8
    trainable = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name or "classifier" in name for name in trainable)
    assert trainer.metrics["test"]["accuracy"] >= 0.9

    # Checkpoints hold the float32 trainable state alone; the base is the model named in meta.
    model_state, _, meta = load_checkpoint(list_checkpoints(config.runtime.checkpoint_dir)[0].path)
    assert set(model_state) == trainable
    assert {value.dtype for value in model_state.values()} == {torch.float32}
    assert (meta["finetune"], meta["base_model"]) == ("lora", "tiny")

    # The export: the adapters merged into the float32 base, an ordinary model that predicts.
    model_dir = config.runtime.model_dir
    saved = json.loads((model_dir / "config.json").read_text())
    assert "quantization_config" not in saved
    merged = AutoModelForSequenceClassification.from_pretrained(model_dir)
    assert {value.dtype for value in merged.state_dict().values()} == {torch.float32}
    classify = pipeline("text-classification", model=str(model_dir))
    assert classify("a brilliant and warm film")[0]["label"] == "positive"
    assert classify("a dull and tedious plot")[0]["label"] == "negative"
    assert (model_dir / ADAPTER_DIR / "adapter_model.safetensors").is_file()
