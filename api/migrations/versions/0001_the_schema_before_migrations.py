"""The schema before migrations: what `create_all` made of the models until then.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column(
            "status",
            sa.Enum(
                "pending",
                "starting",
                "running",
                "degraded",
                "succeeded",
                "failed",
                "cancelled",
                name="jobstatus",
            ),
            nullable=False,
        ),
        sa.Column("reason", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("report_token_hash", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("samples_seen", sa.Integer(), nullable=False),
        sa.Column("total_samples", sa.Integer(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("completed_model_dir", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("model_id", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_job_status"), "job", ["status"], unique=False)

    op.create_table(
        "model",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("path", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("base_model", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("dataset", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_model_job_id"), "model", ["job_id"], unique=False)

    op.create_table(
        "event",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("type", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["job.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_event_job_id"), "event", ["job_id"], unique=False)

    op.create_table(
        "incarnation",
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("pod", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("incarnation", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["job.id"],
        ),
        sa.PrimaryKeyConstraint("job_id", "pod", "incarnation"),
    )
    op.create_table(
        "migration",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("status", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("requested_at", sa.Float(), nullable=False),
        sa.Column("step_at_request", sa.Integer(), nullable=False),
        sa.Column("old_incarnation", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("new_incarnation", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("node_from", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("node_to", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("steps_lost", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["job.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_migration_job_id"), "migration", ["job_id"], unique=False)

    op.create_table(
        "pod",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("phase", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("last_heartbeat", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["job.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "ordinal"),
    )
    op.create_index(op.f("ix_pod_job_id"), "pod", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_pod_job_id"), table_name="pod")
    op.drop_table("pod")
    op.drop_index(op.f("ix_migration_job_id"), table_name="migration")
    op.drop_table("migration")
    op.drop_table("incarnation")
    op.drop_index(op.f("ix_event_job_id"), table_name="event")
    op.drop_table("event")
    op.drop_index(op.f("ix_model_job_id"), table_name="model")
    op.drop_table("model")
    op.drop_index(op.f("ix_job_status"), table_name="job")
    op.drop_table("job")
