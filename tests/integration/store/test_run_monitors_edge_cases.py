"""The run monitors at their edges, against real PostgreSQL (``beat.store.leader.run_monitors``,
``beat.monitors.timing``): a revoke acts only on the attempt it judged; one schedule's
many overruns hide no other's; retries, runs sent again, operators' runs, jitter,
cancel_previous and a window's end neither open false incidents nor resolve true ones;
a removed schedule's resolution goes where its opening went; the form reads back what
it shows. Each was found by reviewing the monitors, and failed before they were fixed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, text, update

from beat.claim.policies import plan_fires
from beat.errors import InvalidSchedule
from beat.models import DueSchedule, FirePlan, IncidentKind, RunState
from beat.ops.schedules import Schedules
from beat.ops.user_input import duration_seconds
from beat.store.all_roles import Store
from beat.store.leader import run_monitors
from beat.store.runs import RunStore
from beat.store.tables import notifications, runs
from beat.ui import forms
from tests.conftest import SessionEnv
from tests.integration.helpers import make_due
from tests.integration.store import test_run_monitors
from tests.integration.store.test_run_monitors import open_incidents, run, run_row, watch

pytestmark = pytest.mark.integration

#: The fixture of the run monitors' tests, shared.
api = test_run_monitors.api

TASK = "tasks.demo.add"


@pytest.fixture
def worker(test_env: SessionEnv) -> Iterator[RunStore]:
    """A worker's view of the runs (the idempotency guard), on a connection of its own."""
    store = RunStore.connect(test_env.database_url)
    yield store
    store.dispose()


def start(worker: RunStore, run_id: uuid.UUID, owner: str, *, retries: int = 0) -> None:
    """A delivery of the idempotent base takes the run (``RunGuard.start``)."""
    started = worker.start(
        run_id,
        owner=owner,
        worker=owner,
        lease_seconds=300,
        task=TASK,
        args=[],
        kwargs={},
        options={},
        retries=retries,
        max_attempts=3,
        may_create=False,
    )
    assert type(started).__name__ == "Started", started


# -- overran: a revoke acts only on the attempt it judged -------------------------------


def test_a_revoke_never_ends_an_attempt_that_started_after_the_overrun_was_read(
    store: Store, api: Schedules, worker: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding: ``_end_revoked`` ends ``failed`` every run of the IDs it read that is
    still ``running``, without checking that it is still the attempt read, past
    max_runtime. Celery's retry of the hung attempt (same run ID, a new attempt started
    now) that starts between the pass's SELECT and its UPDATE (READ COMMITTED: the UPDATE
    sees it) is ended ``failed`` and terminated a moment after it started: a legitimate
    run ended, and its retry lost."""
    api.create(
        "hung",
        TASK,
        every=3600,
        allow_unregistered=True,
        max_runtime=60,
        revoke_after_max_runtime=True,
    )
    hung = run(
        store,
        "hung",
        fired=timedelta(minutes=3),
        started=timedelta(minutes=2),
        state=RunState.RUNNING,
        owner="w1",
    )
    original = run_monitors._end_revoked

    def retried_in_between(conn: Any, rows: Any, report: Any) -> bool:
        # The hung attempt asks for a retry (countdown 0), which another worker starts:
        # both committed after the pass read the overrun, before it ends the run.
        assert worker.finish(hung, owner="w1", state=RunState.RETRYING, retries=1, retry_in=0)
        start(worker, hung, "w2", retries=1)
        return original(conn, rows, report)

    monkeypatch.setattr(run_monitors, "_end_revoked", retried_in_between)

    report = watch(store)

    row = run_row(store, hung)
    assert (row.state, row.lease_owner, row.retries) == ("running", "w2", 1)
    assert report.revoke == []


def test_a_run_past_max_runtime_is_revoked_whatever_other_schedules_have_running(
    store: Store, api: Schedules
) -> None:
    """Finding: the overrun query reads at most BATCH (500) runs, oldest start first,
    across every schedule. A schedule whose runs pile up past their max_runtime (a hung
    job every minute, overlap allowed, no revoke: 500 runs in about 8 hours) fills the
    batch for ever: no other schedule's overran incident opens and no run of a schedule
    with revoke_after_max_runtime is revoked any more (nor does an open incident
    resolve, since the batch is full)."""
    api.create("pile", TASK, every=60, allow_unregistered=True, max_runtime=60)
    api.create(
        "hung",
        TASK,
        every=3600,
        allow_unregistered=True,
        max_runtime=60,
        revoke_after_max_runtime=True,
    )
    pile = store.get_schedule("pile")
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO beat_runs (id, schedule_id, schedule_name, task, state, fire_at,"
                " claimed_at, published_at, started_at, attempt)"
                " SELECT gen_random_uuid(), :sid, 'pile', :task, 'running',"
                "        now() - make_interval(hours => 10) + make_interval(mins => i),"
                "        now() - make_interval(hours => 10) + make_interval(mins => i),"
                "        now() - make_interval(hours => 10) + make_interval(mins => i),"
                "        now() - make_interval(hours => 10) + make_interval(mins => i), 1"
                " FROM generate_series(1, :count) AS i"
            ),
            {"sid": pile.id, "task": TASK, "count": run_monitors.BATCH},
        )
    hung = run(
        store,
        "hung",
        fired=timedelta(minutes=3),
        started=timedelta(minutes=2),
        state=RunState.RUNNING,
        owner="w1",
    )

    report = watch(store)

    assert ("hung", IncidentKind.OVERRAN) in report.opened
    assert report.revoke == [str(hung)]
    assert run_row(store, hung).state == RunState.FAILED.value


# -- late ------------------------------------------------------------------------------


def test_a_retried_run_does_not_reopen_the_late_incident_of_an_older_run(
    store: Store, api: Schedules, worker: RunStore
) -> None:
    """Finding: the late monitor passes over a run Celery retried (``retries = 0``) by
    judging the newest run *before* it instead. Once the newest run, which started in
    time and resolved the late incident, asks for a retry, the pass judges the older,
    late run again and opens a new late incident (and notifies it) about a fire time
    whose lateness was already told and resolved."""
    api.create("report", TASK, every=60, allow_unregistered=True, late_after=30)
    run(
        store,
        "report",
        fired=timedelta(minutes=5),
        started=timedelta(minutes=3),
        state=RunState.SUCCEEDED,
    )
    assert watch(store).opened == [("report", IncidentKind.LATE)]
    on_time = run(
        store,
        "report",
        fired=timedelta(minutes=2),
        started=timedelta(minutes=2) - timedelta(seconds=1),
        state=RunState.RUNNING,
        owner="w1",
    )
    assert watch(store).resolved == [("report", IncidentKind.LATE)]

    assert worker.finish(on_time, owner="w1", state=RunState.RETRYING, retries=1, retry_in=60)
    again = watch(store)

    assert again.opened == []
    assert open_incidents(store, IncidentKind.LATE) == []


def test_cancel_previous_does_not_flap_the_incidents_of_an_old_run(
    store: Store, api: Schedules
) -> None:
    """Finding (same cause as the retry above, worse): the late and missed monitors pass
    over cancelled runs by judging the newest run before them. Under the overlap policy
    cancel_previous, each claim cancels the run still active, which started and was sent
    in time and had resolved both incidents; until the new run is late_after (or
    missed_after) old, the pass judges an old late, missed run again and reopens both
    incidents, to resolve them when the new run starts: open and resolved notifications
    every period, for a schedule that runs in time."""
    api.create(
        "busy",
        TASK,
        every=60,
        allow_unregistered=True,
        overlap_policy="cancel_previous",
        late_after=30,
        missed_after=30,
    )
    run(
        store,
        "busy",
        fired=timedelta(minutes=5),
        claimed=timedelta(minutes=3),
        started=timedelta(minutes=3),
        state=RunState.SUCCEEDED,
        first_published_at=store.now() - timedelta(minutes=3),  # sent 2 minutes late
    )
    assert sorted(watch(store).opened) == [
        ("busy", IncidentKind.LATE),
        ("busy", IncidentKind.MISSED),
    ]
    in_time = run(
        store,
        "busy",
        fired=timedelta(minutes=2),
        started=timedelta(minutes=2) - timedelta(seconds=1),
        state=RunState.RUNNING,
        owner="w1",
    )
    assert sorted(watch(store).resolved) == [
        ("busy", IncidentKind.LATE),
        ("busy", IncidentKind.MISSED),
    ]

    # The next fire time's claim cancels the run still running (``_cancel_active``).
    with store.engine.begin() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.id == in_time)
            .values(
                state=RunState.CANCELLED.value,
                finished_at=store.now(),
                reason="overlap (cancel_previous): a newer run of the schedule started",
                lease_owner=None,
                lease_expires_at=None,
            )
        )
    run(store, "busy", fired=timedelta(seconds=1), claimed=timedelta(0), state=RunState.PENDING)

    assert watch(store).opened == []


def test_a_run_the_reaper_sent_again_after_its_worker_died_is_not_late(
    store: Store, api: Schedules, worker: RunStore
) -> None:
    """Finding: every attempt of the idempotent base writes ``started_at`` anew, and the
    late monitor judges that (only Celery's retries are passed over, not the reaper's
    attempts). A run that started 1 s after its fire time, whose worker died, is sent
    again by the reaper and restarted minutes later: the monitor opens a late incident
    saying it "started 10m after its fire time", which is false."""
    api.create("etl", TASK, every=3600, allow_unregistered=True, late_after=30)
    crashed = run(
        store,
        "etl",
        fired=timedelta(minutes=10),
        started=timedelta(minutes=10) - timedelta(seconds=1),
        state=RunState.RUNNING,
        owner="dead-worker",
        lease=-timedelta(seconds=5),  # its lease ran out: the worker is gone
    )
    reclaimed = store.reclaim(1, stale_queued_after=3600, limit=100, idle_timeout=5)
    assert [r.id for r in reclaimed.runs] == [crashed]
    start(worker, crashed, "w2")
    assert worker.finish(crashed, owner="w2", state=RunState.SUCCEEDED)

    assert watch(store).opened == []


def test_a_run_that_expired_without_starting_does_not_resolve_a_late_incident(
    store: Store, api: Schedules
) -> None:
    """Finding: ``timing.late`` measures a run that never started up to its
    ``finished_at``; a run that expired before any worker started it (``expires``
    shorter than ``late_after``: the workers are all busy or down) therefore counts as
    "in time" and resolves the open late incident, with the resolution "the run due ...
    never started: it ended expired". The docs resolve it only when "a newer run starts
    in time"; while every run expires unstarted, no late incident ever opens at all."""
    api.create("rates", TASK, every=60, allow_unregistered=True, late_after=30)
    run(
        store,
        "rates",
        fired=timedelta(minutes=3),
        started=timedelta(minutes=2),
        state=RunState.SUCCEEDED,
    )
    assert watch(store).opened == [("rates", IncidentKind.LATE)]
    expired = run(store, "rates", fired=timedelta(minutes=1), state=RunState.EXPIRED)
    with store.engine.begin() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.id == expired)
            .values(finished_at=runs.c.fire_at + timedelta(seconds=5))
        )

    report = watch(store)

    assert report.resolved == []
    assert len(open_incidents(store, IncidentKind.LATE)) == 1


def test_a_plain_run_waiting_for_a_pool_process_is_not_told_as_ended(
    store: Store, api: Schedules
) -> None:
    """Finding (wording): a plain task's run is ``running`` from its receipt, before its
    body starts (``started_at`` NULL, e.g. prefetched behind busy pool processes).
    ``timing.late`` only knows pending/queued/retrying as waiting, so the late incident
    it opens says "the run due ... never started: it ended running", which tells the
    operator the run is over when it is still waiting to start."""
    api.create("plain", TASK, every=3600, allow_unregistered=True, late_after=30)
    run(
        store,
        "plain",
        fired=timedelta(minutes=2),
        state=RunState.RUNNING,
        owner="w1",
        plain=True,
        received_at=store.now() - timedelta(minutes=2),
    )

    assert watch(store).opened == [("plain", IncidentKind.LATE)]
    [incident] = open_incidents(store, IncidentKind.LATE)
    assert "ended" not in incident.last_error
    assert "has not started" in incident.last_error


def test_an_expired_backfilled_run_is_still_an_operators_run_neither_late_nor_missed(
    store: Store, api: Schedules, worker: RunStore
) -> None:
    """Finding: the monitors tell the runs an operator made (trigger, backfill) by their
    ``reason``, but the expiry of a run overwrites ``reason`` ("expired at ... before a
    worker started it"; so does the leader's expiry of a run without a message). A
    backfilled run of a schedule with ``expires`` (it expires at its old fire time +
    expires, i.e. at once) then counts as a fire time of the schedule: a new daily
    schedule backfilled over last week opens a false late incident ("never started: it
    ended expired", days late) and a false missed one ("claimed 1d 8h after it"). A
    triggered run that expires likewise resolves a true late incident."""
    api.create(
        "nightly",
        TASK,
        cron="0 3 * * *",
        allow_unregistered=True,
        late_after=30,
        missed_after=60,
        options={"expires": 300},
    )
    now = store.now()
    backfilled = api.backfill(
        "nightly", start=now - timedelta(days=3), end=now - timedelta(days=1), limit=3
    )
    assert backfilled
    for made in backfilled:
        assert made.fire_at is not None
        # A worker receives its message: expired by the database's clock, it ends so.
        assert worker.expire_if_past(made.id, made.fire_at + timedelta(seconds=300))
        assert run_row(store, made.id).state == RunState.EXPIRED.value

    report = watch(store)

    assert report.opened == []


# -- missed ----------------------------------------------------------------------------


def test_a_run_the_reaper_sent_again_was_not_claimed_late(store: Store, api: Schedules) -> None:
    """Finding: the reaper (and lost-message recovery) set ``claimed_at`` to the time they
    put a run back in the outbox; the missed monitor reads it as the claim of the fire
    time. A run claimed and sent in time, whose worker died ten minutes in, opens a
    missed incident "the fire time ... was claimed 10m after it" (kept until the next
    fire time, an hour later here): false, and told to every channel."""
    api.create("hourly", TASK, every=3600, allow_unregistered=True, missed_after=60)
    crashed = run(
        store,
        "hourly",
        fired=timedelta(minutes=10),
        started=timedelta(minutes=10) - timedelta(seconds=1),
        state=RunState.RUNNING,
        owner="dead-worker",
        lease=-timedelta(seconds=5),
    )
    reclaimed = store.reclaim(1, stale_queued_after=3600, limit=100, idle_timeout=5)
    assert [r.id for r in reclaimed.runs] == [crashed]

    report = watch(store)

    assert report.opened == []
    assert open_incidents(store, IncidentKind.MISSED) == []


def test_a_run_held_back_by_its_jitter_is_not_a_missed_fire_time(
    store: Store, api: Schedules
) -> None:
    """Finding: a jittered run waits in the outbox until its ``not_before`` (fire time +
    up to ``jitter``) by design, yet the missed monitor reads a run pending unsent past
    ``missed_after`` as "was not sent: its run waits in the outbox". With a jitter longer
    than missed_after (neither refused by ``define`` nor mentioned in the docs, which
    only warn about late_after), healthy runs open missed incidents. Either refusing
    such a definition or judging the run from its ``not_before`` would do."""
    try:
        api.create("spread", TASK, every=3600, allow_unregistered=True, jitter=600, missed_after=60)
    except InvalidSchedule:
        return  # refused up front: no false incident can follow
    run(
        store,
        "spread",
        fired=timedelta(minutes=3),
        state=RunState.PENDING,
        sent=False,
        not_before=store.now() + timedelta(minutes=4),  # its jitter: 7 minutes
    )

    assert watch(store).opened == []


def test_the_last_fire_time_of_a_window_left_unsent_is_missed(store: Store, api: Schedules) -> None:
    """Finding: the claim of a schedule's last fire time (``max_runs`` reached, or past
    ``end_at``) disables the schedule in the same transaction, and the missed monitor
    reads every disabled schedule as paused ("its schedule is paused": Cleared). So the
    last fire time of a window is never judged: left unsent in the outbox (a leader
    that cannot publish), no missed incident opens, and an open one is resolved as if
    an operator had paused the schedule."""

    def planner(due: DueSchedule, now: Any, until: Any = None) -> FirePlan:
        return plan_fires(due, now, until=until, misfire_grace=60, max_catchup=100)

    api.create("once-more", TASK, every=3600, allow_unregistered=True, max_runs=1, missed_after=60)
    make_due(store, seconds_ago=0.5)
    [claimed] = store.claim_due(1, batch=10, plan=planner).runs
    assert not api.get("once-more").definition.enabled  # its window is over
    with store.engine.begin() as conn:  # five minutes on, still not sent
        conn.execute(
            update(runs)
            .where(runs.c.id == claimed.id)
            .values(
                fire_at=runs.c.fire_at - timedelta(minutes=5),
                claimed_at=runs.c.claimed_at - timedelta(minutes=5),
            )
        )
    assert run_row(store, claimed.id).state == RunState.PENDING.value

    assert watch(store).opened == [("once-more", IncidentKind.MISSED)]


# -- notifications ---------------------------------------------------------------------


def test_the_resolution_of_a_removed_schedules_incident_goes_to_its_own_channels(
    store: Store, api: Schedules
) -> None:
    """Finding: an incident of a removed schedule is resolved with ``schedule_id`` None
    (``resolve_orphans``, here and in the failing monitor), which
    ``enqueue_notifications`` reads as the cluster's stall: the "resolved" notification
    goes to every channel, including the channels that were never told it opened (another
    team's Slack), instead of the channels the schedule named."""
    api.add_webhook("team-a", "https://hooks.example.com/a")
    api.add_webhook("team-b", "https://hooks.example.com/b")
    api.create(
        "gone",
        TASK,
        every=3600,
        allow_unregistered=True,
        missed_after=60,
        channels=["team-a"],
    )
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE beat_schedules SET next_fire_at = now() - interval '5 minutes'"))
    assert watch(store).opened == [("gone", IncidentKind.MISSED)]

    api.delete("gone")
    assert watch(store).resolved == [("gone", IncidentKind.MISSED)]

    with store.engine.connect() as conn:
        told = sorted(conn.execute(select(notifications.c.event, notifications.c.channel)).all())
    assert told == [("opened", "team-a"), ("resolved", "team-a")]


# -- the UI's form ---------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [1_000_000.0, 1_234_567.0])
def test_the_edit_form_shows_a_long_max_runtime_its_own_parser_reads_back(
    store: Store, api: Schedules, seconds: float
) -> None:
    """Finding: the UI writes a monitor's seconds with ``:g`` (``_seconds_text``), so a
    max_runtime of 11.6 days or more (the API takes up to 3650 days) is shown as
    ``1e+06s`` or ``1.23457e+06s``: a text ``duration_seconds`` refuses (and rounded), so
    the edit form shows a value that cannot be submitted once touched."""
    api.create("long", TASK, every=86400, allow_unregistered=True, max_runtime=seconds)
    shown = forms.form_of(store.get_schedule("long")).values["max_runtime"]

    assert duration_seconds(shown) == seconds
