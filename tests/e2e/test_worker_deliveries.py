"""What a worker does with a run's delivery when the worker is killed while it holds a
retry, paused while it holds a prefetched run, or runs with its wall clock two minutes
off: every decision follows the leases and the database's clock, and a body runs once,
never before its retry is due and never after its ``expires``."""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.clock_skew import skew_overrides
from tests.e2e.cluster import ROOT, Cluster, Process, wait_until
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.e2e

FAST = {"HABEAT_LEASE_TIMEOUT": "4", "HABEAT_MAX_WAIT": "1", "HABEAT_VISIBILITY_TIMEOUT": "5"}
#: Kombu does not hand a message taken by a worker to another one within the test.
SLOW_REDELIVERY = FAST | {"HABEAT_VISIBILITY_TIMEOUT": "60"}
#: How far off the skewed workers' wall clocks are (seconds).
SKEW = 120.0
FINAL = {"succeeded", "failed", "expired", "lost", "cancelled", "skipped"}


def skewed(seconds: float) -> dict[str, str]:
    """Environment of a worker whose wall clock is ``seconds`` off (``tests.clock_skew``)."""
    return skew_overrides(seconds, str(ROOT))


def prefetching_worker(cluster: Cluster, name: str, pool: str = "threads", **env: str) -> Process:
    """A worker of one process or thread that takes a second message while it runs one
    (a run prefetched behind a long job)."""
    return cluster.worker(name, 1, pool, ("--prefetch-multiplier", "2"), **env)


def one_run(store: Store, schedule: str) -> Any:
    rows = run_rows(store, schedule_name=schedule)
    assert len(rows) <= 1, rows
    return rows[0] if rows else None


def state_of(store: Store, schedule: str) -> str | None:
    run = one_run(store, schedule)
    return None if run is None else run.state


def ready(process: Process) -> None:
    wait_until(lambda: " ready." in process.output(), timeout=60, interval=0.2)


def effect_times(store: Store, task_id: str) -> dict[str, datetime]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT label, at FROM e2e_effects WHERE task_id = :id"), {"id": task_id}
        )
        return {row.label: row.at for row in rows}


def test_a_plain_retry_whose_worker_dies_does_not_start_before_its_countdown(
    cluster: Cluster, store: Store
) -> None:
    """issue 38, finding 7: a plain task asks for a retry 15 s later; the worker that
    received the retry (holding it for its countdown) is SIGKILLed: the retry runs on
    another worker, not before its countdown ended by the database's clock."""
    countdown = 15
    cluster.settings = SLOW_REDELIVERY  # the leader, not kombu, sends the retry again
    cluster.beat("beat0")
    holder = cluster.worker("worker0", concurrency=2)
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    ready(holder)
    Schedules(store).create(
        "plain-retry",
        "e2e.plain_retry_later",
        at=datetime.now(UTC),
        args=["attempt", countdown],
        allow_unregistered=True,
    )

    def retry_held() -> bool:
        run = one_run(store, "plain-retry")
        return run is not None and run.retries == 1 and run.lease_owner is not None

    wait_until(retry_held, timeout=30, interval=0.1)
    holder.signal(signal.SIGKILL)
    holder.popen.wait()
    cluster.worker("worker1", concurrency=2)
    wait_until(lambda: state_of(store, "plain-retry") in FINAL, timeout=60, interval=0.2)
    run = one_run(store, "plain-retry")
    times = effect_times(store, str(run.id))
    print(f"run {run.state}, attempts started at {times}")
    assert run.state == RunState.SUCCEEDED.value
    assert times["attempt:1"] - times["attempt:0"] >= timedelta(seconds=countdown), (
        "the retry started before its countdown ended"
    )


#: A guarded job and a plain one that ask for one retry: its arguments for a countdown,
#: and the effects of a run that ended well.
ONE_RETRY = {
    "e2e.retry_now": (lambda countdown: ["eta-lost", 1, countdown], ["eta-lost"]),
    "e2e.plain_retry_later": (lambda countdown: ["attempt", countdown], ["attempt:0", "attempt:1"]),
}


@pytest.mark.parametrize("task", sorted(ONE_RETRY))
def test_a_retry_whose_eta_celery_never_runs_is_sent_again_not_held_for_ever(
    cluster: Cluster, store: Store, task: str
) -> None:
    """Seen in the chaos suite after a Redis restart: a worker lists a run's retry as
    waiting for its ETA long after it passed, and never runs it. Its heartbeat renewed
    the run's receipt lease all the same, so the run stayed ``retrying`` for as long as
    the worker lived (kombu hands the message back only after the visibility timeout,
    an hour by default). Now the lease is let go a lease after the ETA, and the leader
    sends the run again: it succeeds, each attempt's effect once."""
    countdown = 6
    arguments, effects = ONE_RETRY[task]
    # Kombu would hand the message back only after ten minutes: the leases decide.
    cluster.settings = FAST | {"HABEAT_VISIBILITY_TIMEOUT": "600"}
    cluster.beat("beat0")
    worker = cluster.worker("worker0", concurrency=2)
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    ready(worker)
    # The demo app's own schedule (every 10 s) would land a message in the window the
    # test watches: Celery then drops the cancelled request from its list, and the run
    # is sent again by its lease's expiry instead of the path under test (seen in CI).
    for stored in store.list_schedules():
        Schedules(store).pause(stored.name)
    Schedules(store).create(
        "eta-lost",
        task,
        at=datetime.now(UTC),
        args=arguments(countdown),
        allow_unregistered=True,
    )

    def retry_held() -> bool:
        run = one_run(store, "eta-lost")
        return run is not None and run.retries == 1 and run.lease_owner is not None

    wait_until(retry_held, timeout=30, interval=0.1)
    replies = cluster.app().control.broadcast("e2e_lose_eta_timers", reply=True, timeout=5)
    assert [reply for reply in replies if any(r == {"cancelled": 1} for r in reply.values())]
    wait_until(lambda: state_of(store, "eta-lost") in FINAL, timeout=90, interval=0.5)
    run = one_run(store, "eta-lost")
    assert run.state == RunState.SUCCEEDED.value, (run.state, run.error, run.reason)
    assert sorted(effect_times(store, str(run.id))) == effects
    assert "waiting for its ETA long after it passed" in worker.output()


#: A task, and what its worker logs when it refuses a copy of a run another one took.
REFUSALS = {
    "e2e.plain_record": "did not start plain run {}",
    "e2e.record": "skipped a duplicate delivery of run {}",
}


@pytest.mark.parametrize("task", sorted(REFUSALS))
def test_a_prefetched_plain_run_of_a_paused_worker_runs_once(
    cluster: Cluster, store: Store, task: str
) -> None:
    """issue 38, finding 8: a worker holds a prefetched plain run (received, not started)
    behind a long job and is paused (SIGSTOP) past its receipt lease: the run is sent
    to another worker, which runs it; resumed (SIGCONT), the paused worker does not
    start its reserved copy: the body runs once. The same on the idempotent base,
    whose start is one conditional statement too."""
    cluster.settings = SLOW_REDELIVERY
    cluster.beat("beat0")
    paused = prefetching_worker(cluster, "worker0", pool="prefork")
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    ready(paused)
    app = cluster.app()
    app.send_task("e2e.plain_slow", args=["long", 10], task_id="long-job")
    wait_until(lambda: "long-job" in paused.output(), timeout=30)
    Schedules(store).create(
        "prefetched", task, at=datetime.now(UTC), args=["p"], allow_unregistered=True
    )

    def held_by_paused() -> bool:
        run = one_run(store, "prefetched")
        return run is not None and (run.worker or "").startswith("worker0") and run.lease_owner

    wait_until(held_by_paused, timeout=30, interval=0.1)
    paused.signal(signal.SIGSTOP)
    try:
        prefetching_worker(cluster, "worker1")
        wait_until(lambda: state_of(store, "prefetched") == "succeeded", timeout=60, interval=0.2)
        assert one_run(store, "prefetched").worker.startswith("worker1")
    finally:
        paused.signal(signal.SIGCONT)
    # The long job ends at once (its 10 s passed while paused); then the reserved copy
    # is handed to the pool, which refuses it.
    run = one_run(store, "prefetched")
    refusal = REFUSALS[task].format(run.id)

    def settled() -> bool:
        return refusal in paused.output() or cluster.effects().get(str(run.id), 0) > 1

    wait_until(settled, timeout=30, interval=0.2)
    assert cluster.effects()[str(run.id)] == 1, "the body ran twice"
    assert refusal in paused.output()
    assert one_run(store, "prefetched").state == RunState.SUCCEEDED.value


def test_a_worker_whose_clock_is_ahead_runs_runs_that_have_not_expired(
    cluster: Cluster, store: Store
) -> None:
    """issue 38, finding 9: a worker whose wall clock is 2 minutes ahead takes plain and
    idempotent runs with ``expires=60`` at their fire time: by the database's clock none
    has expired, so all run (Celery's discard by the worker's clock is not the truth)."""
    cluster.settings = FAST
    cluster.beat("beat0")
    worker = cluster.worker("worker0", concurrency=4, **skewed(SKEW))
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    ready(worker)
    schedules = Schedules(store)
    names = [f"{kind}-{index}" for kind in ("plain", "guarded") for index in range(3)]
    for name in names:
        task = "e2e.plain_record" if name.startswith("plain") else "e2e.record"
        schedules.create(
            name,
            task,
            at=datetime.now(UTC),
            args=[name],
            options={"expires": 60},
            allow_unregistered=True,
        )
    wait_until(
        lambda: all(state_of(store, name) in FINAL for name in names), timeout=60, interval=0.2
    )
    states = {name: state_of(store, name) for name in names}
    assert states == dict.fromkeys(names, RunState.SUCCEEDED.value)
    assert sorted(cluster.effects().values()) == [1] * len(names)


def test_a_worker_whose_clock_is_behind_does_not_start_a_plain_run_past_its_expires(
    cluster: Cluster, store: Store
) -> None:
    """issue 38, finding 10: a worker whose wall clock is 2 minutes behind holds a plain
    run with ``expires=3`` behind a 10-s job: when its turn comes the run has expired
    by the database's clock, so it is not started and ends ``expired``."""
    cluster.settings = SLOW_REDELIVERY
    cluster.beat("beat0")
    worker = prefetching_worker(cluster, "worker0", pool="prefork", **skewed(-SKEW))
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    ready(worker)
    cluster.app().send_task("e2e.plain_slow", args=["long", 10], task_id="long-job")
    wait_until(lambda: "long-job" in worker.output(), timeout=30)
    Schedules(store).create(
        "late-plain",
        "e2e.plain_record",
        at=datetime.now(UTC),
        args=["late"],
        options={"expires": 3},
        allow_unregistered=True,
    )
    wait_until(lambda: state_of(store, "late-plain") in FINAL, timeout=60, interval=0.2)
    time.sleep(2)
    run = one_run(store, "late-plain")
    assert run.state == RunState.EXPIRED.value
    assert run.started_at is None
    assert str(run.id) not in cluster.effects()


def retry_sent_from_behind(cluster: Cluster, store: Store, task: str, countdown: float) -> Process:
    """A beat run of ``task`` (a job that asks for one retry ``countdown`` s later, sent to
    the queue ``in-step``) taken from the queue ``behind`` by a worker whose wall clock is
    2 minutes behind (returned); the queue ``in-step`` is consumed by a worker in step."""
    cluster.settings = FAST
    cluster.beat("beat0")
    behind = cluster.worker("worker0", 2, "threads", ("-Q", "behind"), **skewed(-SKEW))
    in_step = cluster.worker("worker1", 2, "threads", ("-Q", "in-step"))
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    ready(behind)
    ready(in_step)
    Schedules(store).create(
        "retried",
        task,
        at=datetime.now(UTC),
        args=["attempt", countdown, "in-step"],
        options={"queue": "behind"},
        allow_unregistered=True,
    )
    return behind


@pytest.mark.parametrize("task", ["e2e.plain_retry_on", "e2e.retry_on"])
def test_a_retry_asked_for_by_a_worker_whose_clock_is_behind_waits_its_countdown_elsewhere(
    cluster: Cluster, store: Store, task: str
) -> None:
    """issue 38, finding 1 (retry due times): a worker whose wall clock is 2 minutes
    behind runs a beat run that asks for a retry 10 s later (Celery puts the ETA in the
    message by that worker's clock); the retry is taken by a worker whose clock is right,
    and does not start before the first attempt's start + 10 s by the database's clock.
    Plain and idempotent tasks alike."""
    countdown = 10
    retry_sent_from_behind(cluster, store, task, countdown)
    wait_until(lambda: state_of(store, "retried") in FINAL, timeout=60, interval=0.2)
    run = one_run(store, "retried")
    times = effect_times(store, str(run.id))
    print(f"run {run.state} on {run.worker}, retry due {run.retry_due_at}, attempts {times}")
    assert run.state == RunState.SUCCEEDED.value
    assert (run.worker or "").startswith("worker1"), "the retry ran on the worker in step"
    assert times["attempt:1"] - times["attempt:0"] >= timedelta(seconds=countdown), (
        "the retry started before its countdown ended by the database's clock"
    )
    # The due time a plain retry's receipt records (the leader would send the retry
    # again then, were its worker to die) is that instant too.
    assert run.retry_due_at - times["attempt:0"] >= timedelta(seconds=countdown), (
        "the run records its retry as due before its countdown ended"
    )


def test_a_plain_retry_is_recorded_due_by_the_database_s_clock_where_it_is_received(
    cluster: Cluster, store: Store
) -> None:
    """issue 38, finding 1 (the receipt's record): a worker whose wall clock is 2 minutes
    behind asks for a plain run's retry 10 s later and dies before its attempt's outcome
    is recorded; the worker in step that receives the retry records when it is due
    (``retry_due_at``, when the leader would send it again were this worker to die too)
    as the instant the sender carried, not as its own reading of an ETA that reads 2
    minutes past; and starts it then."""
    countdown = 10
    behind = retry_sent_from_behind(cluster, store, "e2e.plain_retry_then_die", countdown)

    def received_elsewhere() -> bool:
        run = one_run(store, "retried")
        return run is not None and run.retries == 1 and (run.worker or "").startswith("worker1")

    wait_until(received_elsewhere, timeout=30, interval=0.1)
    run = one_run(store, "retried")
    first = effect_times(store, str(run.id))["attempt:0"]
    print(f"retry received by {run.worker}, due {run.retry_due_at}, first attempt {first}")
    assert not behind.alive()
    assert run.retry_due_at - first >= timedelta(seconds=countdown), (
        "the receipt recorded the retry as due before its countdown ends"
    )
    wait_until(lambda: state_of(store, "retried") in FINAL, timeout=60, interval=0.2)
    times = effect_times(store, str(run.id))
    assert one_run(store, "retried").state == RunState.SUCCEEDED.value
    assert times["attempt:1"] - times["attempt:0"] >= timedelta(seconds=countdown)


def test_a_plain_run_a_free_slot_runs_is_taken_by_its_start_one_that_waits_at_receipt(
    cluster: Cluster, store: Store
) -> None:
    """A plain run Celery hands to a free pool slot is taken and started by the pool
    process in one statement: received and started at the same instant (that
    statement's ``now()``). One prefetched behind a long job waits in the worker: it is
    taken at receipt, under the receipt lease, and started later. Each body runs once."""
    cluster.settings = FAST
    cluster.beat("beat0")
    worker = prefetching_worker(cluster, "worker0", pool="prefork")
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    ready(worker)
    schedules = Schedules(store)
    schedules.create(
        "at-once", "e2e.plain_record", at=datetime.now(UTC), args=["a"], allow_unregistered=True
    )
    wait_until(lambda: state_of(store, "at-once") == "succeeded", timeout=30, interval=0.1)
    cluster.app().send_task("e2e.plain_slow", args=["long", 4], task_id="long-job")
    wait_until(lambda: "long-job" in worker.output(), timeout=30)
    schedules.create(
        "waited", "e2e.plain_record", at=datetime.now(UTC), args=["w"], allow_unregistered=True
    )
    wait_until(lambda: state_of(store, "waited") == "succeeded", timeout=60, interval=0.1)

    at_once, waited = one_run(store, "at-once"), one_run(store, "waited")
    assert at_once.received_at == at_once.started_at
    assert waited.received_at < waited.started_at
    assert waited.started_at - waited.received_at > timedelta(seconds=1)  # behind the job
    effects = cluster.effects()
    assert (effects[str(at_once.id)], effects[str(waited.id)]) == (1, 1)
    assert (at_once.attempt, waited.attempt) == (1, 1)


def pool_processes(worker: Process) -> list[int]:
    """The PIDs of a prefork worker's pool processes (its children)."""
    children = Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split()
    return [int(pid) for pid in children]


@pytest.mark.parametrize("task", sorted(REFUSALS))
def test_a_run_handed_to_a_paused_pool_process_at_once_runs_once(
    cluster: Cluster, store: Store, task: str
) -> None:
    """A run Celery hands to a free pool slot has no receipt: its pool process takes it
    as it starts it. Paused (SIGSTOP) before it reads the job, that process leaves the
    run untaken while its message is unacknowledged: the message goes to another
    worker, which runs the run; resumed (SIGCONT), the paused process's take is refused
    and its copy never runs. The same on the idempotent base, whose guard takes its
    run as it starts."""
    cluster.settings = FAST
    cluster.beat("beat0")
    paused = cluster.worker("worker0", 1, "prefork")
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    ready(paused)
    (pool,) = pool_processes(paused)
    os.kill(pool, signal.SIGSTOP)
    try:
        Schedules(store).create(
            "handed", task, at=datetime.now(UTC), args=["h"], allow_unregistered=True
        )
        wait_until(lambda: one_run(store, "handed") is not None, timeout=30, interval=0.1)
        run_id = str(one_run(store, "handed").id)
        wait_until(lambda: f"[{run_id}] received" in paused.output(), timeout=30, interval=0.1)
        assert one_run(store, "handed").received_at is None  # no receipt: handed at once
        cluster.worker("worker1", 1, "threads")
        wait_until(lambda: state_of(store, "handed") == "succeeded", timeout=90, interval=0.2)
        assert one_run(store, "handed").worker.startswith("worker1")
    finally:
        os.kill(pool, signal.SIGCONT)
    refusal = REFUSALS[task].format(run_id)

    def settled() -> bool:
        return refusal in paused.output() or cluster.effects().get(run_id, 0) > 1

    wait_until(settled, timeout=30, interval=0.2)
    assert cluster.effects()[run_id] == 1, "the body ran twice"
    assert refusal in paused.output()
    assert one_run(store, "handed").state == RunState.SUCCEEDED.value
