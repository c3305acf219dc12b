"""A body Celery terminates while it works: a worker that loses its broker connection
cancels its request (``worker_cancel_long_running_tasks_on_connection_loss``), a revoke
with ``terminate`` ends it; what the run records is the truth of what its body did. Real
`celery worker` and `celery beat` processes on a private PostgreSQL and Redis; Redis
restarts mid-run."""

from __future__ import annotations

import signal
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.plain_runs import CANCELLED_ON_CONNECTION_LOSS, PLAIN_RUN_TERMINATED
from tests.chaos.servers import PrivatePostgres, PrivateRedis
from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.test_crash_proof import private_cluster, servers
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.e2e

__all__ = ["private_cluster", "servers"]  # the fixtures, for this module's tests

#: Seconds the plain run works: Redis restarts well inside it.
JOB_SECONDS = 8.0


def the_run(cluster: Cluster) -> Any:
    [run] = run_rows(cluster.store, task="e2e.plain_long")
    return run


def effects(cluster: Cluster) -> list[str]:
    with cluster.store.engine.connect() as conn:
        return [row[0] for row in conn.execute(text("SELECT label FROM e2e_effects ORDER BY at"))]


def restart_redis_unnoticed(cluster: Cluster, redis_server: PrivateRedis) -> None:
    """Restart Redis while the worker's main process is stopped: it notices the lost
    connection once Redis is back (as when it is busy at that moment), its unacknowledged
    message is restored, and Celery goes on to cancel the running request. (Noticed
    while Redis is down, the restore fails and this Celery stops the worker instead,
    with an unrecoverable error; the body then runs to its end.)"""
    worker = cluster.processes[-1]
    worker.signal(signal.SIGSTOP)
    try:
        redis_server.stop()
        redis_server.start()
    finally:
        worker.signal(signal.SIGCONT)


def start_cluster(cluster: Cluster, pool: str) -> None:
    cluster.beat("beat0")
    worker = cluster.worker("worker0", concurrency=2, pool=pool)
    wait_until(lambda: cluster.leading_process() is not None, timeout=60, interval=0.2)
    wait_until(lambda: " ready." in worker.output(), timeout=60, interval=0.2)


@pytest.fixture
def plain_run_working(private_cluster: Cluster, request: pytest.FixtureRequest) -> Cluster:
    """A beat and one worker on ``request.param``'s pool; a one-off plain run of
    ``e2e.plain_long`` that the worker started."""
    cluster = private_cluster
    start_cluster(cluster, request.param)
    Schedules(cluster.store).create(
        f"long-{uuid.uuid4().hex[:6]}",
        "e2e.plain_long",
        at=datetime.now(UTC),
        args=["long", JOB_SECONDS],
        allow_unregistered=True,
    )
    wait_until(lambda: "long:start" in effects(cluster), timeout=60, interval=0.2)
    return cluster


@pytest.mark.parametrize("plain_run_working", ["prefork", "threads"], indirect=True)
def test_a_plain_run_cancelled_on_a_lost_broker_connection_records_what_its_body_did(
    plain_run_working: Cluster, servers: tuple[PrivatePostgres, PrivateRedis]
) -> None:
    """issue 38, copies bounded / a fast path acts only on proof: Redis restarts while a
    plain run's body works. The prefork pool terminates the body (Celery cancels the
    request): the run ends ``lost`` with the reason, never ``failed`` with no error, and
    is never run again. The threads pool cannot terminate it: the body completes, and
    the run records its real outcome. Either way the body started once."""
    cluster = plain_run_working
    _, redis_server = servers
    restart_redis_unnoticed(cluster, redis_server)
    wait_until(
        lambda: the_run(cluster).state not in (RunState.RUNNING.value, RunState.QUEUED.value),
        timeout=JOB_SECONDS + 60,
        interval=0.5,
    )
    time.sleep(JOB_SECONDS + 5)  # a redelivery, a copy, or the body's end would show by now
    run = the_run(cluster)
    done = effects(cluster)
    assert done.count("long:start") == 1, f"the body started {done.count('long:start')} times"
    if "long" in done:
        assert (run.state, run.error) == (RunState.SUCCEEDED.value, None)
    else:
        assert (run.state, run.error) == (RunState.LOST.value, CANCELLED_ON_CONNECTION_LOSS)


def test_an_idempotent_run_cancelled_on_a_lost_broker_connection_runs_again_once(
    private_cluster: Cluster, servers: tuple[PrivatePostgres, PrivateRedis]
) -> None:
    """issue 38, the idempotent base under the same cancel: the prefork pool terminates
    the body; the run is taken again (its lease, its guard) and completes, its effect
    (committed with the completion) once."""
    cluster = private_cluster
    _, redis_server = servers
    start_cluster(cluster, "prefork")
    task_id = str(uuid.uuid4())
    cluster.app().send_task("e2e.slow", args=["proof", JOB_SECONDS], task_id=task_id)
    wait_until(
        lambda: (
            run_rows(cluster.store, task="e2e.slow")
            and run_rows(cluster.store, task="e2e.slow")[0].state == RunState.RUNNING.value
        ),
        timeout=60,
        interval=0.2,
    )
    time.sleep(1)
    restart_redis_unnoticed(cluster, redis_server)
    wait_until(
        lambda: run_rows(cluster.store, task="e2e.slow")[0].state == RunState.SUCCEEDED.value,
        timeout=JOB_SECONDS + 90,
        interval=0.5,
    )
    time.sleep(5)
    [run] = run_rows(cluster.store, task="e2e.slow")
    assert run.state == RunState.SUCCEEDED.value
    assert cluster.effects() == {task_id: 1}


@pytest.mark.parametrize("plain_run_working", ["prefork"], indirect=True)
def test_a_plain_run_revoked_with_terminate_ends_lost_not_failed(
    plain_run_working: Cluster,
) -> None:
    """issue 38, the same termination by a revoke: ``revoke(terminate=True)`` sends the
    pool process SIGTERM; the body never returned, so the run ends ``lost`` with the
    reason, not ``failed`` with no error, and is not run again."""
    cluster = plain_run_working
    run = the_run(cluster)
    cluster.app().control.revoke(str(run.id), terminate=True)
    wait_until(lambda: the_run(cluster).state != RunState.RUNNING.value, timeout=JOB_SECONDS + 30)
    time.sleep(JOB_SECONDS)
    run = the_run(cluster)
    assert (run.state, run.error) == (RunState.LOST.value, PLAIN_RUN_TERMINATED)
    assert effects(cluster) == ["long:start"], "terminated once, never run again"


#: Seconds the first attempt works before it asks for its retry, and the retry's countdown.
RETRY_WAIT, RETRY_COUNTDOWN = 4.0, 6.0


def attempt_times(cluster: Cluster, run_id: uuid.UUID) -> dict[str, datetime]:
    with cluster.store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT label, at FROM e2e_effects WHERE task_id = :id"), {"id": str(run_id)}
        )
        return {row.label: row.at for row in rows}


@pytest.mark.parametrize("task", ["e2e.plain_retry_after", "e2e.retry_after"])
def test_a_retry_asked_for_while_the_broker_is_down_runs_once_its_countdown_has_passed(
    private_cluster: Cluster, servers: tuple[PrivatePostgres, PrivateRedis], task: str
) -> None:
    """issue 38, lost retry: a task asks for its retry while Redis is down. Celery's
    ``Task.retry`` cannot publish it and raises ``Reject`` (not requeued): the retry was
    asked for and never sent. The run records ``retrying`` with the due time the task
    asked for, not ``failed``; once Redis is back the leader sends the retry, which runs
    once, not before its countdown, and the run succeeds."""
    cluster = private_cluster
    _, redis_server = servers
    start_cluster(cluster, "prefork")
    Schedules(cluster.store).create(
        f"retry-{uuid.uuid4().hex[:6]}",
        task,
        at=datetime.now(UTC),
        args=["attempt", RETRY_WAIT, RETRY_COUNTDOWN],
        allow_unregistered=True,
    )
    wait_until(lambda: run_rows(cluster.store, task=task), timeout=60, interval=0.2)
    [run] = run_rows(cluster.store, task=task)
    wait_until(lambda: "attempt:0" in attempt_times(cluster, run.id), timeout=60, interval=0.2)
    worker = cluster.processes[-1]
    worker.signal(signal.SIGSTOP)  # its pool process works on; the consumer sees nothing
    try:
        redis_server.stop()
        wait_until(
            lambda: run_rows(cluster.store, task=task)[0].state != RunState.RUNNING.value,
            timeout=RETRY_WAIT + 30,
            interval=0.2,
        )
        [asked] = run_rows(cluster.store, task=task)
        redis_server.start()
    finally:
        worker.signal(signal.SIGCONT)
    assert (asked.state, asked.retries) == (RunState.RETRYING.value, 1), asked.error
    wait_until(
        lambda: run_rows(cluster.store, task=task)[0].state == RunState.SUCCEEDED.value,
        timeout=RETRY_COUNTDOWN + 120,
        interval=0.5,
    )
    times = attempt_times(cluster, run.id)
    assert sorted(times) == ["attempt:0", "attempt:1"], times
    assert times["attempt:1"] >= asked.retry_due_at, "the retry started before it was due"
    assert times["attempt:1"] - times["attempt:0"] >= timedelta(
        seconds=RETRY_WAIT + RETRY_COUNTDOWN
    )
