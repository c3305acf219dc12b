"""PostgreSQL through PgBouncer in transaction mode, with real servers: a connection's
next transaction may run on another server backend, where the statements psycopg
prepared (from a statement's fifth execution) do not exist. The store then drops the
connection as a lost one and names the fix; with ``?prepare_threshold=none`` in the
URL nothing is prepared and nothing fails."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import text

from beat.errors import StoreUnavailable
from beat.store.db import StoreConnection, create_store_engine
from tests.conftest import SessionEnv
from tests.e2e.pgbouncer import PgBouncer, running_pgbouncer

pytestmark = pytest.mark.integration


@pytest.fixture
def bouncer(test_env: SessionEnv) -> Iterator[PgBouncer]:
    with running_pgbouncer(test_env.database_url, "transaction") as running:
        yield running


def run_on_another_backend_after_preparing(bouncer: PgBouncer, query: str) -> None:
    """Prepare a statement on the backend PgBouncer gives the store's one connection,
    hold that backend from another client, then run the statement again."""
    store = StoreConnection(create_store_engine(bouncer.url(query), pool_size=1, ping=False))
    holder = psycopg.connect(f"postgresql://postgres@127.0.0.1:{bouncer.port}/{bouncer.database}")
    try:
        for value in range(6):  # psycopg prepares at the fifth execution
            with store._transaction() as conn:
                conn.execute(text("SELECT 1 + :value"), {"value": value})
        holder.execute("BEGIN")
        holder.execute("SELECT 1")  # PgBouncer hands out its most recently used backend
        with store._transaction() as conn:
            conn.execute(text("SELECT 1 + :value"), {"value": 6})
    finally:
        holder.close()
        store.dispose()


def test_a_statement_prepared_on_another_backend_is_a_lost_connection_naming_the_fix(
    bouncer: PgBouncer,
) -> None:
    with pytest.raises(StoreUnavailable, match=r"add \?prepare_threshold=none to"):
        run_on_another_backend_after_preparing(bouncer, "")


def test_with_prepared_statements_off_a_backend_change_goes_unnoticed(
    bouncer: PgBouncer,
) -> None:
    run_on_another_backend_after_preparing(bouncer, "?prepare_threshold=none")
