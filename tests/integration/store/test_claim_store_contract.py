"""The claim store's contract, run against PostgreSQL (``LeaderStore``) and the
in-memory fake the loop's unit tests run on (``tests.fakes.FakeClaimStore``):
the same cases, the same outcomes, so what the unit tests show of the loop
holds on the real store."""

from __future__ import annotations

import itertools
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

import pytest
from sqlalchemy import select, text

from beat.claim.planning import PlanningRules
from beat.errors import StaleEpoch
from beat.leader.leadership import LeaderRow
from beat.leader.ports import ClaimStore
from beat.models import OverlapPolicy, RunState, SkipKind
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.tables import schedules
from tests.fakes import FakeClaimStore, ManualClock

PLAN = PlanningRules(misfire_grace=60, max_catchup=100).plan_schedule


class ContractStore(ClaimStore, LeaderRow, Protocol):
    """What both stores implement."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRow:
    id: uuid.UUID
    schedule_name: str | None
    fire_at: datetime | None
    state: RunState
    reason: str | None
    epoch: int | None


class Harness(Protocol):
    """A store under test, with what a test needs around it."""

    store: ContractStore

    def add(
        self, name: str, *, every: float, due_in: float, overlap: OverlapPolicy, jitter: float = 0
    ) -> None:
        """A schedule firing every ``every`` seconds, next in ``due_in`` (< 0: overdue)."""

    def make_due(self, name: str, seconds_ago: float) -> None:
        """Move the schedule's timing so that it fired ``seconds_ago``, as if beat were down."""

    def runs(self) -> list[RunRow]: ...
    def next_fire_at(self, name: str) -> datetime | None: ...
    def now(self) -> datetime: ...
    def sleep(self, seconds: float) -> None: ...


class FakeHarness:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.fake = FakeClaimStore(self.clock)
        self.store: ContractStore = self.fake

    def add(
        self, name: str, *, every: float, due_in: float, overlap: OverlapPolicy, jitter: float = 0
    ) -> None:
        self.fake.add_schedule(name, every=every, in_seconds=due_in, overlap=overlap, jitter=jitter)

    def make_due(self, name: str, seconds_ago: float) -> None:
        self.fake.retime(name, in_seconds=-seconds_ago)

    def runs(self) -> list[RunRow]:
        return [
            RunRow(
                id=run.id,
                schedule_name=run.schedule_name,
                fire_at=run.fire_at,
                state=run.state,
                reason=run.reason,
                epoch=run.epoch,
            )
            for run in self.fake.runs_of()
        ]

    def next_fire_at(self, name: str) -> datetime | None:
        return self.fake.schedule(name).next_fire_at

    def now(self) -> datetime:
        return self.clock.now()

    def sleep(self, seconds: float) -> None:
        self.clock.advance(seconds)


class PostgresHarness:
    def __init__(self, store: Store) -> None:
        self.pg = store
        self.store: ContractStore = store

    def add(
        self, name: str, *, every: float, due_in: float, overlap: OverlapPolicy, jitter: float = 0
    ) -> None:
        Schedules(self.pg).create(
            name,
            "tasks.demo.add",
            every=every,
            overlap_policy=overlap.value,
            jitter=jitter,
            allow_unregistered=True,
        )
        self._fire_in(name, due_in)

    def make_due(self, name: str, seconds_ago: float) -> None:
        self._fire_in(name, -seconds_ago)

    def _fire_in(self, name: str, seconds: float) -> None:
        with self.pg.engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE beat_schedules SET next_fire_at = now() + make_interval(secs => :s),"
                    " anchor_at = now() + make_interval(secs => :s) WHERE name = :name"
                ),
                {"s": seconds, "name": name},
            )

    def runs(self) -> list[RunRow]:
        with self.pg.engine.connect() as conn:
            rows = conn.execute(text("SELECT * FROM beat_runs ORDER BY schedule_name, fire_at"))
            return [
                RunRow(
                    id=row.id,
                    schedule_name=row.schedule_name,
                    fire_at=row.fire_at,
                    state=RunState(row.state),
                    reason=row.reason,
                    epoch=row.epoch,
                )
                for row in rows
            ]

    def next_fire_at(self, name: str) -> datetime | None:
        with self.pg.engine.connect() as conn:
            value: datetime | None = conn.execute(
                select(schedules.c.next_fire_at).where(schedules.c.name == name)
            ).scalar_one()
            return value

    def now(self) -> datetime:
        with self.pg.engine.connect() as conn:
            value: datetime = conn.execute(text("SELECT now()")).scalar_one()
            return value

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.fixture(params=["fake", pytest.param("postgres", marks=pytest.mark.integration)])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "fake":
        yield FakeHarness()
    else:
        yield PostgresHarness(request.getfixturevalue("store"))


ALLOW, SKIP = OverlapPolicy.ALLOW, OverlapPolicy.SKIP


def test_a_claim_inserts_one_run_per_fire_time_and_advances(harness: Harness) -> None:
    for name in ("a", "b"):
        harness.add(name, every=1, due_in=-2.5, overlap=ALLOW)
    store = harness.store
    assert store.take_leadership(1, "me")

    claim = store.claim_due(1, batch=100, plan=PLAN)

    assert claim.schedules_claimed == 2
    assert len(claim.runs) == 2 * 3, "fire times at -2.5, -1.5 and -0.5 s"
    rows = harness.runs()
    assert {row.id for row in rows} == {run.id for run in claim.runs}
    assert {(row.state, row.epoch) for row in rows} == {(RunState.PENDING, 1)}
    for name in ("a", "b"):
        fire_times = sorted(
            row.fire_at for row in rows if row.schedule_name == name and row.fire_at
        )
        assert [b - a for a, b in itertools.pairwise(fire_times)] == [timedelta(seconds=1)] * 2
        next_fire_at = harness.next_fire_at(name)
        assert next_fire_at is not None
        assert next_fire_at == fire_times[-1] + timedelta(seconds=1)
        assert next_fire_at > claim.now

    again = store.claim_due(1, batch=100, plan=PLAN)
    assert (again.runs, again.schedules_claimed) == ([], 0), "a second claim finds nothing"
    assert len(harness.runs()) == 6


def test_a_claim_with_a_stale_epoch_is_refused_and_writes_nothing(harness: Harness) -> None:
    harness.add("a", every=1, due_in=-1.5, overlap=ALLOW)
    store = harness.store
    before = harness.next_fire_at("a")
    assert store.take_leadership(1, "old")
    assert store.take_leadership(2, "new")
    assert not store.take_leadership(2, "again"), "an epoch is taken once"
    assert not store.take_leadership(1, "older"), "epochs never go back"
    assert store.current_epoch() == 2

    with pytest.raises(StaleEpoch, match="epoch 1, the newest is 2"):
        store.claim_due(1, batch=100, plan=PLAN)

    assert harness.runs() == []
    assert harness.next_fire_at("a") == before
    assert len(store.claim_due(2, batch=100, plan=PLAN).runs) == 2


def test_claiming_ahead_arms_only_allow_schedules(harness: Harness) -> None:
    harness.add("soon", every=60, due_in=1.5, overlap=ALLOW)
    harness.add("soon-skip", every=60, due_in=1.5, overlap=SKIP)
    harness.add("later", every=60, due_in=30, overlap=ALLOW)
    store = harness.store
    skip_fires_at = harness.next_fire_at("soon-skip")
    assert store.take_leadership(1, "me")

    assert store.claim_due(1, batch=10, plan=PLAN).schedules_claimed == 0, "ahead=0: none"
    claim = store.claim_due(1, batch=10, plan=PLAN, ahead=2.0)

    assert (claim.runs, claim.deferred, claim.schedules_claimed) == ([], 0, 1)
    (armed,) = claim.armed
    assert armed.schedule_name == "soon"
    assert armed.not_before == armed.fire_at
    assert armed.fire_at is not None
    assert armed.fire_at > claim.now
    (row,) = harness.runs()
    assert (row.id, row.state) == (armed.id, RunState.PENDING)
    assert harness.next_fire_at("soon-skip") == skip_fires_at, "not claimed"


def test_the_outbox_returns_an_earlier_leaders_runs_not_this_leaders_fresh_ones(
    harness: Harness,
) -> None:
    harness.add("a", every=1, due_in=-1.5, overlap=ALLOW)
    store = harness.store
    assert store.take_leadership(1, "old")
    claim = store.claim_due(1, batch=100, plan=PLAN)
    assert len(claim.runs) == 2

    assert store.pending_runs(1, grace=60, limit=100) == [], "its own, and fresh"
    assert store.take_leadership(2, "new")
    pending = store.pending_runs(2, grace=60, limit=100)
    assert {run.id for run in pending} == {run.id for run in claim.runs}
    assert store.pending_runs(2, grace=60, limit=1) == pending[:1]


def test_mark_published_moves_a_run_from_the_outbox_once(harness: Harness) -> None:
    harness.add("a", every=1, due_in=-1.5, overlap=ALLOW)
    store = harness.store
    assert store.take_leadership(1, "old")
    store.claim_due(1, batch=100, plan=PLAN)
    assert store.take_leadership(2, "new")
    pending = store.pending_runs(2, grace=60, limit=100)

    assert store.mark_published([run.id for run in pending]) == 2
    assert store.pending_runs(2, grace=60, limit=100) == []
    assert store.mark_published([run.id for run in pending]) == 0, "published once"
    assert {row.state for row in harness.runs()} == {RunState.QUEUED}


def test_armed_runs_wait_for_their_fire_time_in_the_outbox(harness: Harness) -> None:
    """Another leader's outbox returns them at their fire time; the claiming leader's
    own outbox too, once they are older than the grace (it holds them in memory)."""
    harness.add("soon", every=60, due_in=0.4, overlap=ALLOW)
    store = harness.store
    assert store.take_leadership(1, "me")
    (armed,) = store.claim_due(1, batch=10, plan=PLAN, ahead=2.0).armed

    assert store.pending_runs(2, grace=60, limit=10) == [], "not before its fire time"
    harness.sleep(0.5)
    assert [run.id for run in store.pending_runs(2, grace=60, limit=10)] == [armed.id]
    assert store.pending_runs(1, grace=60, limit=10) == [], "its own: held in memory"
    assert [run.id for run in store.pending_runs(1, grace=0.3, limit=10)] == [armed.id], (
        "its own, claimed longer ago than the grace"
    )


def test_overlap_skip_with_an_active_run_records_a_skip(harness: Harness) -> None:
    harness.add("s", every=1, due_in=-2.5, overlap=SKIP)
    store = harness.store
    assert store.take_leadership(1, "me")

    first = store.claim_due(1, batch=10, plan=PLAN)
    assert len(first.runs) == 1, "of the fire times in one claim only the latest runs"
    assert (first.skipped, first.skips) == (2, Counter({SkipKind.OVERLAP: 2}))

    harness.make_due("s", 0.25)  # a later fire time, while the first run waits
    second = store.claim_due(1, batch=10, plan=PLAN)

    assert second.runs == []
    assert second.schedules_claimed == 1
    assert (second.skipped, second.skips) == (1, Counter({SkipKind.OVERLAP: 1}))
    skipped = [row for row in harness.runs() if row.state is RunState.SKIPPED]
    assert len(skipped) == 3
    reasons = {row.reason for row in skipped}
    assert "overlap (skip): the previous run is still active" in reasons
    assert "overlap: a newer fire time in the same claim" in reasons


def test_seconds_until_next_fire_leaves_out_this_epochs_armed_runs(harness: Harness) -> None:
    harness.add("soon", every=60, due_in=1.5, overlap=ALLOW)
    store = harness.store
    assert store.take_leadership(1, "me")
    assert store.seconds_until_next_fire(1) == pytest.approx(1.5, abs=0.3)
    (_armed,) = store.claim_due(1, batch=10, plan=PLAN, ahead=2.0).armed

    assert store.seconds_until_next_fire(1) == pytest.approx(61.5, abs=0.3), "held in memory"
    assert store.seconds_until_next_fire(2) == pytest.approx(1.5, abs=0.3), "another's"
    assert store.seconds_until_next_fire() == pytest.approx(1.5, abs=0.3)
    assert store.seconds_until_lease_expiry() is None


def test_a_jittered_run_is_deferred_and_counted_as_the_next_fire(harness: Harness) -> None:
    harness.add("jittered", every=60, due_in=-0.1, overlap=ALLOW, jitter=30)
    store = harness.store
    assert store.take_leadership(1, "me")

    claim = store.claim_due(1, batch=10, plan=PLAN)

    assert (claim.runs, claim.armed, claim.deferred) == ([], [], 1)
    (row,) = harness.runs()
    wait = store.seconds_until_next_fire(1)
    assert wait is not None
    assert 0 < wait < 30, "its jittered time, before the next fire"
    assert store.pending_runs(1, grace=60, limit=10) == [], "not before its time"
    assert row.fire_at is not None
    assert row.fire_at < harness.now()
