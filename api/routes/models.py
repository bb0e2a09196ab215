"""Trained models: list, read, download, predict."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from api.deps import AdminDep, SessionDep, SettingsDep
from api.models import ModelPublic, ModelsPublic, PredictRequest, PredictResponse
from api.routes import API_PREFIX
from api.services import models as service
from api.services.archive import iter_tar_gz

router = APIRouter(prefix=API_PREFIX + "/models", tags=["models"],
                   dependencies=[AdminDep])


@router.get("", response_model=ModelsPublic)
def list_models(session: SessionDep) -> ModelsPublic:
    return service.list_models(session)


@router.get("/{model_id}", response_model=ModelPublic)
def get_model(model_id: str, session: SessionDep) -> ModelPublic:
    return service.to_public(service.get_model(session, model_id))


@router.get("/{model_id}/download", response_class=StreamingResponse)
def download_model(model_id: str, session: SessionDep, settings: SettingsDep,
                   ) -> StreamingResponse:
    model = service.get_model(session, model_id)
    path = service.model_path(settings, model)
    return StreamingResponse(
        iter_tar_gz(path, model.id), media_type="application/gzip",
        headers={"Content-Disposition": f'attachment; filename="{model.id}.tar.gz"'})


@router.post("/{model_id}/predict", response_model=PredictResponse)
def predict(model_id: str, body: PredictRequest, request: Request, session: SessionDep,
            settings: SettingsDep) -> PredictResponse:
    model = service.get_model(session, model_id)
    predictor: service.Predictor = request.app.state.predictor
    predictions = predictor.predict(model.id, service.model_path(settings, model), body.texts)
    return PredictResponse(model_id=model.id, predictions=predictions)
