"""PostgreSQL through PgBouncer in transaction mode, with real servers: a connection's
next transaction may run on another server backend, where the statements psycopg
prepared (from a statement's fifth execution, when the URL turns them on) do not
exist. The store then drops the connection as a lost one and names the fix. By
default a connection prepares only when the server sees it as its own session: not
through PgBouncer, where a change of backend then goes unnoticed."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import text

from beat.errors import StoreUnavailable
from beat.store.db import DIRECT_PREPARE_THRESHOLD, StoreConnection, create_store_engine
from tests.conftest import SessionEnv
from tests.e2e.pgbouncer import PgBouncer, running_pgbouncer

pytestmark = pytest.mark.integration


@pytest.fixture
def bouncer(test_env: SessionEnv) -> Iterator[PgBouncer]:
    with running_pgbouncer(test_env.database_url, "transaction") as running:
        yield running


def run_on_another_backend_after_preparing(bouncer: PgBouncer, query: str) -> None:
    """Run a statement six times on the store's one connection (psycopg prepares it at
    the fifth, if the URL lets it), hold that backend from another client, then run the
    statement again: on another backend, as the check of the backend's PID shows."""
    store = StoreConnection(create_store_engine(bouncer.url(query), pool_size=1, ping=False))
    holder = psycopg.connect(f"postgresql://postgres@127.0.0.1:{bouncer.port}/{bouncer.database}")
    try:
        for value in range(6):  # psycopg prepares at the fifth execution
            with store._transaction() as conn:
                first = conn.execute(text("SELECT pg_backend_pid() + :value"), {"value": value})
                backend = first.scalar_one() - value
        holder.execute("BEGIN")
        holder.execute("SELECT 1")  # PgBouncer hands out its most recently used backend
        with store._transaction() as conn:
            last = conn.execute(text("SELECT pg_backend_pid() + :value"), {"value": 6})
            assert last.scalar_one() - 6 != backend, "the statement ran on another backend"
    finally:
        holder.close()
        store.dispose()


def test_a_statement_prepared_on_another_backend_is_a_lost_connection_naming_the_fix(
    bouncer: PgBouncer,
) -> None:
    with pytest.raises(StoreUnavailable, match="take prepare_threshold out of the database URL"):
        run_on_another_backend_after_preparing(bouncer, "?prepare_threshold=5")


@pytest.mark.parametrize("query", ["", "?prepare_threshold=none"])
def test_with_prepared_statements_off_a_backend_change_goes_unnoticed(
    bouncer: PgBouncer, query: str
) -> None:
    run_on_another_backend_after_preparing(bouncer, query)


def prepare_threshold_of(url: str) -> int | None:
    store = StoreConnection(create_store_engine(url, pool_size=1))
    try:
        with store.engine.connect() as conn:
            threshold: int | None = conn.connection.driver_connection.prepare_threshold
            return threshold
    finally:
        store.dispose()


def test_by_default_only_a_connection_to_the_server_itself_prepares(
    bouncer: PgBouncer, test_env: SessionEnv
) -> None:
    assert prepare_threshold_of(test_env.database_url) == DIRECT_PREPARE_THRESHOLD
    assert prepare_threshold_of(bouncer.url()) is None
    assert prepare_threshold_of(bouncer.url("?prepare_threshold=7")) == 7, "the URL decides"
