"""The links a succeeded run may have left unsent, against real PostgreSQL: kept with
the completion, settled by the database's clock, cleared once sent."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from beat.models import RunState
from beat.store.all_roles import Store
from beat.store.runs import RunStore
from tests.integration.store.test_runs import start

pytestmark = pytest.mark.integration

LINKS = {"result": {"rows": [1, 2], "note": "é"}}


@pytest.fixture
def run_store(store: Store) -> RunStore:
    return RunStore(store.engine)


def test_the_links_are_kept_with_the_completion_and_cleared_once_sent(
    run_store: RunStore,
) -> None:
    run_id = uuid.uuid4()
    start(run_store, run_id, "a")
    assert run_store.finish(run_id, owner="a", state=RunState.SUCCEEDED, unsent_links=LINKS)

    unsent = run_store.unsent_links(run_id, settle_seconds=3600)
    assert unsent is not None
    assert unsent.result == LINKS["result"]
    assert not unsent.settled, "the first delivery may still be sending them"
    run_store.links_sent(run_id)
    assert run_store.unsent_links(run_id, settle_seconds=0) is None


def test_the_links_settle_once_the_lease_has_passed_since_the_completion_by_the_databases_clock(
    run_store: RunStore, store: Store
) -> None:
    run_id = uuid.uuid4()
    start(run_store, run_id, "a")
    assert run_store.finish(run_id, owner="a", state=RunState.SUCCEEDED, unsent_links=LINKS)
    with store.engine.begin() as conn:  # as if it completed 40 s ago, by the server's clock
        conn.execute(
            text("UPDATE beat_runs SET finished_at = now() - interval '40 seconds' WHERE id = :id"),
            {"id": run_id},
        )
    unsent = run_store.unsent_links(run_id, settle_seconds=30)
    assert unsent is not None
    assert unsent.settled
    later = run_store.unsent_links(run_id, settle_seconds=60)
    assert later is not None
    assert not later.settled


def test_a_completion_refused_keeps_no_links(run_store: RunStore) -> None:
    run_id = uuid.uuid4()
    start(run_store, run_id, "a")
    assert not run_store.finish(run_id, owner="b", state=RunState.SUCCEEDED, unsent_links=LINKS)
    assert run_store.unsent_links(run_id, settle_seconds=0) is None
    assert run_store.finish(run_id, owner="a", state=RunState.SUCCEEDED)
    assert run_store.unsent_links(run_id, settle_seconds=0) is None, "a run without links"
