"""Fault injection in the normal test run: short chaos runs on fixed seeds.

Each run starts a mixed fleet on private PostgreSQL and Redis servers (3 beats,
4 prefork and threads workers, one worker without the package on the plain
tasks' queue, one beat and one worker 2 minutes ahead and one of each behind),
injects every fault kind at least once (kills, a leader and a worker paused past
their lease, server restarts mid-run, ``idle_session_timeout``, cut and stalled
links, broker message loss, a deploy), then checks from PostgreSQL that every
fire time ran exactly once, every effect exists once (wherever it ran), every
scheduled workflow (chain, group, chord, nested) succeeded with each step once, and
no run is stuck or early. The long version is ``scripts/chaos.sh`` (10 minutes by
default, random seed; ``--runs N`` for a number of runs).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import redis

from app.factory import create_app
from beat.models import RunState, Schedule
from beat.schedule.define import define
from beat.schedule.workflow import plan, stored_canvas, workflow_kwargs
from beat.store.plain_runs import CANCELLED_ON_CONNECTION_LOSS, TAKEN_UNRECORDED
from tests.chaos import servers
from tests.chaos.broker import delete_messages
from tests.chaos.checks import (
    FOREIGN_PREFIX,
    BadRow,
    DeletedMessage,
    Expectation,
    Observations,
    RedisOutage,
    SentChain,
    Verdict,
    _check_chains,
    _check_never_early,
    _check_not_expired_early,
    _check_not_started_after_expiry,
    _check_plain_run,
    _check_recorded_state,
    _check_retry_countdowns,
    _check_runs,
    _check_scheduling_through_outages,
    _message_lost,
    bad_row_violations,
    steps_by_workflow,
)
from tests.chaos.faults import FLEET_HOLD, FaultKind, durations, make_plan
from tests.chaos.harness import (
    NO_FAULT,
    NOT_PLACED,
    ChaosConfig,
    WorkerSlot,
    by_fault,
    format_by_fault,
    killable_workers,
    lines_naming,
    run_chaos,
)
from tests.chaos.servers import MissingBinaries, find_binaries
from tests.chaos.topologies import KINDS, Topology
from tests.chaos.workload import (
    BAD_ROWS,
    WORKFLOW_SHAPES,
    CodeSchedule,
    WorkloadShape,
    expectation_of,
)
from tests.conftest import IN_CI, SessionEnv
from tests.e2e.proxy import CuttableProxy

pytestmark = pytest.mark.chaos

#: (seed, seconds of faults) of the runs CI makes: every fault kind once (the first of
#: each kind alone takes about 90 s of the plan, a deploy included), then the end phase
#: (at least 50 s: a run the worker without the package executed could be sent again).
CI_RUNS = [(20261202, 30.0)]

#: A short seed of each other topology in CI (topology, seed, seconds of faults, kinds):
#: the topology's own server fault among the everyday deaths and pauses (every kind the
#: topologies share is in the run above). ``scripts/chaos.sh --topology T`` runs them all.
TOPOLOGY_CI_RUNS = [
    (
        Topology.RABBITMQ,
        20261206,
        10.0,
        (
            FaultKind.RABBITMQ_RESTART,
            FaultKind.REDIS_OUTAGE,
            FaultKind.WORKER_KILL,
            FaultKind.LEADER_PAUSE,
        ),
    ),
    (
        Topology.SENTINEL,
        20261206,
        10.0,
        (FaultKind.SENTINEL_FAILOVER, FaultKind.WORKER_KILL, FaultKind.BROKER_MESSAGE_LOSS),
    ),
    (
        Topology.PGBOUNCER,
        20261206,
        10.0,
        (FaultKind.PGBOUNCER_RESTART, FaultKind.BEAT_POSTGRES_STALL, FaultKind.BEAT_KILL),
    ),
]

#: Runs that once failed, kept to re-run the same fault plan: (seed, seconds, what it caught).
#: Replayed with ``HABEAT_CHAOS_REGRESSIONS=1`` (or ``scripts/chaos.sh --seed N --duration S``),
#: not in every test run: what each caught shows in any run, the CI run above included.
REGRESSION_RUNS: list[tuple[int, float, str]] = [
    (
        1,
        50.0,
        "the first run of the harness: beat syncs the project's demo jobs from code, and"
        " their runs (which write no effect) counted as lost and unexpected; the harness"
        " now pauses every schedule but its workload and judges only the workload's runs",
    ),
]


@pytest.fixture(scope="module")
def servers_installed() -> None:
    try:
        find_binaries()
    except MissingBinaries as exc:
        if IN_CI:
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


def run_and_check(
    seed: int,
    duration: float,
    topology: Topology = Topology.DIRECT,
    only: tuple[FaultKind, ...] = (),
    *,
    workflows: bool = True,
) -> None:
    # The skewed fleet, without the worker that lacks the package: that one has no
    # guard against a message the broker hands out twice (a delivery restored to the
    # queue after a Redis restart while it ran it), and runs such a copy again, which
    # no code in this package can prevent on a worker without it. The mixed fleet is
    # run by scripts/chaos.sh (the default) and by tests/e2e/test_mixed_fleet.py.
    config = ChaosConfig(
        seed=seed,
        duration=duration,
        foreign_worker=False,
        topology=topology,
        only=only,
        workload=WorkloadShape() if workflows else WorkloadShape(workflow_every=0),
    )
    try:
        report = run_chaos(config)
    except MissingBinaries as exc:  # a topology's server (RabbitMQ, a sentinel, PgBouncer)
        if IN_CI:
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    print(report.summary())
    assert not report.violations, f"{report.summary()}\n{report.logs_tail[-30000:]}"
    # Not asserted: that a paused leader was replaced while stopped. A pause that
    # lands inside a claim transaction holds the leader row, and the takeover waits
    # for it by design (up to the claim's idle timeout, longer than some pauses).
    assert set(report.log.injected) == set(config.kinds), "every fault kind was injected"


@pytest.mark.timeout(420)
@pytest.mark.parametrize(("seed", "duration"), CI_RUNS)
def test_a_short_chaos_run_keeps_every_guarantee(
    servers_installed: None, seed: int, duration: float
) -> None:
    # The workflow schedules run in the other topologies' seeds and in the long runs
    # (scripts/chaos.sh); on this seed they are not yet proven green run after run.
    run_and_check(seed, duration, workflows=False)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("topology", "seed", "duration", "only"), TOPOLOGY_CI_RUNS)
def test_a_short_chaos_run_on_another_topology_keeps_every_guarantee(
    servers_installed: None,
    topology: Topology,
    seed: int,
    duration: float,
    only: tuple[FaultKind, ...],
) -> None:
    # On RabbitMQ a chord's body published by the result backend as the broker restarts
    # can be lost with no recovery there (lost-message recovery cannot read its queues):
    # its workflow waits for the reaper's visibility-timeout rule. Until that is closed,
    # this seed runs without the workflow schedules.
    run_and_check(seed, duration, topology, only, workflows=topology is not Topology.RABBITMQ)


@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    ("seed", "duration"), [(seed, duration) for seed, duration, _ in REGRESSION_RUNS]
)
def test_a_seed_that_once_failed_passes(
    servers_installed: None, seed: int, duration: float
) -> None:
    if not os.environ.get("HABEAT_CHAOS_REGRESSIONS"):
        pytest.skip("set HABEAT_CHAOS_REGRESSIONS=1 to replay the seeds that once failed")
    run_and_check(seed, duration)


# -- the plan and the proxy (no servers needed) ---------------------------------------------


def test_a_seed_always_gives_the_same_plan() -> None:
    assert make_plan(7, 60, lock_ttl=3, lease_timeout=4) == make_plan(
        7, 60, lock_ttl=3, lease_timeout=4
    )
    assert make_plan(7, 60, lock_ttl=3, lease_timeout=4) != make_plan(
        8, 60, lock_ttl=3, lease_timeout=4
    )


@pytest.mark.parametrize("topology", list(Topology))
@pytest.mark.parametrize("seed", range(20))
def test_every_plan_has_every_kind_and_no_outage_reaches_the_misfire_grace(
    seed: int, topology: Topology
) -> None:
    config = ChaosConfig(seed=seed, duration=10, topology=topology)
    plan = make_plan(
        seed,
        config.duration,
        lock_ttl=config.lock_ttl,
        lease_timeout=config.lease_timeout,
        kinds=config.kinds,
    )
    assert {fault.kind for fault in plan} == set(KINDS[topology])
    # A beat leads on PostgreSQL's row through the lease's Redis outage: it stops no
    # scheduling, but is kept within half the grace should the fallback fail.
    assert all(
        fault.duration < config.misfire_grace / (2 if fault.kind is FaultKind.REDIS_OUTAGE else 4)
        for fault in plan
    )
    assert [fault.at for fault in plan] == sorted(fault.at for fault in plan)


def test_the_direct_topologys_plans_are_the_plans_seeds_gave_before_topologies() -> None:
    # Recorded seeds (CI's, the regressions', the benchmark pages') replay the same faults.
    plan = make_plan(20261202, 30.0, lock_ttl=3, lease_timeout=4)
    assert [fault.kind for fault in plan[:3]] == [
        FaultKind.BEAT_POSTGRES_CUT,
        FaultKind.BEAT_REDIS_STALL,
        FaultKind.BEAT_REDIS_CUT,
    ]
    assert not {FaultKind.RABBITMQ_RESTART, FaultKind.SENTINEL_FAILOVER} & {
        fault.kind for fault in make_plan(20261202, 600.0, lock_ttl=3, lease_timeout=4)
    }


def test_a_short_run_injects_only_the_kinds_it_names() -> None:
    config = ChaosConfig(
        seed=1,
        duration=10,
        topology=Topology.RABBITMQ,
        only=(FaultKind.WORKER_KILL, FaultKind.RABBITMQ_RESTART),
    )
    assert config.kinds == (FaultKind.WORKER_KILL, FaultKind.RABBITMQ_RESTART)
    assert "--topology rabbitmq --only WORKER_KILL,RABBITMQ_RESTART" in config.reproduce()


def test_a_message_loss_stops_the_workers_for_less_than_their_lease() -> None:
    low, high = durations(lock_ttl=3.0, lease_timeout=4.0)[FaultKind.BROKER_MESSAGE_LOSS]
    assert 0 < low <= high < 4.0


def test_a_redis_outage_outlasts_the_hold_of_the_fleets_settings() -> None:
    config = ChaosConfig(seed=1, duration=10, topology=Topology.RABBITMQ)
    low, _ = durations(config.lock_ttl, config.lease_timeout, hold=config.leader_hold)[
        FaultKind.REDIS_OUTAGE
    ]
    assert config.leader_hold == FLEET_HOLD
    assert low > config.leader_hold + config.lock_ttl  # whoever led on Redis lost the row


def test_a_pause_outlasts_the_lease_with_room_for_a_takeover() -> None:
    low, _ = durations(lock_ttl=3.0, lease_timeout=4.0)[FaultKind.LEADER_PAUSE]
    assert low >= 3.0 + 2 * 1.0  # TTL, then up to one standby poll and the takeover


def test_a_stalled_proxy_holds_bytes_until_it_flows_again() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        received: list[bytes] = []

        def echo_once() -> None:
            conn, _ = server.accept()
            with conn:
                received.append(conn.recv(100))
                conn.sendall(b"pong")

        threading.Thread(target=echo_once, daemon=True).start()
        proxy = CuttableProxy("127.0.0.1", server.getsockname()[1])
        try:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
                proxy.stall()
                client.sendall(b"ping")
                time.sleep(0.5)
                assert received == [], "nothing gets through a stall"
                proxy.unstall()
                assert client.recv(100) == b"pong"
                assert received == [b"ping"]
        finally:
            proxy.close()


def test_missing_servers_are_named_with_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(servers, "POSTGRES_BIN_GLOB", "/nonexistent/*/bin")
    with pytest.raises(MissingBinaries) as raised:
        find_binaries()
    message = str(raised.value)
    assert "initdb, pg_ctl, redis-server not found" in message
    assert "apt-get install postgresql redis-server" in message
    assert "\n" not in message


# -- findings --------------------------------------------------------------------------------


def test_plan_kills_never_interrupt_one_run_more_than_the_product_excuses() -> None:
    """Seed 966478 killed the worker holding the same run on each of its 3 attempts, and
    the run ended lost. The product now excuses attempts whose worker died (see
    tests/integration/store/test_runs.py, finding 966478), up to MAX_INTERRUPTIONS; the
    plan's kills spare a worker holding a run they interrupted that often."""
    workers = [WorkerSlot(index=index) for index in range(3)]
    twice, fresh = uuid.uuid4(), uuid.uuid4()
    held = {"w0g0": (twice,), "w1g0": (fresh,)}
    interrupted = Counter({twice: 2, fresh: 1})
    aimed = killable_workers(workers, held, interrupted, max_kills_per_run=2, aimed=True)
    assert [slot.name for slot in aimed] == ["w1g0"]
    anyone = killable_workers(workers, held, interrupted, max_kills_per_run=2, aimed=False)
    assert [slot.name for slot in anyone] == ["w1g0", "w2g0"]
    interrupted[fresh] += 1
    assert killable_workers(workers, held, interrupted, max_kills_per_run=2, aimed=True) == [
        workers[2]
    ], "with no busy worker left to kill, an aimed kill takes an idle one"


def test_chaos_sh_installs_the_dev_extra_before_running() -> None:
    """After the quickstart (base package only), chaos.sh failed: No module named 'pytest'.
    Finding chaos.sh."""
    script = (Path(__file__).resolve().parents[2] / "scripts" / "chaos.sh").read_text()
    install = script.index("pip install --quiet -e '.[dev]'")
    assert install < script.index("exec .venv/bin/python -m tests.chaos")
    assert "-m venv .venv" in script


# -- the new kinds of work and faults --------------------------------------------------------


def _run_row(**values: Any) -> SimpleNamespace:
    fire_at = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    row = {
        "id": uuid.uuid4(),
        "schedule_name": "plain-0",
        "fire_at": fire_at,
        "state": RunState.SUCCEEDED,
        "reason": None,
        "error": None,
        "attempt": 1,
        "worker": "w0g0@host",
        "started_at": fire_at + timedelta(seconds=0.1),
        "received_at": fire_at + timedelta(seconds=0.1),
        "plain": True,
    }
    return SimpleNamespace(**(row | values))


@pytest.mark.parametrize(
    ("state", "worker", "effects", "violation"),
    [
        (RunState.SUCCEEDED, "w0g0@host", 1, None),
        (RunState.SUCCEEDED, "w0g0@host", 0, "lost"),
        (RunState.SUCCEEDED, "w0g0@host", 2, "duplicated"),
        (RunState.LOST, "w0g0@host", 0, None),  # its worker was killed: interrupted
        (RunState.LOST, "w0g0@host", 1, None),  # killed after its own commit
        (RunState.LOST, "w1g0@host", 0, "lost"),  # its worker died by itself
        (RunState.LOST, "w1g0@host", 1, None),  # Celery cut its body off: interrupted
        (RunState.RUNNING, "w0g0@host", 0, "stuck"),
        (RunState.QUEUED, None, 0, "stuck"),
    ],
)
def test_a_plain_run_may_end_lost_only_when_the_plan_killed_its_worker(
    state: RunState, worker: str | None, effects: int, violation: str | None
) -> None:
    verdict = Verdict()
    cut_off = state == RunState.LOST and effects == 1 and worker == "w1g0@host"
    row = _run_row(
        state=state, worker=worker, error=CANCELLED_ON_CONNECTION_LOSS if cut_off else None
    )
    _check_plain_run(verdict, row, effects, "run", killed={"w0g0"})
    found = {name for name in ("lost", "duplicated", "stuck") if getattr(verdict, name)}
    assert found == ({violation} if violation else set())
    interrupted = state == RunState.LOST and violation is None
    assert len(verdict.counts.plain_interrupted) == int(interrupted)


@pytest.mark.parametrize(
    ("after_the_window", "reason", "effects", "violation"),
    [
        (True, "its schedule was paused before its fire time", 0, None),
        (True, "its schedule was paused before its fire time", 1, "duplicated"),
        (False, "its schedule was paused before its fire time", 0, "lost"),
        (True, "overlap (cancel_previous): a newer run of the schedule started", 0, "lost"),
    ],
)
def test_only_a_run_the_end_phase_paused_before_its_time_may_end_cancelled(
    after_the_window: bool, reason: str, effects: int, violation: str | None
) -> None:
    """The end phase pauses every schedule: runs claimed ahead of later fire times are
    cancelled then, and must not have run."""
    row = _run_row(
        state=RunState.CANCELLED, reason=reason, schedule_name="every-second-0", retries=0
    )
    window_end = row.fire_at + timedelta(seconds=-1 if after_the_window else 1)
    verdict = Verdict()
    effects_of = Counter({str(row.id): effects})
    _check_runs(verdict, [row], effects_of, [], set(), window_end)
    found = {name for name in ("lost", "duplicated", "stuck") if getattr(verdict, name)}
    assert found == ({violation} if violation else set())
    # The worker without the package ran it before the pause (nothing recorded it): once
    # is right, twice is not.
    verdict = Verdict()
    _check_runs(
        verdict, [row], effects_of, [], set(), window_end, foreign_runs=frozenset({str(row.id)})
    )
    if after_the_window and effects:
        assert not verdict.duplicated
        assert verdict.counts.plain_by_foreign == 1


def test_a_run_started_after_its_expiry_is_a_violation() -> None:
    verdict = Verdict()
    on_time = _run_row(started_at=_run_row().fire_at + timedelta(seconds=2.9))
    _check_not_started_after_expiry(verdict, on_time, 3.0, "on time")
    assert verdict.late == []
    late = _run_row(started_at=on_time.fire_at + timedelta(seconds=3.5))
    _check_not_started_after_expiry(verdict, late, 3.0, "late")
    # Started in time, interrupted, and its copy expired: not late (its effect is
    # checked with its outcome).
    interrupted = _run_row(state=RunState.EXPIRED, started_at=on_time.started_at)
    _check_not_started_after_expiry(verdict, interrupted, 3.0, "interrupted")
    expired_late = _run_row(state=RunState.EXPIRED, started_at=late.started_at)
    _check_not_started_after_expiry(verdict, expired_late, 3.0, "expired")
    assert [item.split(" ")[0] for item in verdict.late] == ["late", "expired"]


START = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _stored(code: CodeSchedule, every: float, version: int, updated_at: datetime) -> Schedule:
    """The deployed code schedule as stored: every ``every`` s from START, kwargs version."""
    definition = define(
        code.name, "chaos.versioned", every=every, kwargs={"version": version},
        start_at=START, default_tz="UTC",
    )  # fmt: skip
    return Schedule(
        id=1, definition=definition, next_fire_at=START, last_fire_at=None,
        created_at=START, updated_at=updated_at,
    )  # fmt: skip


def test_a_deploy_switches_the_expected_definition_at_its_sync(tmp_path: Path) -> None:
    code = CodeSchedule(path=tmp_path / "code.json")
    code.expectations.append(
        expectation_of("deployed", _stored(code, 3.0, 1, START), with_kwargs=True)
    )
    start = START
    stopped, synced = start + timedelta(seconds=10), start + timedelta(seconds=20.5)
    code.change(timing=True)
    code.deployed(
        _stored(code, 2.0, 2, synced),
        stopped_at=stopped,
        timing_changed=True,
        next_fire_when_stopped=start + timedelta(seconds=21),  # claimed ahead of the stop
    )
    old, new = code.expectations
    end = start + timedelta(seconds=30)
    assert old.fire_times(end)[-1] == start + timedelta(seconds=18)  # before the sync
    assert old.may_skip(start + timedelta(seconds=12))
    assert not old.may_skip(start)
    assert new.fire_times(end)[0] == start + timedelta(seconds=22)  # first after the sync
    assert not new.may_skip(start + timedelta(seconds=22))
    assert code.deploys[0].synced_at == synced
    assert (old.kwargs, new.kwargs) == ({"version": 1}, {"version": 2})
    on_time = start + timedelta(seconds=4, milliseconds=10)
    assert old.definition_certain(start + timedelta(seconds=4), on_time)
    assert not old.definition_certain(start + timedelta(seconds=6), None), "claimed late, maybe"
    # Seed 20261205: every beat killed, no claim until after the sync: the new kwargs.
    after_the_sync = synced + timedelta(seconds=7)
    assert not old.definition_certain(start + timedelta(seconds=1), after_the_sync)


def test_a_new_timing_follows_the_fire_time_missed_under_the_old_one(tmp_path: Path) -> None:
    """The product keeps the old timing's unclaimed fire time when it passed during the
    deploy, then the new timing's fire times after it (next_fire_after_retiming)."""
    code = CodeSchedule(path=tmp_path / "code.json")
    code.expectations.append(
        expectation_of("deployed", _stored(code, 3.0, 1, START), with_kwargs=True)
    )
    start = START
    stopped, synced = start + timedelta(seconds=10), start + timedelta(seconds=20.5)
    code.change(timing=True)
    code.deployed(
        _stored(code, 2.0, 2, synced),
        stopped_at=stopped,
        timing_changed=True,
        next_fire_when_stopped=start + timedelta(seconds=12),
    )
    old, new = code.expectations
    end = start + timedelta(seconds=30)
    assert old.fire_times(end)[-1] == start + timedelta(seconds=12), "kept, then the new timing"
    assert new.fire_times(end)[:2] == [start + timedelta(seconds=14), start + timedelta(seconds=16)]
    assert new.may_skip(start + timedelta(seconds=14)), "missed during the deploy"
    assert not new.may_skip(start + timedelta(seconds=22))


def test_a_new_timing_follows_a_fire_time_kept_through_deploys_in_a_row(tmp_path: Path) -> None:
    """Seed 20261205 (deployed-0, 07:11): every 2 s, then 3 s, then the kwargs alone, then
    4 s, every beat stopped again right after each sync, before any claim. The fire time
    the first retiming kept is still the next one at the third deploy: the product keeps
    it and follows it with the last timing's fire times (next_fire_after_retiming, and
    tests/integration/store/test_code_sync.py), so the 3-second timing's never come due, even
    though a kwargs-only deploy split it into two definitions."""
    code = CodeSchedule(path=tmp_path / "code.json")
    code.expectations.append(
        expectation_of("deployed", _stored(code, 2.0, 1, START), with_kwargs=True)
    )
    kept = START + timedelta(seconds=24)  # the last claim, ahead, stopped there

    def deploy(every: float, stopped: float, synced: float, *, timing: bool) -> None:
        code.change(timing=timing)
        code.deployed(
            _stored(code, every, code.version, START + timedelta(seconds=synced)),
            stopped_at=START + timedelta(seconds=stopped),
            timing_changed=timing,
            next_fire_when_stopped=kept,
        )

    deploy(3.0, stopped=15, synced=26.5, timing=True)
    deploy(3.0, stopped=26.6, synced=41.3, timing=False)
    deploy(4.0, stopped=41.4, synced=52.6, timing=True)

    end = START + timedelta(seconds=60)
    fire_times = [e.fire_times(end) for e in code.expectations]
    seconds = [[(at - START).total_seconds() for at in times] for times in fire_times]
    assert seconds[0][-1] == 24, "kept"
    assert seconds[1:3] == [[], []], "the 3-second timing never came due"
    assert seconds[3][:4] == [28, 32, 36, 40]
    last = code.expectations[3]
    assert all(last.may_skip(at) for at in fire_times[3] if at <= START + timedelta(seconds=52.6))
    assert not last.may_skip(START + timedelta(seconds=56))


def test_message_loss_deletes_waiting_and_unacked_messages_under_the_broker_prefix(
    test_env: SessionEnv, redis_client: redis.Redis
) -> None:
    app = create_app(test_env.settings())
    task_ids = [str(uuid.uuid4()) for _ in range(3)]
    for task_id in task_ids:
        app.send_task("e2e.record", args=["x"], task_id=task_id)
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue("celery")
        taken = queue.get(timeout=10)  # not acknowledged: it waits in the unacked hash
        deleted = delete_messages(redis_client, test_env.broker_key_prefix, share=1.0, seed="test")
        queue.close()
    taken_id = taken.headers["id"]
    assert sorted((d.task_id, d.where) for d in deleted) == sorted(
        (task_id, "unacked" if task_id == taken_id else "queue") for task_id in task_ids
    )
    prefix = test_env.broker_key_prefix
    assert redis_client.llen(f"{prefix}celery") == 0
    assert redis_client.hlen(f"{prefix}unacked") == 0
    assert redis_client.zcard(f"{prefix}unacked_index") == 0


def test_a_chain_may_stop_only_where_the_broker_lost_a_message_no_worker_took() -> None:
    first, second = _run_row(schedule_name=None), _run_row(schedule_name=None)
    first.finished_at = first.fire_at + timedelta(seconds=1)
    sent = first.fire_at

    def sent_chain(name: str, second_link: str) -> SentChain:
        ids = (str(first.id), second_link)
        return SentChain(chain_id=name, task_ids=ids, send_failed=False, sent_at=sent)

    chains = [
        sent_chain("done", str(second.id)),
        sent_chain("deleted", "chaos-chain-b"),
        sent_chain("restart", "chaos-chain-c"),
        sent_chain("broken", "chaos-chain-d"),
    ]
    deleted = [DeletedMessage(task_id="chaos-chain-b", deleted_at=sent, where="queue", state=None)]
    # The second links were sent when ``first`` finished, 5 s before Redis went down:
    restarts = [
        (first.finished_at + timedelta(seconds=5), first.finished_at + timedelta(seconds=7))
    ]
    seen = Observations(chains=chains, deleted=deleted, redis_restarts=restarts)
    verdict = Verdict()
    _check_chains(verdict, [first, second], Counter({str(first.id): 1, str(second.id): 1}), seen)
    counts = verdict.counts
    assert (counts.chains_completed, counts.chains_sent) == (1, 4)
    assert (counts.chains_cut_by_message_loss, counts.chains_cut_by_redis_restart) == (1, 2)
    # with the restart a minute later, the two chains without a second run are broken.
    verdict = Verdict()
    late = [(first.finished_at + timedelta(seconds=60), first.finished_at + timedelta(seconds=62))]
    _check_chains(verdict, [first, second], Counter(), replace(seen, redis_restarts=late))
    assert [item.split(" ")[1] for item in verdict.lost] == ["restart", "broken"]
    assert verdict.duplicated == []


def test_a_fire_time_not_run_must_say_why_and_only_where_allowed() -> None:
    start = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    window = (start + timedelta(seconds=10), start + timedelta(seconds=20))
    expectation = Expectation(
        name="x", kind="k", trigger=None, zone=UTC, first_fire=start,  # type: ignore[arg-type]
        expires=3.0, skippable=(window,),
    )  # fmt: skip
    verdict = Verdict()
    in_deploy = start + timedelta(seconds=12)
    _check_recorded_state(
        verdict, expectation, in_deploy, _run_row(state=RunState.SKIPPED, reason="misfire"), "a"
    )
    _check_recorded_state(verdict, expectation, in_deploy, _run_row(state=RunState.SKIPPED), "b")
    _check_recorded_state(
        verdict, expectation, start, _run_row(state=RunState.SKIPPED, reason="misfire"), "c"
    )
    _check_recorded_state(
        verdict, expectation, start, _run_row(state=RunState.EXPIRED, reason="expired"), "d"
    )
    _check_recorded_state(verdict, expectation, start, _run_row(state=RunState.EXPIRED), "e")
    assert [item.split(":")[0] for item in verdict.unexpected] == ["b", "c", "e"]
    assert verdict.counts.deploy_skipped == 1


# -- the mixed fleet: skewed clocks, a worker without the package ----------------------------

ROOT = Path(__file__).resolve().parents[2]
CHAOS_DIR = Path(__file__).resolve().parent


def _python(code: str, shim: str, **env: str) -> str:
    """Run ``code`` in a new interpreter with the shim directory ``shim`` first on PYTHONPATH."""
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=os.environ | {"PYTHONPATH": f"{CHAOS_DIR / shim}{os.pathsep}{ROOT}"} | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


def test_the_worker_without_the_package_cannot_import_it_and_knows_the_plain_tasks() -> None:
    code = """
import importlib.metadata
try:
    import beat
except ImportError:
    print("no beat")
commands = importlib.metadata.entry_points(group="celery.commands")
print("schedules" in [point.name for point in commands])
import os
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:1/0")
from tests.chaos.foreign_worker import app
print(sorted(name for name in app.tasks if name.startswith("chaos.")))
"""
    out = _python(code, "foreign").splitlines()
    assert out == ["no beat", "False", "['chaos.plain', 'chaos.plain_retrying']"]
    # The same environment without the shim has the package: the shim does the work.
    assert (
        "schedules"
        in subprocess.run(
            [sys.executable, "-m", "celery", "--help"], capture_output=True, text=True, check=True
        ).stdout
    )


def test_the_fleet_mixes_pools_skewed_clocks_and_a_worker_without_the_package() -> None:
    config = ChaosConfig(seed=1, duration=10)
    fleet = config.fleet()
    assert [(slot.pool, slot.skew, slot.foreign) for slot in fleet] == [
        ("prefork", 0.0, False),
        ("threads", 0.0, False),
        ("prefork", 120.0, False),
        ("threads", -120.0, False),
        ("threads", 0.0, True),
    ]
    assert fleet[-1].name.startswith(FOREIGN_PREFIX)
    assert config.beat_skews() == [0.0, 120.0, -120.0]
    uniform = ChaosConfig(seed=1, duration=10, clock_skew=0, foreign_worker=False)
    assert all(not slot.skew and not slot.foreign for slot in uniform.fleet())
    assert uniform.reproduce().endswith("--clock-skew 0 --without-foreign-worker")


@pytest.mark.parametrize(
    ("state", "effects", "by_foreign", "message_lost", "violation"),
    [
        (RunState.QUEUED, 1, True, False, set()),  # the worker without the package ran it
        # ... and a second message of it ran too (there, or on a worker that could not know
        # of the first): the mixed fleet's documented second execution, counted apart
        (RunState.QUEUED, 2, True, False, set()),
        (RunState.SUCCEEDED, 2, True, False, set()),
        (RunState.SUCCEEDED, 3, True, False, {"duplicated"}),  # copies are bounded: never 3
        (RunState.SUCCEEDED, 2, False, False, {"duplicated"}),  # twice on workers that record
        (RunState.QUEUED, 0, False, True, set()),  # its message was lost: visibility timeout
        (RunState.QUEUED, 0, False, False, {"stuck"}),
        # sent again after it ran, and a worker with the package runs it a second time
        (RunState.RUNNING, 1, True, False, {"stuck", "duplicated"}),
    ],
)
def test_a_plain_run_on_the_shared_queue_counts_every_execution(
    state: RunState, effects: int, by_foreign: bool, message_lost: bool, violation: set[str]
) -> None:
    verdict = Verdict()
    row = _run_row(state=state, worker=None, received_at=None, started_at=None)
    _check_plain_run(
        verdict, row, effects, "run", set(), by_foreign=by_foreign, message_lost=message_lost
    )
    found = {name for name in ("lost", "duplicated", "stuck") if getattr(verdict, name)}
    assert found == violation
    documented = effects == 2 and by_foreign
    assert len(verdict.counts.twice_with_foreign) == int(documented), "counted apart"


@pytest.mark.parametrize(("shared", "violation"), [(True, set()), (False, {"lost"})])
def test_a_plain_run_whose_message_came_back_on_a_shared_queue_may_end_lost(
    shared: bool, violation: set[str]
) -> None:
    """On a queue the worker without the package consumes too, a message that comes back
    with no worker having recorded it may have run there: the run ends ``lost``, which is
    the mixed fleet's documented gap; elsewhere it is a violation."""
    verdict = Verdict()
    row = _run_row(state=RunState.LOST, worker=None, error=TAKEN_UNRECORDED)
    _check_plain_run(verdict, row, 0, "run", set(), shared=shared)
    found = {name for name in ("lost", "duplicated", "stuck") if getattr(verdict, name)}
    assert found == violation
    assert len(verdict.counts.lost_to_unrecorded_consumers) == int(shared)


@pytest.mark.parametrize(("restart_after", "lost"), [(4.0, True), (15.0, False), (-60.0, False)])
def test_a_retry_whose_message_a_redis_restart_lost_waits_for_the_visibility_timeout(
    restart_after: float, lost: bool
) -> None:
    """A retry held for its countdown by the worker without the package, or waiting in
    the queue, is lost by a Redis restart between its sending and its due time: on that
    queue the run stays ``retrying`` until the visibility timeout, not stuck."""
    row = _run_row(state=RunState.RETRYING, worker="w1g0@host", retries=1)
    row.retry_due_at = row.started_at + timedelta(seconds=10)
    down = row.started_at + timedelta(seconds=restart_after)
    seen = Observations(redis_restarts=[(down, down + timedelta(seconds=2))])
    assert _message_lost(row, seen) is lost
    verdict = Verdict()
    _check_plain_run(verdict, row, 0, "run", set(), shared=True, message_lost=lost)
    assert bool(verdict.stuck) is not lost


@pytest.mark.parametrize(("silence", "stalled"), [(3.0, False), (17.0, False), (17.5, True)])
def test_scheduling_that_stops_longer_than_the_hold_while_redis_is_down_is_a_violation(
    silence: float, stalled: bool
) -> None:
    """Through an outage of the lease's Redis a beat leads on PostgreSQL's row: claims
    may pause for at most the row's hold (17 s here), wherever the silence falls."""
    down = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    up = down + timedelta(seconds=25)
    quiet_from = down + timedelta(seconds=2)
    claims = [down + timedelta(seconds=0.5 * step) for step in range(51)]
    rows = [
        SimpleNamespace(claimed_at=at)
        for at in claims
        if not quiet_from < at < quiet_from + timedelta(seconds=silence)
    ]
    rows.append(SimpleNamespace(claimed_at=quiet_from + timedelta(seconds=silence)))
    verdict = Verdict()
    outage = RedisOutage(down=down, up=up, hold=17.0, epochs=(4, 5))
    _check_scheduling_through_outages(verdict, rows, [outage])
    assert verdict.outage_gaps == [pytest.approx(max(silence, 0.5))]
    assert bool(verdict.stalled) is stalled
    assert any(item.startswith("stalled: no claim for") for item in verdict.violations) is stalled


def test_a_retry_taken_before_it_is_due_is_not_early_but_one_taken_before_its_fire_time_is() -> (
    None
):
    """A worker takes a retry's message at once and holds it for its countdown: its
    receipt may precede the retry's due time (``not_before``), never the fire time."""
    held = _run_row(published_at=None, not_before=None)
    held.not_before = held.fire_at + timedelta(seconds=10)
    held.published_at = held.not_before
    held.started_at = held.not_before + timedelta(seconds=0.1)
    taken_early = _run_row(published_at=None, not_before=None)
    taken_early.received_at = taken_early.fire_at - timedelta(seconds=1)
    verdict = Verdict()
    _check_never_early(verdict, [held, taken_early])
    assert [item.split(")")[0] + ")" for item in verdict.early] == [
        f"run {taken_early.id} (plain-0 at 12:00:00.000000)"
    ]


def test_a_plain_run_held_by_a_paused_worker_may_end_lost() -> None:
    verdict = Verdict()
    row = _run_row(state=RunState.LOST, worker="w1g0@host")
    _check_plain_run(verdict, row, 1, "run", set(), paused=True)
    assert not verdict.violations
    _check_plain_run(verdict, row, 1, "run", set(), paused=False)
    assert [item.split(":")[0] for item in verdict.violations] == ["lost"]


def test_a_run_that_ends_expired_before_its_expiry_is_a_violation() -> None:
    """A worker whose clock is ahead discards a run by its own clock."""
    fire_at = _run_row().fire_at
    verdict = Verdict()
    on_time = _run_row(state=RunState.EXPIRED, finished_at=fire_at + timedelta(seconds=3.1))
    _check_not_expired_early(verdict, on_time, 3.0, "on time")
    assert verdict.lost == []
    early = _run_row(state=RunState.EXPIRED, finished_at=fire_at + timedelta(seconds=0.01))
    _check_not_expired_early(verdict, early, 3.0, "early")
    assert [item.split(" ")[0] for item in verdict.lost] == ["early"]


def test_a_retry_started_before_its_countdown_is_early() -> None:
    start = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)

    def attempt(task: str, retries: int, at: float, countdown: float | None) -> SimpleNamespace:
        return SimpleNamespace(
            task_id=task, retries=retries, countdown=countdown, worker="w0g0@host",
            at=start + timedelta(seconds=at),
        )  # fmt: skip

    attempts = [
        attempt("on-time", 0, 0, 10.0), attempt("on-time", 1, 10.2, None),
        attempt("early", 0, 0, 10.0), attempt("early", 1, 8.0, 10.0),
        attempt("early", 2, 18.5, None),
        # a redelivered first attempt: the retry is measured from the first one
        attempt("again", 0, 0, 10.0), attempt("again", 0, 6, 10.0), attempt("again", 1, 10.5, None),
        # seed 20261207: a copy on the worker without the package reached retry 1 (a
        # database error's autoretry) before the attempt 0 of the copy that asked for it
        attempt("copy", 1, 0, None), attempt("copy", 0, 0.7, 10.0), attempt("copy", 1, 10.8, None),
    ]  # fmt: skip
    verdict = Verdict()
    _check_retry_countdowns(verdict, attempts)
    assert [item.split(":")[0] for item in verdict.early] == ["task early"]
    assert verdict.counts.retries_checked == 5


def test_violations_are_counted_under_the_faults_their_run_lived_through() -> None:
    start = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)

    def at(seconds: float) -> datetime:
        return start + timedelta(seconds=seconds)

    during, after, alone = (str(uuid.uuid4()) for _ in range(3))
    lives = {during: (at(5), at(6)), after: (at(25), at(26)), alone: (at(100), at(101))}
    timeline = [
        (FaultKind.POSTGRES_RESTART, at(4), at(7)),
        (FaultKind.WORKER_PAUSE, at(10), at(20)),  # its aftermath reaches 30 s
    ]
    violations = [
        f"duplicated: run {during} (plain-0 at 12:00:05): its effect happened 2 times",
        f"early: task {after}: retry 1 started on w0g0@h 3.000 s before its countdown",
        f"stuck: run {alone} (plain-1 at 12:01:40) (plain) is still queued (attempt 0)",
        "lost: plain-0 at 12:00:09.000000: no run",
    ]
    table = by_fault(violations, lives, timeline)
    assert table == {
        FaultKind.POSTGRES_RESTART: Counter({"executed twice": 1}),
        FaultKind.WORKER_PAUSE: Counter({"early": 1}),
        NO_FAULT: Counter({"stuck": 1}),
        NOT_PLACED: Counter({"lost": 1}),
    }
    assert "executed twice" in format_by_fault(table)[1]


def test_a_bad_row_must_be_quarantined_for_its_reason_and_never_fire() -> None:
    """Issue 29: the rows written with psql among the crowd (``BAD_ROWS``)."""
    bad = [BadRow(name=name, reason=reason) for name, (_, _, reason) in BAD_ROWS.items()]
    at = START
    right = {
        row.name: SimpleNamespace(enabled=False, quarantined_at=at, disabled_reason=row.reason)
        for row in bad
    }
    assert bad_row_violations(bad, right, {}) == []
    wrong = right | {
        "bad-end-infinity": SimpleNamespace(
            enabled=True, quarantined_at=None, disabled_reason=None
        ),
        "bad-zone-on-mars": SimpleNamespace(
            enabled=False, quarantined_at=at, disabled_reason="its fire times cannot be planned"
        ),
    }
    found = bad_row_violations(bad, wrong, {"bad-kwargs-10mb": 1})
    assert [line.split(" was ")[0].split(" made ")[0] for line in found] == [
        "bad row bad-end-infinity",
        "bad row bad-kwargs-10mb",
        "bad row bad-zone-on-mars",
    ]


def test_a_failure_shows_every_line_that_names_its_runs_last() -> None:
    """A stuck run's story is in the lines that name it, often long before the tail of
    the logs a failure prints: they come last, from every process."""
    run = uuid.uuid4()

    def process(name: str, *lines: str) -> SimpleNamespace:
        return SimpleNamespace(name=name, output=lambda: "\n".join(lines))

    chaos = SimpleNamespace(
        cluster=SimpleNamespace(
            processes=[
                process("w0g0", f"Task e2e.record[{run}] received", "Task other[x] received"),
                process("beat0", "nothing of it"),
                process("w1g0", f"run {run}: its lease let go"),
            ]
        )
    )
    shown = lines_naming(cast(Any, chaos), [f"stuck: run {run} (a at 12:00) is still queued"])
    assert shown.splitlines()[-2:] == [
        f"w0g0: Task e2e.record[{run}] received",
        f"w1g0: run {run}: its lease let go",
    ]
    assert lines_naming(cast(Any, chaos), []) == ""


def test_a_stuck_run_names_who_holds_its_lease() -> None:
    """A live holder renewing a lease keeps a run from every recovery: the verdict says
    who holds a stuck run, and until when."""
    verdict = Verdict()
    until = datetime(2026, 12, 6, 3, 59, 30, tzinfo=UTC)
    held = _run_row(state=RunState.RUNNING, worker="w0g0@host", lease_owner="w0g0@host:42:received")
    held.lease_expires_at = until
    _check_plain_run(verdict, held, 0, "run a", killed=set())
    _check_plain_run(
        verdict, _run_row(state=RunState.QUEUED, worker=None), 0, "run b", killed=set()
    )
    assert verdict.stuck == [
        "run a (plain) is still running (attempt 1), its lease held by w0g0@host:42:received"
        " until 03:59:30",
        "run b (plain) is still queued (attempt 1)",
    ]


# -- workflow schedules ----------------------------------------------------------------------


def test_the_workflow_schedules_cover_chains_groups_chords_and_nesting_on_the_idempotent_base() -> (
    None
):
    paths = {
        name: [step.path for step in plan(stored_canvas(canvas(0.4))).steps]
        for name, canvas in WORKFLOW_SHAPES.items()
    }
    assert paths == {
        "workflow-chain": ["0", "1", "2"],
        "workflow-group": ["0", "1", "2"],
        "workflow-chord": ["h.0", "h.1", "h.2", "b"],
        "workflow-nested": ["0", "1.h.0", "1.h.1", "1.b"],
        "workflow-chain-group": ["0", "1.0", "1.1"],
    }
    tasks = {
        step.task
        for canvas in WORKFLOW_SHAPES.values()
        for step in plan(stored_canvas(canvas(0.4))).steps
    }
    assert tasks == {"chaos.step", "chaos.gather"}  # both IdempotentTask (tests.chaos.jobs)
    assert WorkloadShape(workflow_every=0).runs_per_second() == pytest.approx(
        WorkloadShape().runs_per_second() - len(WORKFLOW_SHAPES) / WorkloadShape().workflow_every
    )
    without = ChaosConfig(seed=1, duration=10, workload=WorkloadShape(workflow_every=0))
    assert without.reproduce().endswith(" --without-workflows")
    assert "workflow" not in ChaosConfig(seed=1, duration=10).reproduce()
    slower = ChaosConfig(seed=1, duration=10, workload=WorkloadShape(workflow_every=10))
    assert slower.reproduce().endswith(" --workflow-every 10")


def _workflow(
    state: RunState, steps: dict[str, tuple[RunState, int]], **values: Any
) -> tuple[SimpleNamespace, list[SimpleNamespace], Counter[str]]:
    """A chord workflow run in ``state`` and its steps: path -> (state, effects)."""
    canvas = WORKFLOW_SHAPES["workflow-chord"](0.0)
    run = _run_row(
        schedule_name="workflow-chord", state=state, plain=False, retries=0,
        kwargs=workflow_kwargs(stored_canvas(canvas)), workflow_run_id=None, step=None,
        **values,
    )  # fmt: skip
    rows, effects = [], Counter[str]()
    for path, (step_state, count) in steps.items():
        step = _run_row(
            schedule_name=None, fire_at=None, state=step_state, plain=False, retries=0,
            workflow_run_id=run.id, step=path,
        )  # fmt: skip
        rows.append(step)
        effects[str(step.id)] = count
    return run, rows, effects


ALL_ONCE = {path: (RunState.SUCCEEDED, 1) for path in ("h.0", "h.1", "h.2", "b")}


@pytest.mark.parametrize(
    ("state", "steps", "violations", "counted"),
    [
        (RunState.SUCCEEDED, ALL_ONCE, set(), (0, 0, 0)),
        # a step's effect twice: executed twice (the workflow is not lost for it)
        (
            RunState.SUCCEEDED,
            ALL_ONCE | {"h.1": (RunState.SUCCEEDED, 2)},
            {"duplicated"},
            (0, 1, 0),
        ),
        # an effect though the step failed, which failed the workflow
        (
            RunState.FAILED,
            ALL_ONCE | {"b": (RunState.FAILED, 1)},
            {"duplicated", "lost"},
            (1, 1, 0),
        ),
        # succeeded, but its body never ran: not every planned step succeeded
        (
            RunState.SUCCEEDED,
            {path: ALL_ONCE[path] for path in ("h.0", "h.1", "h.2")},
            {"lost"},
            (1, 0, 0),
        ),
        (RunState.LOST, ALL_ONCE | {"h.2": (RunState.LOST, 0)}, {"lost"}, (1, 0, 0)),
        # still running: its body was never sent (the chord's counter lost)...
        (
            RunState.RUNNING,
            {path: ALL_ONCE[path] for path in ("h.0", "h.1", "h.2")},
            {"stuck"},
            (0, 0, 1),
        ),
        # ... or is left queued: the workflow and its step are both stuck
        (RunState.RUNNING, ALL_ONCE | {"b": (RunState.QUEUED, 0)}, {"stuck"}, (0, 0, 2)),
    ],
)
def test_a_workflow_run_succeeds_with_every_planned_step_once_or_is_a_violation(
    state: RunState,
    steps: dict[str, tuple[RunState, int]],
    violations: set[str],
    counted: tuple[int, int, int],
) -> None:
    run, step_rows, effects = _workflow(state, steps)
    expectation = Expectation(
        name="workflow-chord", kind="workflow", trigger=None,  # type: ignore[arg-type]
        zone=UTC, first_fire=run.fire_at, workflow=True,  # type: ignore[arg-type]
    )  # fmt: skip
    verdict = Verdict()
    _check_runs(
        verdict, [run], effects, [expectation], set(), run.fire_at + timedelta(seconds=60),
        steps=steps_by_workflow([run, *step_rows]), starts=Counter({str(step_rows[0].id): 2}),
    )  # fmt: skip
    found = {name for name in ("lost", "duplicated", "stuck") if getattr(verdict, name)}
    assert found == violations
    counts = verdict.counts
    assert counts.workflow_runs == 1
    assert counts.workflow_steps_planned == 4
    assert counts.workflow_steps == len(steps)
    assert counts.workflow_steps_restarted == 1
    assert counts.workflows_succeeded == int(not violations)
    lost, twice, stuck = counted
    assert len(counts.workflows_lost) == lost
    assert len(counts.workflow_steps_twice) == twice
    assert len(counts.workflows_stuck) == stuck
    # every violation names a run first (the workflow's or the step's): the table by
    # fault kind places it by that run's life, and the logs naming it are shown
    for violation in verdict.violations:
        assert violation.split(": ", 1)[1].startswith("run ")


def test_a_workflow_run_the_end_phase_cancelled_before_its_time_must_not_have_run_a_step() -> None:
    run, step_rows, effects = _workflow(
        RunState.CANCELLED, {"h.0": (RunState.SUCCEEDED, 1)},
        reason="its schedule was paused before its fire time",
    )  # fmt: skip
    expectation = Expectation(
        name="workflow-chord", kind="workflow", trigger=None,  # type: ignore[arg-type]
        zone=UTC, first_fire=run.fire_at, workflow=True,  # type: ignore[arg-type]
    )  # fmt: skip
    steps = steps_by_workflow(step_rows)
    for ran, violation in ((0, False), (1, True)):
        effects[str(step_rows[0].id)] = ran
        verdict = Verdict()
        window_end = run.fire_at - timedelta(seconds=1)
        _check_runs(verdict, [run], effects, [expectation], set(), window_end, steps=steps)
        assert bool(verdict.duplicated) is violation
        assert len(verdict.counts.workflows_run_though_cancelled) == int(violation)
        assert not verdict.counts.workflow_steps_twice
        assert verdict.counts.cancelled_by_the_end == 1
