"""A job's early finish (POST /api/v1/jobs/{id}/finish): the epoch after which its pods end it,
as asked, then as they agreed (trainer.finish). None: all of its epochs.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job", sa.Column("finish_after_epoch", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job") as job:
        job.drop_column("finish_after_epoch")
