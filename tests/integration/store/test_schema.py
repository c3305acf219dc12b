"""The migrations create exactly the tables that beat/store/tables.py describes."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from psycopg import sql
from sqlalchemy.engine import make_url

from beat.store.all_roles import Store
from beat.store.schema import head_revision
from beat.store.tables import VERSION_TABLE, metadata
from tests.conftest import ADMIN_DATABASE_URL, SessionEnv

pytestmark = pytest.mark.integration


def only_our_tables(name: str | None, type_: str, parent_names: dict[str, Any]) -> bool:
    return type_ != "table" or name in metadata.tables


def test_migrations_match_the_table_definitions(store: Store) -> None:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE, "include_name": only_our_tables}
        )
        assert context.get_current_revision() == head_revision()
        differences = compare_metadata(context, metadata)
    assert differences == []


def test_a_database_name_is_quoted_not_read_as_sql(test_env: SessionEnv) -> None:
    """A name from DATABASE_URL with a quote in it names a database; it is not SQL."""
    name = f'habeat_test_{uuid.uuid4().hex[:8]}" TEMPLATE "template0'
    url = make_url(test_env.database_url).set(database=name)
    store = Store.connect(url.render_as_string(hide_password=False))
    admin = make_url(ADMIN_DATABASE_URL).set(drivername="postgresql")
    try:
        store.migrate()
        with psycopg.connect(admin.render_as_string(hide_password=False)) as conn:
            found = conn.execute(
                "SELECT count(*) FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
        assert found == (1,)
    finally:
        store.dispose()
        with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as c:
            c.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
