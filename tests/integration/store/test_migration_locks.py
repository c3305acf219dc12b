"""A migration run while processes of the release before go on (as a rolling upgrade
does): migration 0013 against a summariser that holds the summary and then reads the
run table, on a database of the test's own migrated to 0012."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import insert, select, text

from beat.store.all_roles import Store
from beat.store.schema import migrate
from beat.store.tables import run_summary, runs
from tests.conftest import SessionEnv
from tests.integration.helpers import database_at

pytestmark = pytest.mark.integration


@pytest.fixture
def at_0012(test_env: SessionEnv) -> Iterator[Store]:
    with database_at(test_env, "0012") as store:
        yield store


def test_0013_waits_for_a_summariser_holding_the_summary_and_does_not_deadlock(
    at_0012: Store,
) -> None:
    store = at_0012
    now = store.now()
    with store.engine.begin() as conn:
        conn.execute(insert(run_summary).values(summarised_until=now - timedelta(hours=1)))
    failed: list[BaseException] = []

    def upgrade() -> None:
        try:
            migrate(store.engine, "0013")
        except BaseException as exc:  # reported below, on the test's thread
            failed.append(exc)

    with store.engine.connect() as summariser:
        # A summariser of the release before: the summary locked first...
        summariser.execute(
            select(run_summary.c.summarised_until).with_for_update(skip_locked=True)
        ).one()
        migration = threading.Thread(target=upgrade)
        migration.start()
        migration.join(timeout=2)  # it waits for the summary, holding nothing it needs
        assert migration.is_alive()
        # ...then the runs read: they are not locked by the migration.
        summariser.execute(text("SET LOCAL lock_timeout = '5s'"))
        summariser.execute(select(runs.c.id).limit(1)).all()
        summariser.commit()
    migration.join(timeout=60)

    assert not migration.is_alive()
    assert failed == []
    with store.engine.connect() as conn:
        assert conn.execute(select(run_summary.c.outcomes_until)).scalar_one() is not None
