"""Stagings for jobs (api.asset_models.Staging: hub repositories, tokenized splits, imported
dataset files), and the job status `preparing`.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":  # SQLite keeps enums as plain strings
        op.execute("ALTER TYPE jobstatus ADD VALUE IF NOT EXISTS 'preparing' BEFORE 'starting'")
    text = sqlmodel.sql.sqltypes.AutoString
    op.create_table(
        "staging",
        sa.Column("id", text(), nullable=False),
        sa.Column("kind", text(), nullable=False),
        sa.Column("repo_id", text(), nullable=False),
        sa.Column("revision", text(), nullable=False),
        sa.Column("status", sa.Enum("running", "succeeded", "failed", name="stagingstatus"),
                  nullable=False),
        sa.Column("commit", text(), nullable=True),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("bytes_done", sa.BigInteger(), nullable=False),
        sa.Column("bytes_total", sa.BigInteger(), nullable=True),
        sa.Column("error", text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=True),
        sa.Column("dataset_id", text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("staging")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TYPE stagingstatus")
