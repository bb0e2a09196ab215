"""Trainer -> API reports, authenticated with the job's own report token."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from pydantic import ValidationError

from api.deps import SettingsDep, TokenDep
from api.errors import InvalidSpec, PayloadTooLarge
from api.metrics import REPORTS_INGESTED
from api.models import ReportAccepted, ReportBatch
from api.routes import API_PREFIX
from api.services.reports import ReportWriter

router = APIRouter(prefix=API_PREFIX + "/jobs/{job_id}/reports", tags=["reports"])


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"report body over {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise PayloadTooLarge(f"report body over {limit} bytes")
    return bytes(body)


@router.post("", response_model=ReportAccepted)
async def post_report(job_id: str, request: Request, token: TokenDep,
                      settings: SettingsDep) -> ReportAccepted:
    body = await _read_body(request, settings.max_report_bytes)
    try:
        batch = ReportBatch.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors()
        field = ".".join(str(part) for part in errors[0]["loc"]) if errors else "body"
        raise InvalidSpec(field or "body", errors[0]["msg"] if errors else "invalid") from None

    writer: ReportWriter = request.app.state.report_writer
    events, duplicates = await asyncio.wrap_future(writer.submit(job_id, token, batch))
    REPORTS_INGESTED.inc(len(events))
    return ReportAccepted(accepted=len(batch.records) - duplicates, duplicates=duplicates)
