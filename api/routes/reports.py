"""Trainer -> API reports, authenticated with the job's own report token."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from api.auth import ReportRoute
from api.errors import documented_body, error_responses, parse_body
from api.metrics import REPORTS_INGESTED
from api.routes import API_PREFIX
from api.services.reports import ReportWriter
from trainer.contract.records import ReportAccepted, ReportBatch

# The body limit (settings.max_report_bytes) is set where the app includes this router.
router = APIRouter(prefix=API_PREFIX + "/jobs/{job_id}/reports", tags=["reports"],
                   route_class=ReportRoute,
                   responses=error_responses(401, 403, 404, 413, 422, 429))


@router.post("", response_model=ReportAccepted, openapi_extra=documented_body(ReportBatch))
async def post_report(job_id: str, request: Request) -> ReportAccepted:
    """Store a pod's records (idempotent by pod, incarnation and seq); see trainer.contract.

    A 429 says the job's event quota is used up: the batch's records were taken (they moved the
    job's progress) but only its lifecycle events stored; sent again, they are duplicates."""
    # Parsed here by pydantic's JSON parser: about twice as fast as FastAPI's json.loads and
    # validation, on the busiest route of the API.
    batch = parse_body(ReportBatch, await request.body())
    # Read from app.state, not through a dependency: on this route FastAPI's dependency
    # resolution cost measurable throughput (bench/api_ingest, PostgreSQL).
    writer: ReportWriter = request.app.state.report_writer
    events, duplicates, finish = await asyncio.wrap_future(writer.submit(job_id, batch))
    REPORTS_INGESTED.inc(len(events))
    return ReportAccepted(accepted=len(batch.records) - duplicates, duplicates=duplicates,
                          finish_after_epoch=finish)
