"""Alembic environment: runs on the connection handed over by ``beat.store.schema``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from beat.store.tables import VERSION_TABLE, metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:  # plain `alembic` command line, given sqlalchemy.url
    engine = create_engine(context.config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as conn:
        _run(conn)
