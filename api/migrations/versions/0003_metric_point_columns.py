"""A metric point's step, loss, samples/s and participants in columns of their own.

A job's chart series (`GET /api/v1/jobs/{id}/series`) reads them by (job, step) and never
parses the JSON of its history; existing metric points are copied into them.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS: dict[str, sa.types.TypeEngine[Any]] = {
    "step": sa.Integer(), "loss": sa.Float(), "rate": sa.Float(), "participants": sa.Integer()}
FIELDS = {"step": "step", "loss": "loss", "rate": "samples_per_second",
          "participants": "participants"}


def upgrade() -> None:
    for name, type_ in COLUMNS.items():
        op.add_column("event", sa.Column(name, type_, nullable=True))
    postgres = op.get_bind().dialect.name == "postgresql"
    casts = {"step": "integer", "participants": "integer", "loss": "double precision",
             "rate": "double precision"}
    if postgres:
        values = ", ".join(f"{column} = (data->>'{field}')::{casts[column]}"
                           for column, field in FIELDS.items())
        kind = "data->>'kind'"
    else:
        values = ", ".join(f"{column} = json_extract(data, '$.{field}')"
                           for column, field in FIELDS.items())
        kind = "json_extract(data, '$.kind')"
    op.execute(f"UPDATE event SET {values} WHERE type = 'metric' AND {kind} = 'metric'")
    op.create_index("ix_event_job_id_step", "event", ["job_id", "step"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_event_job_id_step", table_name="event")
    with op.batch_alter_table("event") as event:
        for name in reversed(COLUMNS):
            event.drop_column(name)
