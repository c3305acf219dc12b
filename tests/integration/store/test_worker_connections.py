"""A worker's store sends each transition of a run as one round trip, and still never
uses a pooled connection the server has closed (``RunStore.connect``)."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from beat.errors import StoreUnavailable
from beat.models import RunState
from beat.store.all_roles import Store
from beat.store.runs import RunStore
from tests.conftest import SessionEnv

pytestmark = pytest.mark.integration


@pytest.fixture
def worker_store(store: Store, test_env: SessionEnv) -> Iterator[RunStore]:
    made = RunStore.connect(test_env.database_url)
    yield made
    made.dispose()


@pytest.fixture
def protocol_trace(worker_store: RunStore) -> Iterator[Path]:
    """libpq's trace of every message the store's connections exchange with the server."""
    fd, name = tempfile.mkstemp(prefix="habeat-trace-")

    def trace(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.pgconn.trace(fd)

    event.listen(worker_store.engine, "connect", trace)
    yield Path(name)
    event.remove(worker_store.engine, "connect", trace)
    os.close(fd)
    os.unlink(name)


def round_trips(trace: Path) -> list[str]:
    """The frontend messages that each wait for the server's answer: a simple query, or
    the Sync that ends an extended one (a parameterised statement)."""
    sent = [line.split("\t") for line in trace.read_text().splitlines()]
    return [
        "\t".join(line[3:]) for line in sent if line[1:2] == ["F"] and line[3] in ("Query", "Sync")
    ]


def test_each_transition_of_a_run_is_one_round_trip(
    worker_store: RunStore, protocol_trace: Path
) -> None:
    """Measured on main before: four a transition (the pool's ping, BEGIN, the
    statement, COMMIT)."""
    worker_store.database_now()  # the connection is opened (its set-up is not counted)
    opened = len(round_trips(protocol_trace))
    run_id = uuid.uuid4()

    worker_store.note_received(run_id, owner="w@host:1:received", worker="w", lease_seconds=5)
    worker_store.heartbeat(run_id, owner="w@host:1:a", lease_seconds=5)
    worker_store.finish_plain(run_id, state=RunState.SUCCEEDED, attempt_retries=0)

    assert len(round_trips(protocol_trace)) - opened == 3, round_trips(protocol_trace)


def test_a_pooled_connection_the_server_closed_is_replaced_without_an_error(
    worker_store: RunStore, store: Store
) -> None:
    with worker_store.engine.connect() as conn:
        backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    with store.engine.begin() as conn:
        # Returns once the backend has ended (PostgreSQL 14 and later).
        ended = text("SELECT pg_terminate_backend(:pid, timeout => 5000)")
        assert conn.execute(ended, {"pid": backend}).scalar()

    # Raised StoreUnavailable when the pool handed out the closed connection.
    assert worker_store.database_now() is not None
    with worker_store.engine.connect() as conn:
        assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() != backend


def test_a_server_that_closes_every_new_connection_at_once_is_unreachable_not_a_crash(
    worker_store: RunStore,
) -> None:
    """PgBouncer whose PostgreSQL is down takes a login, then says ``server login has
    been failing`` and closes: every connection the pool opens is closed before its
    first statement. SQLAlchemy gives up after three with ``InvalidRequestError``,
    which escaped as a crash and killed the worker's lease threads (PgBouncer chaos)."""

    def closed_by_its_server(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.close()

    event.listen(worker_store.engine, "connect", closed_by_its_server)
    with pytest.raises(StoreUnavailable, match="closed every new connection"):
        worker_store.heartbeat_received("w:1:x", [uuid.uuid4()], lease_seconds=30)
    event.remove(worker_store.engine, "connect", closed_by_its_server)
    assert worker_store.database_now() is not None, "a working server is used again"
