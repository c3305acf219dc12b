"""The idempotency guard, leases, completion and the reaper, against real PostgreSQL."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from beat.delivery import heartbeat
from beat.delivery.tracking import WorkerHeartbeat
from beat.errors import StaleEpoch
from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.run_guard import Refused, Started
from beat.store.runs import RunStore
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.integration


@pytest.fixture
def run_store(store: Store) -> RunStore:
    return RunStore(store.engine)


def start(
    run_store: RunStore, run_id: uuid.UUID, owner: str, **overrides: Any
) -> Started | Refused:
    fields: dict[str, Any] = {
        "owner": owner,
        "worker": owner,
        "lease_seconds": 30,
        "task": "t",
        "args": [1],
        "kwargs": {},
        "options": {"queue": "q"},
        "retries": 0,
        "max_attempts": 2,
    }
    fields.update(overrides)
    return run_store.start(run_id, **fields)


def expire_leases(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE beat_runs SET lease_expires_at = now() - interval '1 second'"))


def test_concurrent_deliveries_of_one_run_start_it_once(run_store: RunStore, store: Store) -> None:
    run_id = uuid.uuid4()
    barrier = threading.Barrier(8)

    def deliver(index: int) -> Started | Refused:
        barrier.wait()
        return start(run_store, run_id, f"w{index}")

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(deliver, range(8)))
    assert sum(isinstance(o, Started) for o in outcomes) == 1
    refused = [o for o in outcomes if isinstance(o, Refused)]
    assert {o.state for o in refused} == {RunState.RUNNING.value}
    (row,) = run_rows(store)
    assert row.duplicate_deliveries == 7, "every refused duplicate is counted"
    assert row.options == {"queue": "q"}, "an ad hoc run keeps its payload for the reaper"


def test_a_finished_run_refuses_deliveries_and_completion_is_guarded_by_the_lease(
    run_store: RunStore, store: Store
) -> None:
    run_id = uuid.uuid4()
    assert start(run_store, run_id, "a") == Started(attempt=1)
    assert not run_store.finish(run_id, owner="b", state=RunState.SUCCEEDED), "not b's lease"
    assert run_store.finish(run_id, owner="a", state=RunState.SUCCEEDED)
    assert not run_store.finish(run_id, owner="a", state=RunState.SUCCEEDED), "completes once"
    assert start(run_store, run_id, "c") == Refused(
        state=RunState.SUCCEEDED.value, lease_owner=None
    )
    (row,) = run_rows(store)
    assert row.state == RunState.SUCCEEDED.value
    assert row.duration_seconds is not None


def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced(
    run_store: RunStore, store: Store
) -> None:
    run_id = uuid.uuid4()
    assert isinstance(start(run_store, run_id, "a"), Started)
    assert run_store.heartbeat(run_id, owner="a", lease_seconds=30)
    assert isinstance(start(run_store, run_id, "b"), Refused), "a's lease is live"
    expire_leases(store)
    assert start(run_store, run_id, "b") == Started(attempt=2)
    assert not run_store.heartbeat(run_id, owner="a", lease_seconds=30), (
        "a learns it lost the lease"
    )
    assert not run_store.finish(run_id, owner="a", state=RunState.SUCCEEDED)
    assert run_store.finish(run_id, owner="b", state=RunState.SUCCEEDED)


def test_a_retry_lets_the_next_delivery_in_but_not_a_stale_duplicate(run_store: RunStore) -> None:
    run_id = uuid.uuid4()
    assert isinstance(start(run_store, run_id, "a"), Started)
    assert run_store.finish(run_id, owner="a", state=RunState.RETRYING, retries=1, error="boom")
    assert isinstance(start(run_store, run_id, "old", retries=0), Refused), (
        "a copy of the first delivery"
    )
    assert start(run_store, run_id, "b", retries=1) == Started(attempt=2)


def test_effects_commit_with_the_completion_or_not_at_all(
    run_store: RunStore, store: Store
) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS effects (run_id uuid)"))
        conn.execute(text("TRUNCATE effects"))
    kept, discarded = uuid.uuid4(), uuid.uuid4()
    for run_id in (kept, discarded):
        assert isinstance(start(run_store, run_id, "a"), Started)
    expire_leases(store)
    assert isinstance(start(run_store, discarded, "b"), Started)  # b took `discarded` over

    for run_id in (kept, discarded):
        with Session(bind=store.engine) as session:
            session.execute(text("INSERT INTO effects VALUES (:id)"), {"id": run_id})
            recorded = run_store.finish(
                run_id, owner="a", state=RunState.SUCCEEDED, conn=session.connection()
            )
            session.commit() if recorded else session.rollback()

    with store.engine.connect() as conn:
        effects = [row[0] for row in conn.execute(text("SELECT run_id FROM effects"))]
    assert effects == [kept]


def test_the_reaper_republishes_expired_runs_and_marks_exhausted_ones_lost(
    run_store: RunStore, store: Store
) -> None:
    assert store.take_leadership(1, "leader")
    again, exhausted = uuid.uuid4(), uuid.uuid4()
    assert isinstance(start(run_store, again, "a", max_attempts=2), Started)
    assert isinstance(start(run_store, exhausted, "a", max_attempts=1), Started)
    expire_leases(store)

    reclaim = store.reclaim(1, stale_queued_after=3600, limit=100)

    assert [run.id for run in reclaim.runs] == [again]
    assert reclaim.runs[0].options == {"queue": "q"}
    assert [lost.id for lost in reclaim.lost] == [exhausted]
    assert "attempts exhausted" in reclaim.lost[0].error
    states = {row.id: row.state for row in run_rows(store)}
    assert states == {again: RunState.PENDING.value, exhausted: RunState.LOST.value}
    assert store.reclaim(1, stale_queued_after=3600, limit=100).runs == [], "nothing loops"
    # The second attempt dies too: now `again` is out of attempts as well.
    store.mark_published([again])
    assert start(run_store, again, "b", max_attempts=2) == Started(attempt=2)
    expire_leases(store)
    assert [lost.id for lost in store.reclaim(1, stale_queued_after=3600, limit=100).lost] == [
        again
    ]


def test_the_reaper_is_fenced_and_republishes_runs_stuck_in_the_queue(store: Store) -> None:
    schedules = Schedules(store)
    schedules.create("s", "t", at=datetime.now(UTC), allow_unregistered=True)
    assert store.take_leadership(1, "leader")
    from tests.integration.store.test_store import planner

    claim = store.claim_due(1, batch=10, plan=planner)
    store.mark_published([run.id for run in claim.runs])
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE beat_runs SET published_at = now() - interval '3 hours'"))
    assert store.take_leadership(2, "next")
    with pytest.raises(StaleEpoch):
        store.reclaim(1, stale_queued_after=7200, limit=10)
    reclaim = store.reclaim(2, stale_queued_after=7200, limit=10)
    assert [run.id for run in reclaim.runs] == [claim.runs[0].id]


def see_worker(store: Store, name: str, *, seen_ago: float, booted_ago: float = 3600) -> None:
    """Record the worker ``name`` as last seen ``seen_ago`` seconds ago."""
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO beat_workers (name, pid, booted_at, seen_at) VALUES"
                " (:name, 1, now() - make_interval(secs => :booted), now() - make_interval(secs"
                " => :seen)) ON CONFLICT (name) DO UPDATE SET seen_at = excluded.seen_at,"
                " booted_at = excluded.booted_at"
            ),
            {"name": name, "seen": seen_ago, "booted": booted_ago},
        )


def test_a_run_whose_worker_was_killed_does_not_use_up_its_attempts(
    run_store: RunStore, store: Store
) -> None:
    """A run interrupted because its worker died (not seen since the run's last
    heartbeat) is sent again however often that happens, up to MAX_INTERRUPTIONS; a
    run whose worker lives on (its process crashed or hung under it) uses an attempt.
    Finding 966478 (chaos seed) of issue 15."""
    from beat.store.leader import MAX_INTERRUPTIONS

    assert store.take_leadership(1, "leader")
    killed, poison, unknown = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for run_id, worker in ((killed, "killed@h"), (poison, "alive@h"), (unknown, "nobody@h")):
        assert isinstance(start(run_store, run_id, worker, max_attempts=1), Started)
    with store.engine.begin() as conn:  # the last heartbeats were 30 s ago
        conn.execute(text("UPDATE beat_runs SET lease_expires_at = now() - interval '1 second'"))
    see_worker(store, "killed@h", seen_ago=31)  # died with its run's last heartbeat
    see_worker(store, "alive@h", seen_ago=2)  # still beating: the run itself died

    reclaim = store.reclaim(1, stale_queued_after=3600, limit=100, lease_seconds=30)

    assert [run.id for run in reclaim.runs] == [killed]
    assert sorted(lost.id for lost in reclaim.lost) == sorted([poison, unknown])
    assert {row.id: row.interruptions for row in run_rows(store)}[killed] == 1

    # Killed again and again: sent again until MAX_INTERRUPTIONS, then given up.
    for attempt in range(2, MAX_INTERRUPTIONS + 2):
        store.mark_published([killed])
        assert start(run_store, killed, "killed@h", max_attempts=1) == Started(attempt=attempt)
        expire_leases(store)
        see_worker(store, "killed@h", seen_ago=31)
        reclaim = store.reclaim(1, stale_queued_after=3600, limit=100, lease_seconds=30)
    assert [lost.id for lost in reclaim.lost] == [killed]
    assert "its worker died 11 times" in reclaim.lost[0].error


def test_a_worker_started_again_after_its_run_started_counts_as_interrupted(
    run_store: RunStore, store: Store
) -> None:
    assert store.take_leadership(1, "leader")
    run_id = uuid.uuid4()
    assert isinstance(start(run_store, run_id, "restarted@h", max_attempts=1), Started)
    expire_leases(store)
    see_worker(store, "restarted@h", seen_ago=1, booted_ago=0)  # the same name, a new process

    reclaim = store.reclaim(1, stale_queued_after=3600, limit=100, lease_seconds=30)

    assert [run.id for run in reclaim.runs] == [run_id]


def skew_worker_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The worker code of this process (``beat.delivery.tracking``) reads a wall clock
    ``seconds`` off (ahead if positive), as on a host whose clock is set wrong."""
    shift = timedelta(seconds=seconds)

    class Skewed(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return datetime.now(tz) + shift

    monkeypatch.setattr(heartbeat, "datetime", Skewed)


@pytest.mark.parametrize(
    ("skew", "restarted"), [(-120.0, True), (120.0, False)], ids=["behind", "ahead"]
)
def test_the_reaper_tells_a_restarted_worker_from_a_living_one_whatever_its_clock(
    run_store: RunStore,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    skew: float,
    restarted: bool,
) -> None:
    """issue 38, finding 2: a worker records when its process started (``beat_workers``),
    and the reaper compares that with when the run started (the database's clock) to
    tell a restarted worker (the run was interrupted: its attempt does not count) from
    the same process (the run itself died under it: it does). A worker restarted with
    its clock 2 minutes behind reads as restarted; a worker whose clock is 2 minutes
    ahead that lives on reads as the same process."""
    assert store.take_leadership(1, "leader")
    run_id = uuid.uuid4()
    if restarted:
        WorkerHeartbeat(run_store, "w@h", lease_seconds=30).renew()
        assert isinstance(start(run_store, run_id, "w@h", max_attempts=1), Started)
        time.sleep(0.1)  # the process dies with its run and is started again
        skew_worker_clock(monkeypatch, skew)
        WorkerHeartbeat(run_store, "w@h", lease_seconds=30).renew()
    else:
        skew_worker_clock(monkeypatch, skew)
        living = WorkerHeartbeat(run_store, "w@h", lease_seconds=30)
        living.renew()
        assert isinstance(start(run_store, run_id, "w@h", max_attempts=1), Started)
        living.renew()
    expire_leases(store)

    reclaim = store.reclaim(1, stale_queued_after=3600, limit=100, lease_seconds=30)

    if restarted:
        assert [run.id for run in reclaim.runs] == [run_id], "an interruption: sent again"
        assert [row.interruptions for row in run_rows(store)] == [1]
    else:
        assert [lost.id for lost in reclaim.lost] == [run_id], "its one attempt was used"


def test_a_retry_delivered_before_its_attempt_ended_is_taken(
    run_store: RunStore, store: Store
) -> None:
    """Celery publishes a retry before the attempt that asked for it ends: with no
    countdown, the retry's delivery can reach the guard while the run is still
    ``running`` under that attempt's live lease. It carries a higher retry count, so
    it is the retry, not a duplicate; an older delivery is still refused. Finding 2c of issue 15."""
    run_id = uuid.uuid4()
    assert isinstance(start(run_store, run_id, "first"), Started)

    assert start(run_store, run_id, "retry", retries=1) == Started(attempt=2)
    assert isinstance(start(run_store, run_id, "stale", retries=1), Refused)
    assert isinstance(start(run_store, run_id, "older", retries=0), Refused)
    assert not run_store.finish(run_id, owner="first", state=RunState.RETRYING, retries=1), (
        "the first attempt's late record does not overwrite the retry that runs"
    )
    assert run_store.finish(run_id, owner="retry", state=RunState.SUCCEEDED)


def test_chaos_seed_87395_a_delivery_whose_expiry_passes_after_the_check_does_not_start(
    run_store: RunStore, store: Store
) -> None:
    """The guard checks the expiry, then starts the run: two statements. An expiry that
    passes between them (seen: a run started 23 ms after it) is refused by the start
    itself, by the database's clock; a delivery before its expiry starts."""
    from tests.integration.store.test_store import planner

    Schedules(store).create("expiring", "t", at=datetime.now(UTC), allow_unregistered=True)
    assert store.take_leadership(1, "leader")
    [run] = store.claim_due(1, batch=10, plan=planner).runs
    assert store.mark_published([run.id]) == 1
    passed = store.now() - timedelta(milliseconds=1)

    refused = start(run_store, run.id, "late", may_create=False, expires=passed)
    assert refused == Refused(state=RunState.EXPIRED.value, lease_owner=None)
    [row] = run_rows(store)
    assert (row.state, row.started_at) == (RunState.EXPIRED.value, None), "and ends it expired"
    assert row.duplicate_deliveries == 0, "an expiry is not a duplicate delivery"

    Schedules(store).create("in-time", "t", at=datetime.now(UTC), allow_unregistered=True)
    [other] = store.claim_due(1, batch=10, plan=planner).runs
    soon = store.now() + timedelta(seconds=30)
    assert isinstance(start(run_store, other.id, "w", may_create=False, expires=soon), Started)


def _retry_held_by_a_dead_worker(run_store: RunStore, store: Store) -> uuid.UUID:
    """A scheduled run published on time whose first attempt asks for a retry; the worker
    holding the retry's message (Celery sends it at once, with its countdown) dies. The
    reaper puts the run back in the outbox, due at its retry time, and publishes it again.
    Returns the run's ID."""
    from tests.integration.store.test_store import planner

    Schedules(store).create("retrying", "t", at=datetime.now(UTC), allow_unregistered=True)
    assert store.take_leadership(1, "leader")
    claim = store.claim_due(1, batch=10, plan=planner)
    [run] = claim.runs
    assert store.mark_published([run.id]) == 1  # on time: at its fire time or after
    assert run_store.note_received(run.id, owner="a:received", worker="a", lease_seconds=30)
    assert isinstance(start(run_store, run.id, "a", may_create=False), Started)
    assert run_store.finish(run.id, owner="a", state=RunState.RETRYING, retries=1, retry_in=0.3)
    # Worker b takes the retry's message (held until its countdown ends), then is killed.
    assert run_store.note_received(run.id, owner="b:received", worker="b", lease_seconds=30)
    [before] = run_rows(store)
    expire_leases(store)
    time.sleep(0.4)  # past the retry's due time: the reaper publishes it at once
    reclaim = store.reclaim(1, stale_queued_after=3600, limit=100)
    assert [again.id for again in reclaim.runs] == [run.id]
    [row] = run_rows(store)
    assert row.state == RunState.PENDING.value
    assert row.not_before == row.retry_due_at > before.published_at, "due at its retry time"
    return run.id


def test_a_republished_retry_keeps_no_time_of_the_delivery_before_it(
    run_store: RunStore, store: Store
) -> None:
    """Chaos run 20261204: the reaper published a retry again (its worker had died holding
    the retry's message) and PostgreSQL crashed before the leader marked it published.
    The next delivery was taken by a worker, whose guard keeps a recorded publish time
    (coalesce): the row then paired the first publication (on time for the fire time) with
    the retry's due time, and read as published 1.082 s before it was due.
    Finding chaos early (seed 20261204) of issue 15."""
    from tests.chaos.checks import Verdict, _check_never_early

    run_id = _retry_held_by_a_dead_worker(run_store, store)
    # Published again, but the leader's mark is lost (PostgreSQL crashed); the worker that
    # takes the message cannot record its receipt either, then starts it.
    assert start(run_store, run_id, "c", retries=1, may_create=False) == Started(attempt=2)
    assert run_store.finish(run_id, owner="c", state=RunState.SUCCEEDED)

    [row] = run_rows(store)
    assert row.published_at is not None, "the worker that took the message records it"
    assert row.published_at >= row.not_before
    assert row.received_at is None
    assert row.started_at >= row.not_before
    verdict = Verdict()
    _check_never_early(verdict, [row])
    assert verdict.early == []


def test_a_retry_put_back_in_the_outbox_that_never_starts_again_reads_as_never_early(
    run_store: RunStore, store: Store
) -> None:
    """The reaper's republished retry expires before any worker starts it: the row keeps no
    time of the attempt before (started before the retry was due)."""
    from tests.chaos.checks import Verdict, _check_never_early

    run_id = _retry_held_by_a_dead_worker(run_store, store)
    passed = store.now() - timedelta(seconds=1)
    assert run_store.end_discarded(run_id, expires=passed, owner="x:received") == "expired"

    [row] = run_rows(store)
    assert row.state == RunState.EXPIRED.value
    verdict = Verdict()
    _check_never_early(verdict, [row])
    assert verdict.early == []
    assert (row.attempt, row.retries) == (1, 1), "the attempt that ran is still counted"


def test_a_retry_whose_worker_died_running_it_after_its_due_time_keeps_no_earlier_time(
    run_store: RunStore, store: Store
) -> None:
    """Chaos run seed 1 (50 s, with 2,000 crons firing together): a retry was running when
    its worker stopped past its lease, after the retry was due. The reaper put it back
    due at its retry time but kept the times of the first delivery (published before the
    retry was due); the next delivery's mark was lost, and the row read as published
    10.091 s before it was due."""
    from tests.chaos.checks import Verdict, _check_never_early
    from tests.integration.store.test_store import planner

    Schedules(store).create("retrying", "t", at=datetime.now(UTC), allow_unregistered=True)
    assert store.take_leadership(1, "leader")
    [run] = store.claim_due(1, batch=10, plan=planner).runs
    assert store.mark_published([run.id]) == 1
    assert isinstance(start(run_store, run.id, "a", may_create=False), Started)
    assert run_store.finish(run.id, owner="a", state=RunState.RETRYING, retries=1, retry_in=0.3)
    time.sleep(0.4)  # the retry is due; worker b runs it, then stops past its lease
    assert start(run_store, run.id, "b", retries=1, may_create=False) == Started(attempt=2)
    expire_leases(store)

    reclaim = store.reclaim(1, stale_queued_after=3600, limit=100)

    assert [again.id for again in reclaim.runs] == [run.id]
    [row] = run_rows(store)
    assert row.state == RunState.PENDING.value
    assert row.not_before == row.retry_due_at
    verdict = Verdict()
    _check_never_early(verdict, [row])
    assert verdict.early == [], "no time of a delivery before its retry was due is kept"


def test_a_plain_retry_ended_lost_by_the_reaper_keeps_its_times_consistent(
    run_store: RunStore, store: Store
) -> None:
    """Chaos sweep seed 7: a plain task's retry was running when its worker stopped past
    its lease, after the retry was due; the reaper ended it ``lost`` (a plain body that
    started is never sent again) but still moved its ``not_before`` to the retry's due
    time, after the first publication it kept. The body then returned and recorded its
    outcome, and the row read as published 25 s before it was due. A run that is not
    sent again keeps its ``not_before``."""
    from tests.chaos.checks import Verdict, _check_never_early
    from tests.integration.store.test_store import planner

    Schedules(store).create("plain", "t", at=datetime.now(UTC), allow_unregistered=True)
    assert store.take_leadership(1, "leader")
    [run] = store.claim_due(1, batch=10, plan=planner).runs
    assert store.mark_published([run.id]) == 1
    first = run_store.receive_plain(run.id, owner="a", worker="a", lease_seconds=30, retries=0)
    assert isinstance(first, Started)
    assert isinstance(run_store.start_plain(run.id, owner="a", attempt=first.attempt), Started)
    assert run_store.finish_plain(run.id, state=RunState.RETRYING, attempt_retries=0, retry_in=0.3)
    time.sleep(0.4)  # the retry is due; worker b takes it, starts it, then stops
    retry = run_store.receive_plain(run.id, owner="b", worker="b", lease_seconds=30, retries=1)
    assert isinstance(retry, Started)
    assert isinstance(run_store.start_plain(run.id, owner="b", attempt=retry.attempt), Started)
    expire_leases(store)
    assert store.reclaim(1, stale_queued_after=3600, limit=100).runs == []
    assert run_store.finish_plain(run.id, state=RunState.SUCCEEDED, attempt_retries=1)

    [row] = run_rows(store)
    assert row.state == RunState.SUCCEEDED.value
    verdict = Verdict()
    _check_never_early(verdict, [row])
    assert verdict.early == [], "the row reads as published before it was due"


def test_a_retry_starts_with_no_recovery_sends_of_the_message_before_it(
    run_store: RunStore, store: Store
) -> None:
    """A retry is a message of its own: copies lost-message recovery sent of the
    message before it do not count against it (``MAX_SENDS``). Before, an unsent retry
    of a run whose first message had been recovered twice ended ``lost`` at its first
    recovery, as if a consumer that records nothing had taken 3 copies."""
    from tests.integration.store.test_store import planner

    Schedules(store).create("plain", "t", at=datetime.now(UTC), allow_unregistered=True)
    assert store.take_leadership(1, "leader")
    [run] = store.claim_due(1, batch=10, plan=planner).runs
    assert store.mark_published([run.id]) == 1
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE beat_runs SET recovery_sends = 2"))
    taken = run_store.receive_plain(run.id, owner="a", worker="a", lease_seconds=30, retries=0)
    assert isinstance(taken, Started)
    assert isinstance(run_store.start_plain(run.id, owner="a", attempt=taken.attempt), Started)
    assert run_store.finish_plain(run.id, state=RunState.RETRYING, attempt_retries=0, retry_in=1)

    [row] = run_rows(store)
    assert (row.state, row.recovery_sends) == (RunState.RETRYING.value, 0)
