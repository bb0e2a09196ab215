"""Uploaded datasets (api.asset_models.Dataset).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    text = sqlmodel.sql.sqltypes.AutoString
    op.create_table(
        "dataset",
        sa.Column("id", text(), nullable=False),
        sa.Column("name", text(), nullable=False),
        sa.Column("format", text(), nullable=False),
        sa.Column("text_column", text(), nullable=False),
        sa.Column("label_column", text(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=True),
        sa.Column("class_counts", sa.JSON(), nullable=True),
        sa.Column("duplicates", sa.Integer(), nullable=False),
        sa.Column("empty", sa.Integer(), nullable=False),
        sa.Column("preview", sa.JSON(), nullable=True),
        sa.Column("upload_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("dataset")
