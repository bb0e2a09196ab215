"""Domain errors raised by services, mapped once to `{"error": ..., "detail": ...}` responses."""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from trainer.contract.artifact_store import UnlistableKey

logger = logging.getLogger(__name__)


class DomainError(Exception):
    status_code = 400
    error = "bad_request"

    def __init__(self, detail: Any) -> None:
        super().__init__(detail)
        self.detail = detail


class NotFound(DomainError):
    status_code, error = 404, "not_found"


class Conflict(DomainError):
    status_code, error = 409, "conflict"


class InvalidSpec(DomainError):
    """A value is well-formed but unusable (unknown dataset, path outside the inputs dir)."""

    status_code, error = 422, "invalid"

    def __init__(self, field: str, message: str) -> None:
        super().__init__([{"loc": ["body", field], "msg": message, "type": "value_error"}])


class Unauthorized(DomainError):
    status_code, error = 401, "unauthorized"


class Forbidden(DomainError):
    status_code, error = 403, "forbidden"


class PayloadTooLarge(DomainError):
    status_code, error = 413, "payload_too_large"


class QuotaExceeded(DomainError):
    status_code, error = 429, "quota_exceeded"


class BackendUnavailable(DomainError):
    status_code, error = 503, "backend_unavailable"


class NotSupported(DomainError):
    status_code, error = 501, "not_implemented"


class ErrorBody(BaseModel):
    """Every error response: a machine-readable `error` and a `detail` for people."""

    error: str
    """`unauthorized`, `forbidden`, `not_found`, `conflict`, `invalid`, `payload_too_large`,
    `quota_exceeded`, `backend_unavailable`, ..."""
    detail: Any
    """A message; for `invalid`, a list of `{loc, msg, type}`, `loc` naming the field."""


MEANINGS = {
    400: "The request cannot be read",
    401: "No token was sent",
    403: "The token is not valid here",
    404: "No such resource",
    409: "The resource is in the wrong state for this",
    413: "The body is too large (one declared too large by its Content-Length is refused "
         "unread, by the framework, in plain text)",
    415: "The body is not of a media type this operation reads",
    422: "A value is invalid; `detail` names the field",
    429: "A quota is used up; `detail` says which",
    501: "The job's backend cannot do this",
    503: "The backend (supervisor or Kubernetes) could not carry it out",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses an operation can answer."""
    responses: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorBody, "description": MEANINGS[code]} for code in codes}
    if 413 in responses:
        responses[413]["content"] = {"text/plain": {"schema": {"type": "string"}}}
    return responses


Model = TypeVar("Model", bound=BaseModel)


def parse_body(model: type[Model], body: bytes) -> Model:
    """A request body validated as `model` (JSON), or the 422 FastAPI would have answered."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise RequestValidationError([{**error, "loc": ("body", *error["loc"])}
                                      for error in exc.errors()]) from None


def documented_body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI's entry for a body a route parses itself with `parse_body` (see
    `document_schemas` for the model's schema)."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def document_schemas(app: FastAPI, *models: type[BaseModel]) -> None:
    """Add the schemas of bodies parsed with `parse_body` to the app's OpenAPI components."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                found = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(found.pop("$defs", {}))
                components[model.__name__] = found
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _body(error: str, detail: Any) -> dict[str, Any]:
    return {"error": error, "detail": detail}


def add_exception_handlers(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def domain_error(_request: Request, exc: DomainError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
        return JSONResponse(_body(exc.error, exc.detail), exc.status_code, headers=headers)

    @app.exception_handler(UnlistableKey)
    async def unlistable(_request: Request, exc: UnlistableKey) -> JSONResponse:
        # What a pod wrote in its job's prefix: the job's artifacts cannot be read, nothing broke.
        return JSONResponse(_body(Conflict.error, str(exc)), Conflict.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""),
                   "type": e.get("type", "")} for e in exc.errors()]
        return JSONResponse(_body("invalid", detail), 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        names = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
        return JSONResponse(_body(names.get(exc.status_code, "http_error"), exc.detail),
                            exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, _exc: ClientDisconnect) -> Response:
        # A pod killed while it sent a report, say: nobody waits for an answer, nothing broke.
        logger.info("%s %s: the client went away before its request was read", request.method,
                    request.url.path)
        return Response(status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return JSONResponse(_body("internal", "internal error; see the server log"), 500)
