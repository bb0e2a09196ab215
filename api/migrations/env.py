"""Alembic's environment: migrations run on the connection `api.migrations.upgrade` hands over
(the API's own engine), against the tables of `api.models`."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import api.asset_models  # registers the tables, as the next line does
import api.models  # noqa: F401

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=SQLModel.metadata,
                  # SQLite alters a table by copying it: batch mode writes that for us.
                  render_as_batch=connection.dialect.name == "sqlite",
                  compare_type=True)
with context.begin_transaction():
    context.run_migrations()
