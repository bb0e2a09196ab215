"""Event sizes, a job's reported event bytes, and events by job and type.

`event.size` bounds pages in bytes (existing rows get the size of their stored JSON);
`job.event_bytes` counts what a job's reports stored, against its quota (existing jobs start at
0); `ix_event_job_id_type` lets the reconciler find a job's completions without reading the rest.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("event", sa.Column("size", sa.Integer(), server_default="0", nullable=False))
    op.add_column("job", sa.Column("event_bytes", sa.Integer(), server_default="0",
                                   nullable=False))
    stored = ("octet_length(data::text)" if op.get_bind().dialect.name == "postgresql"
              else "length(CAST(data AS BLOB))")
    op.execute(f"UPDATE event SET size = {stored}")
    op.create_index("ix_event_job_id_type", "event", ["job_id", "type"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_event_job_id_type", table_name="event")
    with op.batch_alter_table("job") as job:
        job.drop_column("event_bytes")
    with op.batch_alter_table("event") as event:
        event.drop_column("size")
