"""A PostgreSQL that turned read-only under a pooled connection (a primary demoted by a
failover, a standby reached through a multi-host URL), against a real server: a write
it refuses is a lost connection (StoreUnavailable, the connection dropped from the
pool), never a crash; the next write takes a new connection and goes through."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from beat.errors import StoreUnavailable
from beat.models import RunState
from beat.store.all_roles import Store
from beat.store.db import StoreConnection
from beat.store.runs import RunStore
from tests.conftest import SessionEnv

pytestmark = pytest.mark.integration


def turn_read_only(store: StoreConnection) -> None:
    """The pool's one connection, as if its server had been demoted: every transaction
    it starts from now on is read-only."""
    store.engine.dispose()
    with store.engine.connect() as conn:
        conn.execute(text("SET SESSION default_transaction_read_only = on"))
        conn.commit()
    assert store.engine.pool.checkedin() == 1


@pytest.fixture
def run_store(store: Store, test_env: SessionEnv) -> Iterator[RunStore]:
    made = RunStore.connect(test_env.database_url)
    yield made
    made.dispose()


def test_the_leaders_write_refused_by_a_read_only_server_is_a_lost_connection(
    store: Store,
) -> None:
    turn_read_only(store)

    with pytest.raises(StoreUnavailable, match="lost the connection to PostgreSQL"):
        store.take_leadership(1, "leader")

    assert store.take_leadership(1, "leader"), "a new connection, to a server that writes"


def test_a_workers_write_refused_by_a_read_only_server_is_a_lost_connection(
    run_store: RunStore,
) -> None:
    turn_read_only(run_store)
    run_id = uuid.uuid4()

    def start() -> object:
        return run_store.start(
            run_id,
            owner="w1",
            worker="w1@host",
            lease_seconds=30,
            task="tasks.demo.add",
            args=[1, 2],
            kwargs={},
            options={},
            retries=0,
            max_attempts=3,
            may_create=True,
        )

    with pytest.raises(StoreUnavailable, match="lost the connection to PostgreSQL"):
        start()

    assert type(start()).__name__ == "Started"
    assert run_store.finish(run_id, owner="w1", state=RunState.SUCCEEDED)
