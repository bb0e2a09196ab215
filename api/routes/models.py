"""Trained models: list, read, predict, and signed links to download one."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from api.auth import AdminRoute
from api.deps import LinkSignerDep, PredictorDep, SessionDep, SettingsDep
from api.errors import error_responses
from api.models import DownloadLink, ModelPublic, ModelsPublic, PredictRequest, PredictResponse
from api.routes import API_PREFIX
from api.routes.downloads import Format
from api.services import registry
from api.services.links import signed_link

router = APIRouter(prefix=API_PREFIX + "/models", tags=["models"],
                   route_class=AdminRoute, responses=error_responses(401, 403, 422))


@router.get("", response_model=ModelsPublic)
def list_models(session: SessionDep) -> ModelsPublic:
    return registry.list_models(session)


@router.get("/{model_id}", response_model=ModelPublic, responses=error_responses(404))
def get_model(model_id: str, session: SessionDep) -> ModelPublic:
    return registry.to_public(registry.get_model(session, model_id))


@router.delete("/{model_id}", status_code=status.HTTP_204_NO_CONTENT,
               responses=error_responses(404))
def delete_model(model_id: str, session: SessionDep, settings: SettingsDep,
                 predictor: PredictorDep) -> Response:
    """Unregister the model and delete its files; its job's record stays."""
    registry.delete_model(session, settings, model_id)
    predictor.forget(model_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{model_id}/download-link", response_model=DownloadLink,
             responses=error_responses(404, 409, 413))
def model_link(model_id: str, request: Request, session: SessionDep, settings: SettingsDep,
               signer: LinkSignerDep, format: Format = "model") -> DownloadLink:
    """A URL that downloads the model (or a LoRA job's adapter) without a token, for a few
    minutes."""
    model = registry.get_model(session, model_id)
    path = registry.model_path(settings, model)
    if format == "adapter":
        registry.adapter_path(path, model)
    link = signed_link(signer, request.app.url_path_for("download_model", model_id=model.id))
    return link if format == "model" else link.model_copy(
        update={"url": f"{link.url}&format={format}"})


@router.post("/{model_id}/predict", response_model=PredictResponse,
             responses=error_responses(404, 409, 413, 422))
def predict(model_id: str, body: PredictRequest, session: SessionDep, settings: SettingsDep,
            predictor: PredictorDep) -> PredictResponse:
    model = registry.get_model(session, model_id)
    predictions = predictor.predict(model.id, registry.model_path(settings, model), body.texts)
    return PredictResponse(model_id=model.id, predictions=predictions)
