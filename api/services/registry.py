"""The model registry: register a succeeded job's export, list, resolve paths, predict."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlmodel import Session, col, select
from upath import UPath

from api.errors import NotFound
from api.models import Job, Model, ModelPublic, ModelsPublic, Prediction
from api.services import artifacts
from api.services.archive import refuse_links
from api.services.artifacts import artifacts_dir, in_data_dir
from api.settings import Settings
from trainer.contract import artifact_store
from trainer.contract.checkpoints import ADAPTER_DIR, EXPORTED, METRICS_FILE, remove_export_staging

logger = logging.getLogger(__name__)


def register_model(session: Session, settings: Settings, job: Job,
                   model_dir: Path | UPath) -> Model:
    """Register the export in `model_dir` (inside the data dir, or the artifacts store: its
    URL is kept) for `job`; idempotent."""
    model_id = "model-" + job.id.removeprefix("job-")
    existing = session.get(Model, model_id)
    if existing is not None:
        return existing
    metrics: dict[str, Any] = {}
    if artifact_store.has_file(model_dir, METRICS_FILE):
        metrics = json.loads(artifact_store.read_file(model_dir, METRICS_FILE)).get("metrics", {})
    # `model_dir` is real up to the pods' part (api.services.artifacts): never resolved, so
    # that a link the pods put there is not registered as this job's model.
    model = Model(id=model_id, job_id=job.id, name=job.name or job.id,
                  path=(str(model_dir.relative_to(settings.data_dir.resolve()))
                        if isinstance(model_dir, Path) else str(model_dir)),
                  base_model=job.spec.model, dataset=job.spec.dataset,
                  metrics=metrics, size_bytes=_size(model_dir))
    session.add(model)
    job.model_id = model.id
    session.add(job)
    return model


def _size(model_dir: Path | UPath) -> int:
    try:
        return artifact_store.size(model_dir)
    except artifact_store.UnlistableKey as exc:  # registered all the same: downloads say why not
        logger.warning("%s", exc)
        return 0


def clear_export_staging(settings: Settings, job_id: str) -> list[str]:
    """Remove what the job's killed exports left staged next to its model: for a job whose
    workload is gone (a live pod killed while exporting leaves its staging to this, as its
    peers may export at the same time). `model_dir` follows the Kubernetes backend's own link
    to the volumes and no other (api.services.artifacts)."""
    return remove_export_staging(artifacts.model_dir(settings, job_id))


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
    path = _files(settings, model)
    job = session.get(Job, model.job_id)
    if job is not None and job.model_id == model.id:
        job.model_id = None
        session.add(job)
    session.delete(model)
    session.commit()
    if isinstance(path, UPath) or (path is not None and path.is_relative_to(settings.jobs_dir)
                                   and path != settings.jobs_dir):
        artifact_store.remove(path, first=EXPORTED)
    logger.info("model %s deleted", model_id)


def _files(settings: Settings, model: Model) -> Path | UPath | None:
    """Where the model's files are: in the data dir (a Kubernetes job's model is on a volume
    there), or under the artifacts store's root; None for a path that leads elsewhere (never
    followed)."""
    if urlsplit(model.path).scheme in artifact_store.PROTOCOLS:
        # The model's job's own prefix (a container's root reads with a "/" already).
        prefix = f"{str(artifacts_dir(settings, model.job_id)).rstrip('/')}/"
        inside = settings.artifacts_url and model.path.startswith(prefix)
        return artifact_store.location(model.path) if inside and ".." not in model.path else None
    return in_data_dir(settings, model.path)


def model_path(settings: Settings, model: Model) -> Path | UPath:
    """The model's files, for a download or predictions: 404 where they are gone, 409 where
    they hold a link (the store layer follows none, but a model loader would)."""
    path = _files(settings, model)
    if path is None or not artifact_store.has_file(path, EXPORTED):
        raise NotFound(f"the files of model {model.id} are gone")
    refuse_links(path, f"model {model.id}")
    return path


def adapter_path(path: Path | UPath, model: Model) -> Path | UPath:
    """The adapters a LoRA job exported beside its merged model (`path`)."""
    adapter = path / ADAPTER_DIR
    if not artifact_store.has_file(adapter, "adapter_config.json"):
        raise NotFound(f"model {model.id} has no adapter: only a LoRA job's model has one")
    return adapter


class Predictor:
    """Text-classification pipelines of recently used models (LRU, bounded). A model in an
    object store is downloaded to `cache_dir` first and its copy kept as long as its pipeline:
    at most `capacity` models on disk, as in memory."""

    def __init__(self, capacity: int, cache_dir: Path) -> None:
        self.capacity, self.cache_dir = capacity, cache_dir
        self._pipelines: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        shutil.rmtree(cache_dir, ignore_errors=True)  # copies of an earlier process

    def _pipeline(self, model_id: str, path: Path | UPath) -> Any:
        with self._lock:
            if model_id in self._pipelines:
                self._pipelines.move_to_end(model_id)
                return self._pipelines[model_id]
            from transformers import pipeline

            loaded = pipeline("text-classification", model=str(self._local(model_id, path)),
                              device="cpu")
            self._pipelines[model_id] = loaded
            while len(self._pipelines) > self.capacity:
                evicted, _ = self._pipelines.popitem(last=False)
                shutil.rmtree(self.cache_dir / evicted, ignore_errors=True)
                logger.info("evicted model %s from the prediction cache", evicted)
            return loaded

    def _local(self, model_id: str, path: Path | UPath) -> Path:
        if isinstance(path, Path):
            return path
        copy = self.cache_dir / model_id
        if not copy.is_dir():
            partial = self.cache_dir / f"{model_id}.tmp-{uuid.uuid4().hex[:8]}"
            logger.info("model %s: fetching %s for predictions", model_id, path)
            artifact_store.download(path, partial)
            partial.rename(copy)
        return copy

    def forget(self, model_id: str) -> None:
        with self._lock:
            self._pipelines.pop(model_id, None)
            shutil.rmtree(self.cache_dir / model_id, ignore_errors=True)

    def predict(self, model_id: str, path: Path | UPath, texts: list[str]) -> list[Prediction]:
        classify = self._pipeline(model_id, path)
        results = classify(texts, truncation=True, max_length=512, batch_size=16)
        return [Prediction(label=r["label"], score=float(r["score"])) for r in results]
