"""The model registry: register a succeeded job's export, list, resolve paths, predict."""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, select

from api.errors import NotFound
from api.models import Job, Model, ModelPublic, ModelsPublic, Prediction
from api.services.archive import directory_size
from api.settings import Settings
from trainer.contract.checkpoints import ADAPTER_DIR

logger = logging.getLogger(__name__)


def register_model(session: Session, settings: Settings, job: Job, model_dir: Path) -> Model:
    """Register the export in `model_dir` (inside the data dir) for `job`; idempotent."""
    model_id = "model-" + job.id.removeprefix("job-")
    existing = session.get(Model, model_id)
    if existing is not None:
        return existing
    metrics: dict[str, Any] = {}
    metrics_file = model_dir / "metrics.json"
    if metrics_file.is_file():
        metrics = json.loads(metrics_file.read_text()).get("metrics", {})
    model = Model(id=model_id, job_id=job.id, name=job.name or job.id,
                  path=str(model_dir.resolve().relative_to(settings.data_dir.resolve())),
                  base_model=str(job.spec.get("model")), dataset=str(job.spec.get("dataset")),
                  metrics=metrics, size_bytes=directory_size(model_dir))
    session.add(model)
    job.model_id = model.id
    session.add(job)
    return model


def to_public(model: Model) -> ModelPublic:
    public = ModelPublic.model_validate(model)
    base = f"/api/v1/models/{model.id}"
    public.links = {"self": base, "download": f"{base}/download",
                    "download_link": f"{base}/download-link", "predict": f"{base}/predict",
                    "job": f"/api/v1/jobs/{model.job_id}"}
    return public


def list_models(session: Session) -> ModelsPublic:
    models = list(session.exec(select(Model).order_by(col(Model.created_at).desc())))
    return ModelsPublic(data=[to_public(m) for m in models], count=len(models))


def get_model(session: Session, model_id: str) -> Model:
    model = session.get(Model, model_id)
    if model is None:
        raise NotFound(f"model {model_id} not found")
    return model


def delete_model(session: Session, settings: Settings, model_id: str) -> None:
    """Unregister the model and delete its files (only inside the data dir); its job stays,
    without a model."""
    model = get_model(session, model_id)
    root = settings.data_dir.resolve()
    path = (root / model.path).resolve()
    job = session.get(Job, model.job_id)
    if job is not None and job.model_id == model.id:
        job.model_id = None
        session.add(job)
    session.delete(model)
    session.commit()
    if path.is_relative_to(settings.jobs_dir) and path != settings.jobs_dir:
        shutil.rmtree(path, ignore_errors=True)
    logger.info("model %s deleted", model_id)


def model_path(settings: Settings, model: Model) -> Path:
    root = settings.data_dir.resolve()
    path = (root / model.path).resolve()
    if not path.is_relative_to(root) or not (path / "config.json").is_file():
        raise NotFound(f"the files of model {model.id} are gone")
    return path


def adapter_path(path: Path, model: Model) -> Path:
    """The adapters a LoRA job exported beside its merged model (`path`)."""
    adapter = path / ADAPTER_DIR
    if not (adapter / "adapter_config.json").is_file():
        raise NotFound(f"model {model.id} has no adapter: only a LoRA job's model has one")
    return adapter


class Predictor:
    """Text-classification pipelines of recently used models (LRU, bounded)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pipelines: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def _pipeline(self, model_id: str, path: Path) -> Any:
        with self._lock:
            if model_id in self._pipelines:
                self._pipelines.move_to_end(model_id)
                return self._pipelines[model_id]
            from transformers import pipeline

            loaded = pipeline("text-classification", model=str(path), device="cpu")
            self._pipelines[model_id] = loaded
            while len(self._pipelines) > self.capacity:
                evicted, _ = self._pipelines.popitem(last=False)
                logger.info("evicted model %s from the prediction cache", evicted)
            return loaded

    def forget(self, model_id: str) -> None:
        with self._lock:
            self._pipelines.pop(model_id, None)

    def predict(self, model_id: str, path: Path, texts: list[str]) -> list[Prediction]:
        classify = self._pipeline(model_id, path)
        results = classify(texts, truncation=True, max_length=512, batch_size=16)
        return [Prediction(label=r["label"], score=float(r["score"])) for r in results]
