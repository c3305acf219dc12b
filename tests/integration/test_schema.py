"""The migrations create exactly the tables that beat/tables.py describes."""

from __future__ import annotations

from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from beat.schema import head_revision
from beat.store import Store
from beat.tables import VERSION_TABLE, metadata

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
