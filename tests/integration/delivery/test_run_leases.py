"""The leases of the runs a worker process executes on the idempotent base are renewed
together: one statement an interval for all of them, each only while its delivery still
holds it (``beat.delivery.run_leases``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import event, text

from beat.delivery.run_leases import RunLeases
from beat.store.all_roles import Store
from beat.store.runs import RunStore
from tests.conftest import SessionEnv

pytestmark = pytest.mark.integration

SHORT_LEASE = 5.0
LONG_LEASE = 600.0


@dataclass(eq=False)
class Held:
    """One execution as the run leases see it."""

    run_id: uuid.UUID
    owner: str
    lease_seconds: float = LONG_LEASE
    valid_until: float = field(default_factory=lambda: time.monotonic() + SHORT_LEASE)
    ending: bool = False
    lost: list[str] = field(default_factory=list)

    def finishing(self) -> bool:
        return self.ending

    def lose(self, reason: str) -> None:
        self.lost.append(reason)


@pytest.fixture
def run_store(store: Store, test_env: SessionEnv) -> Iterator[RunStore]:
    """The store a worker records runs with, on the emptied schema of ``store``."""
    made = RunStore.connect(test_env.database_url)
    yield made
    made.dispose()


def started_run(store: RunStore, owner: str) -> Held:
    """A run an idempotent task started (as a ``.delay()`` does), under ``owner``'s lease."""
    run_id = uuid.uuid4()
    store.start(
        run_id,
        owner=owner,
        worker="w@host",
        lease_seconds=SHORT_LEASE,
        task="job",
        args=[],
        kwargs={},
        options={},
        retries=0,
        max_attempts=3,
    )
    return Held(run_id=run_id, owner=owner)


def lease_seconds_left(store: RunStore, run: Held) -> float:
    with store.engine.connect() as conn:
        left: float = conn.execute(
            text(
                "SELECT extract(epoch FROM lease_expires_at - now())::float8"
                " FROM beat_runs WHERE id = :id"
            ),
            {"id": run.run_id},
        ).scalar_one()
    return left


@pytest.fixture
def statements(run_store: RunStore) -> Iterator[list[str]]:
    """The statements the store sends from now on."""
    sent: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    event.listen(run_store.engine, "before_cursor_execute", count)
    yield sent
    event.remove(run_store.engine, "before_cursor_execute", count)


def test_one_statement_renews_the_lease_of_every_run_a_process_executes(
    run_store: RunStore, statements: list[str]
) -> None:
    runs = [started_run(run_store, f"w@host:1:{index}") for index in range(50)]
    leases = RunLeases(run_store, every=60)
    for run in runs:
        leases.hold(run)
    statements.clear()

    leases.renew()

    assert len(statements) == 1, statements
    assert all(lease_seconds_left(run_store, run) > LONG_LEASE - 60 for run in runs)
    assert not any(run.lost for run in runs)


def test_a_run_another_delivery_took_over_is_told_and_the_others_keep_their_lease(
    run_store: RunStore,
) -> None:
    mine, taken = started_run(run_store, "w@host:1:a"), started_run(run_store, "w@host:1:b")
    with run_store.engine.begin() as conn:
        conn.execute(
            text("UPDATE beat_runs SET lease_owner = 'w2@host:9:c' WHERE id = :id"),
            {"id": taken.run_id},
        )
    leases = RunLeases(run_store, every=60)
    leases.hold(mine)
    leases.hold(taken)

    leases.renew()

    assert taken.lost == ["another worker holds it now"]
    assert mine.lost == []
    assert lease_seconds_left(run_store, mine) > LONG_LEASE - 60
    assert lease_seconds_left(run_store, taken) < SHORT_LEASE  # the other owner's, untouched
    leases.renew()
    assert taken.lost == ["another worker holds it now"]  # told once: no longer held


def test_a_run_whose_outcome_is_being_recorded_is_not_told_it_lost_its_lease(
    run_store: RunStore,
) -> None:
    run = started_run(run_store, "w@host:1:a")
    with run_store.engine.begin() as conn:  # its outcome, recorded while a renewal was due
        conn.execute(
            text("UPDATE beat_runs SET state = 'succeeded', lease_owner = NULL WHERE id = :id"),
            {"id": run.run_id},
        )
    run.ending = True
    leases = RunLeases(run_store, every=60)
    leases.hold(run)

    leases.renew()

    assert run.lost == []


def test_while_postgresql_is_unreachable_a_lease_is_lost_only_once_it_expired() -> None:
    unreachable = RunStore.connect("postgresql+psycopg://postgres@127.0.0.1:1/nowhere")
    now = time.monotonic()
    expired = Held(run_id=uuid.uuid4(), owner="w@host:1:a", valid_until=now - 0.1)
    holding = Held(run_id=uuid.uuid4(), owner="w@host:1:b", valid_until=now + SHORT_LEASE)
    leases = RunLeases(unreachable, every=60)
    leases.hold(expired)
    leases.hold(holding)
    try:
        leases.renew()
    finally:
        unreachable.dispose()

    assert expired.lost == ["its lease expired while PostgreSQL was unreachable"]
    assert holding.lost == []


def test_a_renewal_counts_the_lease_from_when_it_was_sent(run_store: RunStore) -> None:
    run = started_run(run_store, "w@host:1:a")
    leases = RunLeases(run_store, every=60)
    leases.hold(run)
    before = time.monotonic()

    leases.renew()

    assert before <= run.valid_until - LONG_LEASE <= time.monotonic()
