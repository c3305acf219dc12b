"""Workflow runs and their steps against real PostgreSQL: the steps recorded as they are
sent (``beat.store.workflow_steps``), the trigger of migration 0021 that moves a workflow
run with its steps (whoever changes them: a worker, the reaper, an operator), the
leader's recovery leaving a workflow with recorded steps to its steps, and the options
a step's message is recorded with (``beat.delivery.workflow_steps``)."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery, chain, chord, group, signature
from celery import current_app as celery_current_app
from celery.signals import before_task_publish
from sqlalchemy import text

from beat.delivery.workflow_steps import record_sent_step, step_message
from beat.models import RunState, RunToPublish
from beat.ops.schedules import Schedules
from beat.publish.workflows import send_workflow
from beat.schedule.workflow import (
    STEP_HEADER,
    WORKFLOW_HEADER,
    WORKFLOW_TASK,
    group_id,
    plan,
    step_task_id,
    stored_canvas,
)
from beat.store.all_roles import Store
from beat.store.leader import MAX_SENDS
from beat.store.run_guard import Refused, Started, expiry_reason
from beat.store.runs import RunStore
from beat.store.workflow_steps import DEFAULT_STEP_ATTEMPTS, STALLED, StepMessage
from tests.conftest import SessionEnv
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.integration

EPOCH = 1
WORKER = "worker1@host"
OWNER = "worker1@host:1"
STEP_TASK = "e2e.step"


@pytest.fixture
def run_store(store: Store) -> RunStore:
    return RunStore(store.engine)


# -- building workflow runs and moving their steps, as beat and the workers do ----------


def task(name: str = STEP_TASK, *args: Any) -> Any:
    return signature(name, args=list(args), immutable=True)


def workflow_run(
    store: Store, canvas: Any, *, max_attempts: int = 3, published: bool = True
) -> uuid.UUID:
    """A run of a new workflow schedule of ``canvas``, queued by an operator's trigger
    (``pending``, its kwargs the canvas and its ends) and, if ``published``, marked
    ``queued`` as the leader does once it sent the first steps."""
    schedules = Schedules(store)
    name = f"wf-{uuid.uuid4().hex[:8]}"
    schedules.create(
        name, workflow=canvas, every=3600, max_attempts=max_attempts, allow_unregistered=True
    )
    run = schedules.trigger_run(name)
    assert run.task == WORKFLOW_TASK
    if published:
        assert store.mark_published([run.id]) == 1
    return run.id


def plain_run(store: Store) -> uuid.UUID:
    """An ordinary run (one task, not a workflow), queued."""
    schedules = Schedules(store)
    name = f"plain-{uuid.uuid4().hex[:8]}"
    schedules.create(name, "tasks.demo.add", every=3600, args=[1, 2], allow_unregistered=True)
    run = schedules.trigger_run(name)
    assert store.mark_published([run.id]) == 1
    return run.id


def message(run_id: uuid.UUID, path: str, *, task: str = STEP_TASK, **options: Any) -> StepMessage:
    return StepMessage(
        task_id=step_task_id(run_id, path),
        workflow_run_id=run_id,
        step=path,
        task=task,
        args=[path],
        kwargs={"path": path},
        options=options,
    )


def record(
    run_store: RunStore, run_id: uuid.UUID, path: str, *, task: str = STEP_TASK
) -> uuid.UUID:
    """The step at ``path`` recorded as sent (``queued``); its run ID. (What
    ``record_step`` returns is not trusted here: see
    ``test_recording_a_new_step_says_it_made_it``.)"""
    run_store.record_step(message(run_id, path, task=task))
    step_id = uuid.UUID(step_task_id(run_id, path))
    assert state_of_step(run_store, step_id) == RunState.QUEUED.value
    return step_id


def state_of_step(run_store: RunStore, step_id: uuid.UUID) -> str | None:
    with run_store.engine.connect() as conn:
        return conn.execute(
            text("SELECT state FROM beat_runs WHERE id = :id"), {"id": step_id}
        ).scalar_one_or_none()


def guard(
    run_store: RunStore, step_id: uuid.UUID, *, owner: str = OWNER, worker: str = WORKER
) -> Started | Refused:
    """A delivery of the step meets the idempotent base's guard, on the recorded row."""
    return run_store.start(
        step_id,
        owner=owner,
        worker=worker,
        lease_seconds=30,
        task=STEP_TASK,
        args=[],
        kwargs={},
        options={},
        retries=0,
        max_attempts=3,
        may_create=False,
    )


def start(run_store: RunStore, step_id: uuid.UUID, *, worker: str = WORKER) -> None:
    """A worker starts the step."""
    started = guard(run_store, step_id, worker=worker)
    assert isinstance(started, Started), started


def finish(
    run_store: RunStore, step_id: uuid.UUID, state: RunState, error: str | None = None
) -> None:
    assert run_store.finish(step_id, owner=OWNER, state=state, error=error)


def succeed(run_store: RunStore, run_id: uuid.UUID, path: str, *, task: str = STEP_TASK) -> None:
    """The step at ``path`` recorded, started and succeeded."""
    step_id = record(run_store, run_id, path, task=task)
    start(run_store, step_id)
    finish(run_store, step_id, RunState.SUCCEEDED)


def row(store: Store, run_id: uuid.UUID) -> Any:
    [found] = run_rows(store, id=run_id)
    return found


def state_of(store: Store, run_id: uuid.UUID) -> str:
    return str(row(store, run_id).state)


def set_state(store: Store, run_id: uuid.UUID, state: str, **columns: Any) -> None:
    """An operator's UPDATE with psql."""
    assigned = ", ".join(f"{key} = :{key}" for key in ("state", *columns))
    with store.engine.begin() as conn:
        conn.execute(
            text(f"UPDATE beat_runs SET {assigned} WHERE id = :id"),
            {"id": run_id, "state": state, **columns},
        )


def published_ago(store: Store, seconds: float) -> None:
    """Move every run's publication ``seconds`` into the past."""
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE beat_runs SET published_at = now() - make_interval(secs => :ago)"),
            {"ago": seconds},
        )


def expire_leases(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE beat_runs SET lease_expires_at = now() - interval '1 second'"
                " WHERE lease_owner IS NOT NULL"
            )
        )


def chain_of_three() -> Any:
    return chain(task("e2e.first"), task("e2e.fail"), task("e2e.last"))


def group_of(members: int) -> Any:
    return group(task(f"e2e.member{index}") for index in range(members))


# -- 1. record_step -----------------------------------------------------------------


def test_a_recorded_step_is_a_queued_run_with_its_workflows_attempts_and_the_options_given(
    store: Store, run_store: RunStore
) -> None:
    run_id = workflow_run(store, chain_of_three(), max_attempts=5)
    options = {"queue": "fast", "chain": [{"task": "e2e.last"}], "root_id": "r"}
    before = run_store.database_now()

    run_store.record_step(message(run_id, "1", task="e2e.fail", **options))

    after = run_store.database_now()
    step = row(store, uuid.UUID(step_task_id(run_id, "1")))
    assert step.state == RunState.QUEUED.value
    assert (step.workflow_run_id, step.step, step.task) == (run_id, "1", "e2e.fail")
    assert (step.args, step.kwargs, step.options) == (["1"], {"path": "1"}, options)
    assert step.max_attempts == 5, "the workflow's max_attempts"
    assert before <= step.published_at <= after, "published_at by the database's clock"
    assert step.first_published_at == step.published_at
    assert (step.attempt, step.started_at, step.finished_at) == (0, None, None)
    assert state_of(store, run_id) == RunState.QUEUED.value, "an insert moves no workflow"


def test_a_step_recorded_again_changes_nothing_and_says_so(
    store: Store, run_store: RunStore
) -> None:
    run_id = workflow_run(store, chain_of_three())
    run_store.record_step(message(run_id, "0", queue="fast"))
    step_id = uuid.UUID(step_task_id(run_id, "0"))
    first = row(store, step_id)

    assert not run_store.record_step(message(run_id, "0", queue="other", chain=[{"t": 1}]))
    assert row(store, step_id) == first, "a message sent again finds its run made"

    start(run_store, step_id)
    started = row(store, step_id)
    assert not run_store.record_step(message(run_id, "0")), "a receipt after the send"
    assert row(store, step_id) == started
    assert started.state == RunState.RUNNING.value


def test_recording_a_new_step_says_it_made_it(store: Store, run_store: RunStore) -> None:
    """``record_step``: "True if this call made it"."""
    run_id = workflow_run(store, chain_of_three())

    made = run_store.record_step(message(run_id, "0"))

    assert state_of(store, uuid.UUID(step_task_id(run_id, "0"))) == RunState.QUEUED.value
    assert made is True


def test_a_step_of_a_workflow_run_that_cannot_be_read_has_the_default_attempts(
    store: Store, run_store: RunStore
) -> None:
    pruned = uuid.uuid4()
    run_store.record_step(message(pruned, "0"))
    assert row(store, uuid.UUID(step_task_id(pruned, "0"))).max_attempts == DEFAULT_STEP_ATTEMPTS


def test_the_steps_are_read_in_the_numeric_order_of_their_paths(
    store: Store, run_store: RunStore
) -> None:
    run_id = workflow_run(store, chain_of_three())
    for path in ["2.h.10", "10", "0", "2.h.9", "1", "2.h.0", "2"]:
        record(run_store, run_id, path)
    other = workflow_run(store, chain_of_three())
    record(run_store, other, "0")

    steps = run_store.steps(run_id)

    assert [step.step for step in steps] == ["0", "1", "2", "2.h.0", "2.h.9", "2.h.10", "10"]
    assert {step.workflow_run_id for step in steps} == {run_id}
    assert run_store.steps(uuid.uuid4()) == []


def test_a_chords_header_steps_are_read_before_its_body(store: Store, run_store: RunStore) -> None:
    """``path_order``: "a chord's header before its body"."""
    run_id = workflow_run(store, chord([task("e2e.h0"), task("e2e.h1")], task("e2e.body")))
    for path in ["b", "h.1", "h.0"]:
        record(run_store, run_id, path)

    assert [step.step for step in run_store.steps(run_id)] == ["h.0", "h.1", "b"]


# -- 2. the trigger: the workflow run follows its steps -----------------------------


@pytest.mark.parametrize("published", [True, False], ids=["queued", "pending"])
def test_a_workflow_goes_running_when_its_first_step_starts(
    store: Store, run_store: RunStore, published: bool
) -> None:
    """From ``queued`` at the step's start; from ``pending`` (its sender has not marked it
    published yet: the worker was faster) when it is marked published, with the start
    and worker of that step."""
    run_id = workflow_run(store, chain_of_three(), published=published)
    first = record(run_store, run_id, "0", task="e2e.first")
    assert state_of(store, run_id) == (
        RunState.QUEUED.value if published else RunState.PENDING.value
    )

    start(run_store, first)

    if not published:
        assert state_of(store, run_id) == RunState.PENDING.value, "still in the outbox"
        assert store.mark_published([run_id]) == 1
    step, workflow = row(store, first), row(store, run_id)
    assert workflow.state == RunState.RUNNING.value
    assert workflow.attempt == 1
    assert workflow.started_at == step.started_at
    assert workflow.first_started_at == step.started_at
    assert workflow.received_at == step.started_at
    assert workflow.worker == WORKER
    assert workflow.published_at is not None
    assert workflow.first_published_at is not None
    assert (workflow.finished_at, workflow.error, workflow.lease_owner) == (None, None, None)


def test_a_workflow_whose_sender_died_between_two_steps_stays_in_the_outbox(
    store: Store, run_store: RunStore
) -> None:
    """The leader sent a group's first member, which started, and was killed before the
    others (the chaos run's PgBouncer seed at 470a8e0: the run went ``running`` at that
    start, no leader sent it again, and it stayed stuck until the reaper's
    stalled-workflow rule). Left ``pending``, the next leader's outbox sends it again
    whole; the member that ran is refused at its second delivery, the others run."""
    run_id = workflow_run(store, group_of(3), published=False)
    first = record(run_store, run_id, "0")
    start(run_store, first)
    finish(run_store, first, RunState.SUCCEEDED)

    assert state_of(store, run_id) == RunState.PENDING.value
    next_leader = 7
    store.take_leadership(next_leader, "next")
    assert run_id in {run.id for run in store.pending_runs(next_leader, grace=60, limit=10)}
    run_store.record_step(message(run_id, "0"))  # the canvas sent again: known already
    assert state_of_step(run_store, first) == RunState.SUCCEEDED.value
    assert store.mark_published([run_id]) == 1
    assert state_of(store, run_id) == RunState.RUNNING.value
    assert isinstance(guard(run_store, first, owner="again"), Refused)
    succeed(run_store, run_id, "1")
    succeed(run_store, run_id, "2")
    assert state_of(store, run_id) == RunState.SUCCEEDED.value


def test_a_later_step_that_starts_keeps_the_workflows_start(
    store: Store, run_store: RunStore
) -> None:
    run_id = workflow_run(store, chain_of_three())
    succeed(run_store, run_id, "0", task="e2e.first")
    started = row(store, run_id)
    time.sleep(0.01)

    second = record(run_store, run_id, "1")
    start(run_store, second, worker="worker2@host")

    workflow = row(store, run_id)
    assert workflow.state == RunState.RUNNING.value
    assert (workflow.started_at, workflow.worker, workflow.attempt) == (
        started.started_at,
        WORKER,
        1,
    )


@pytest.mark.parametrize(
    "canvas",
    [
        chain_of_three(),
        group_of(3),
        chord([task("e2e.h0"), task("e2e.h1")], task("e2e.body")),
        chain(task("e2e.a"), group(task("e2e.b"), chain(task("e2e.c"), task("e2e.d")))),
    ],
    ids=["chain", "group", "chord", "nested"],
)
def test_a_workflow_runs_until_every_end_succeeded_then_succeeds(
    store: Store, run_store: RunStore, canvas: Any
) -> None:
    """Every step but the last end step succeeds (the other ends among them): the
    workflow runs on; the last end step succeeds: it has."""
    steps = plan(stored_canvas(canvas))
    last = steps.ends[-1]
    done = [step.path for step in steps.steps if step.path != last]
    run_id = workflow_run(store, canvas)
    for path in done:
        succeed(run_store, run_id, path)
        workflow = row(store, run_id)
        assert workflow.state == RunState.RUNNING.value, f"an end is left after {path}"
        assert workflow.finished_at is None

    succeed(run_store, run_id, last)

    workflow = row(store, run_id)
    assert workflow.state == RunState.SUCCEEDED.value
    assert workflow.finished_at == row(store, uuid.UUID(step_task_id(run_id, last))).finished_at
    assert workflow.duration_seconds == pytest.approx(
        (workflow.finished_at - workflow.started_at).total_seconds(), abs=1e-6
    )
    assert workflow.duration_seconds > 0
    assert (workflow.error, workflow.lease_owner, workflow.lease_expires_at) == (None, None, None)


def test_a_step_that_fails_fails_its_workflow_naming_the_step(
    store: Store, run_store: RunStore
) -> None:
    run_id = workflow_run(store, chain_of_three())
    succeed(run_store, run_id, "0", task="e2e.first")
    failing = record(run_store, run_id, "1", task="e2e.fail")
    start(run_store, failing)

    finish(run_store, failing, RunState.FAILED, error="ValueError: broken")

    workflow = row(store, run_id)
    assert workflow.state == RunState.FAILED.value
    assert workflow.error == "step 1 (e2e.fail) failed: ValueError: broken"
    assert workflow.finished_at == row(store, failing).finished_at
    assert workflow.duration_seconds == pytest.approx(
        (workflow.finished_at - workflow.started_at).total_seconds(), abs=1e-6
    )


def test_a_step_that_fails_with_no_error_recorded_says_so(
    store: Store, run_store: RunStore
) -> None:
    run_id = workflow_run(store, group_of(2))
    step_id = record(run_store, run_id, "1", task="e2e.member1")
    start(run_store, step_id)
    finish(run_store, step_id, RunState.FAILED)

    assert row(store, run_id).error == "step 1 (e2e.member1) failed: no error recorded"


def test_a_step_that_expires_fails_its_workflow_with_the_reason(
    store: Store, run_store: RunStore
) -> None:
    """The step never started: the workflow ends failed from ``queued``."""
    run_id = workflow_run(store, group_of(2))
    step_id = record(run_store, run_id, "0", task="e2e.member0")
    expires = datetime.now(UTC) - timedelta(minutes=1)

    assert run_store.expire_if_past(step_id, expires)

    workflow = row(store, run_id)
    assert workflow.state == RunState.FAILED.value
    assert workflow.error == f"step 0 (e2e.member0) expired: {expiry_reason(expires)}"
    assert workflow.finished_at is not None
    assert workflow.duration_seconds == 0, "it never started"


def test_a_step_the_reaper_gives_up_makes_its_workflow_lost(
    store: Store, run_store: RunStore
) -> None:
    run_id = workflow_run(store, chain_of_three(), max_attempts=1)
    step_id = record(run_store, run_id, "0", task="e2e.first")
    start(run_store, step_id)
    assert store.take_leadership(EPOCH, "leader")
    expire_leases(store)

    reclaim = store.reclaim(EPOCH, stale_queued_after=3600, limit=10)

    assert [lost.id for lost in reclaim.lost] == [step_id]
    workflow = row(store, run_id)
    assert workflow.state == RunState.LOST.value
    assert workflow.error == (
        f"step 0 (e2e.first) lost: lease expired on attempt 1 of 1 (worker {WORKER}):"
        " attempts exhausted"
    )
    assert workflow.finished_at is not None


def test_a_step_the_reaper_sends_again_leaves_its_workflow_running(
    store: Store, run_store: RunStore
) -> None:
    run_id = workflow_run(store, chain_of_three(), max_attempts=3)
    step_id = record(run_store, run_id, "0", task="e2e.first")
    start(run_store, step_id)
    assert store.take_leadership(EPOCH, "leader")
    expire_leases(store)

    reclaim = store.reclaim(EPOCH, stale_queued_after=3600, limit=10)

    assert [again.id for again in reclaim.runs] == [step_id]
    assert state_of(store, step_id) == RunState.PENDING.value
    assert state_of(store, run_id) == RunState.RUNNING.value


def test_a_step_cancelled_by_an_operator_cancels_its_workflow(
    store: Store, run_store: RunStore
) -> None:
    run_id = workflow_run(store, group_of(2))
    step_id = record(run_store, run_id, "1", task="e2e.member1")

    set_state(store, step_id, RunState.CANCELLED.value, reason="cancelled by alice")

    workflow = row(store, run_id)
    assert workflow.state == RunState.CANCELLED.value
    assert workflow.error == "step 1 (e2e.member1) cancelled: cancelled by alice"
    assert workflow.finished_at is not None


@pytest.mark.parametrize(
    "ended", [RunState.FAILED, RunState.SUCCEEDED, RunState.CANCELLED], ids=str
)
def test_a_finished_workflow_is_not_changed_by_its_steps(
    store: Store, run_store: RunStore, ended: RunState
) -> None:
    run_id = workflow_run(store, group_of(3))
    member = record(run_store, run_id, "0")
    start(run_store, member)
    with store.engine.begin() as conn:  # ended by an operator, or by a step before
        conn.execute(
            text(
                "UPDATE beat_runs SET state = :state, finished_at = now() - interval '1 minute',"
                " error = 'ended before' WHERE id = :id"
            ),
            {"id": run_id, "state": ended.value},
        )
    before = row(store, run_id)

    finish(run_store, member, RunState.FAILED, error="ValueError: late")
    set_state(store, member, RunState.LOST.value)

    assert row(store, run_id) == before


def test_a_step_sent_after_its_workflow_ended_is_recorded_cancelled_and_never_starts(
    store: Store, run_store: RunStore
) -> None:
    """A plain step the reaper ended lost may still succeed, and Celery then sends the
    next step: its workflow has ended, so that step must not run."""
    run_id = workflow_run(store, chain_of_three())
    first = record(run_store, run_id, "0")
    start(run_store, first)
    set_state(store, first, RunState.LOST.value)
    assert state_of(store, run_id) == RunState.LOST.value

    assert run_store.record_step(message(run_id, "1"))
    late = uuid.UUID(step_task_id(run_id, "1"))
    assert state_of_step(run_store, late) == RunState.CANCELLED.value
    refused = guard(run_store, late, owner="w:1")
    assert isinstance(refused, Refused)
    assert refused.state == RunState.CANCELLED.value


def test_a_workflow_failed_by_one_step_keeps_that_steps_error(
    store: Store, run_store: RunStore
) -> None:
    run_id = workflow_run(store, group_of(2))
    first, second = record(run_store, run_id, "0"), record(run_store, run_id, "1")
    start(run_store, first)
    start(run_store, second)
    finish(run_store, first, RunState.FAILED, error="ValueError: first")
    failed = row(store, run_id)

    finish(run_store, second, RunState.FAILED, error="ValueError: second")

    assert row(store, run_id) == failed
    assert failed.error == f"step 0 ({STEP_TASK}) failed: ValueError: first"


def test_a_state_written_again_unchanged_fires_nothing(store: Store, run_store: RunStore) -> None:
    """An UPDATE that sets a step's state to the state it has (a delivery that takes
    over a running step whose lease expired; an operator writing it again) is no
    transition: the workflow is not moved, although its steps would end it now."""
    run_id = workflow_run(store, group_of(2))
    succeed(run_store, run_id, "0")
    assert state_of(store, run_id) == RunState.RUNNING.value
    other = uuid.UUID(step_task_id(run_id, "1"))
    with store.engine.begin() as conn:  # made succeeded by an INSERT: no transition
        conn.execute(
            text(
                "INSERT INTO beat_runs (id, task, state, workflow_run_id, step)"
                " VALUES (:id, :task, 'succeeded', :workflow, '1')"
            ),
            {"id": other, "task": STEP_TASK, "workflow": run_id},
        )

    set_state(store, uuid.UUID(step_task_id(run_id, "0")), RunState.SUCCEEDED.value)
    assert state_of(store, run_id) == RunState.RUNNING.value, "every end succeeded, no transition"

    # A step taken over by a second delivery: running -> running, nothing fired.
    third = workflow_run(store, chain_of_three())
    step_id = record(run_store, third, "0")
    start(run_store, step_id)
    set_state(store, third, RunState.QUEUED.value)  # as if the start had not moved it
    expire_leases(store)
    start(run_store, step_id, worker="worker2@host")
    assert row(store, step_id).attempt == 2
    assert state_of(store, third) == RunState.QUEUED.value


# -- 3. end steps that succeed at once ------------------------------------------------


def _concurrency_cases() -> Iterator[Any]:
    for members in (2, 3):
        for issued in itertools.permutations(range(members)):
            commits = (issued, tuple(reversed(issued))) if members == 2 else (issued[::-1],)
            for committed in commits:
                label = f"issue{''.join(map(str, issued))}-commit{''.join(map(str, committed))}"
                yield pytest.param(issued, committed, id=label)


def _waiting_on_a_lock(store: Store, pid: int) -> bool:
    with store.engine.connect() as conn:
        wait = conn.execute(
            text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
        ).scalar_one_or_none()
    return wait == "Lock"


def _until(condition: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return False


@pytest.mark.parametrize(("issued", "committed"), list(_concurrency_cases()))
def test_end_steps_that_succeed_in_concurrent_transactions_end_their_workflow(
    store: Store, run_store: RunStore, issued: Sequence[int], committed: Sequence[int]
) -> None:
    """The members of a group (each an end step) succeed at once, each in its own
    transaction (a worker records the completion with the task's effects): every
    completion is issued before any commits, in the order ``issued``, and the
    transactions are let commit in the order ``committed``. The last of them must end
    the workflow ``succeeded``.

    Were the trigger to read the steps without locking the workflow's row first, each
    transaction would see the others' steps uncommitted (still running) and leave the
    workflow running for ever. It locks the row: the second completion waits (seen
    here on ``pg_stat_activity``) until the first commits, then reads its step."""
    members = len(issued)
    run_id = workflow_run(store, group_of(members))
    steps = []
    for index in range(members):
        step_id = record(run_store, run_id, str(index))
        start(run_store, step_id)
        steps.append(step_id)

    connections = [store.engine.connect() for _ in steps]
    pids = [conn.execute(text("SELECT pg_backend_pid()")).scalar_one() for conn in connections]
    for conn in connections:
        conn.commit()
    completed = [threading.Event() for _ in steps]
    may_commit = [threading.Event() for _ in steps]
    go = [threading.Event() for _ in steps]
    outcomes: dict[int, Any] = {}

    def completion(index: int) -> None:
        conn = connections[index]
        try:
            go[index].wait(30)
            conn.execute(text("SET LOCAL statement_timeout = '30s'"))
            recorded = run_store.finish(
                steps[index], owner=OWNER, state=RunState.SUCCEEDED, conn=conn
            )
            completed[index].set()
            may_commit[index].wait(30)
            conn.commit()
            outcomes[index] = recorded
        except Exception as exc:  # reported below, in the test's thread
            outcomes[index] = exc
            completed[index].set()

    threads = [threading.Thread(target=completion, args=(index,)) for index in range(members)]
    for thread in threads:
        thread.start()
    blocked: list[bool] = []
    try:
        for index in issued:
            go[index].set()
            assert _until(
                lambda i=index: completed[i].is_set() or _waiting_on_a_lock(store, pids[i])
            ), f"completion {index} neither returned nor waits"
            blocked.append(not completed[index].is_set())
        for index in committed:
            may_commit[index].set()
            time.sleep(0.01)  # let it commit now if it can
    finally:
        for event in (*go, *may_commit):
            event.set()
        for thread in threads:
            thread.join(30)
        for conn in connections:
            conn.close()

    assert outcomes == dict.fromkeys(range(members), True)
    assert {state_of(store, step_id) for step_id in steps} == {RunState.SUCCEEDED.value}
    workflow = row(store, run_id)
    assert workflow.state == RunState.SUCCEEDED.value, "the last completion ends the workflow"
    assert workflow.finished_at is not None
    assert blocked == [False] + [True] * (members - 1), (
        "each completion after the first waits for the workflow's row"
    )


# -- 4. the leader's recovery leaves a workflow with recorded steps to its steps ---------


@pytest.fixture
def three_kinds_of_runs(store: Store, run_store: RunStore) -> dict[str, uuid.UUID]:
    """A workflow run none of whose steps is recorded (its message may be lost), one
    with a recorded step, that step, and an ordinary run: all queued long ago."""
    bare = workflow_run(store, chain_of_three())
    followed = workflow_run(store, chain_of_three())
    step = record(run_store, followed, "0", task="e2e.first")
    ordinary = plain_run(store)
    published_ago(store, 600)
    return {"bare": bare, "followed": followed, "step": step, "ordinary": ordinary}


def test_lost_message_recovery_looks_for_a_workflow_only_until_a_step_is_recorded(
    store: Store, three_kinds_of_runs: dict[str, uuid.UUID]
) -> None:
    runs = three_kinds_of_runs

    unconfirmed = store.unconfirmed_runs(older_than=60, limit=100)

    found = {run.id for run in unconfirmed.runs}
    assert found == {runs["bare"], runs["step"], runs["ordinary"]}
    assert runs["followed"] not in found, "its steps are looked for, not it"


def test_the_reaper_sends_a_stale_workflow_again_only_until_a_step_is_recorded(
    store: Store, three_kinds_of_runs: dict[str, uuid.UUID]
) -> None:
    runs = three_kinds_of_runs
    assert store.take_leadership(EPOCH, "leader")

    reclaim = store.reclaim(EPOCH, stale_queued_after=60, limit=100)

    assert {run.id for run in reclaim.runs} == {runs["bare"], runs["step"], runs["ordinary"]}
    assert reclaim.lost == []
    for name in ("bare", "step", "ordinary"):
        again = row(store, runs[name])
        assert (again.state, again.recovery_sends, again.epoch) == (
            RunState.PENDING.value,
            1,
            EPOCH,
        ), name
    followed = row(store, runs["followed"])
    assert (followed.state, followed.recovery_sends) == (RunState.QUEUED.value, 0)


def test_a_workflow_left_to_its_step_ends_with_it_when_the_reaper_gives_the_step_up(
    store: Store, run_store: RunStore
) -> None:
    """However often the reaper passes, a workflow left to its steps is neither sent
    again nor counted against the bound (``MAX_SENDS``): its step is, and once that
    step ends ``lost``, the workflow does, naming it."""
    run_id = workflow_run(store, group_of(2))
    step_id = record(run_store, run_id, "0", task="e2e.member0")
    assert store.take_leadership(EPOCH, "leader")
    for _ in range(MAX_SENDS - 1):
        published_ago(store, 600)
        reclaim = store.reclaim(EPOCH, stale_queued_after=60, limit=100)
        assert [again.id for again in reclaim.runs] == [step_id]
        assert store.mark_published([step_id]) == 1
        workflow = row(store, run_id)
        assert (workflow.state, workflow.recovery_sends) == (RunState.QUEUED.value, 0)

    published_ago(store, 600)
    reclaim = store.reclaim(EPOCH, stale_queued_after=60, limit=100)

    assert (reclaim.runs, [lost.id for lost in reclaim.lost]) == ([], [step_id])
    workflow = row(store, run_id)
    assert (workflow.state, workflow.recovery_sends) == (RunState.LOST.value, 0)
    assert workflow.error == (
        f"step 0 (e2e.member0) lost: its message was sent {MAX_SENDS} times and no worker"
        " recorded it: a consumer that does not record runs may have taken it"
    )


# -- 5. the options a step's message is recorded with ---------------------------------

WORKFLOW_RUN = uuid.UUID("8f0c4a2e-57a4-4b8f-9d1e-2c3b4a5d6e7f")
CHAIN_REST = [{"task": "e2e.last", "args": [], "kwargs": {}, "options": {}}]
CHORD_BODY = {"task": "e2e.body", "args": [], "kwargs": {}, "options": {}}
CALLBACK = {"task": "e2e.notify", "args": [], "kwargs": {}, "options": {}}


def published_pair(**headers: Any) -> tuple[dict[str, Any], tuple[Any, Any, Any]]:
    """The (headers, body) of a step's message as ``before_task_publish`` has them
    (Celery's protocol 2: the body is args, kwargs and the embed)."""
    sent = {
        "lang": "py",
        "task": "e2e.member1",
        "id": step_task_id(WORKFLOW_RUN, "1.h.1"),
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": "1d0f4b77-2f5a-5c43-8d1f-0b5e8d4f3c2a",
        "group_index": 1,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": step_task_id(WORKFLOW_RUN, "0"),
        "parent_id": step_task_id(WORKFLOW_RUN, "0"),
        "argsrepr": "(7,)",
        "kwargsrepr": "{}",
        "origin": "gen1@host",
        "ignore_result": False,
        "habeat_schedule": "wf-nightly",
        WORKFLOW_HEADER: str(WORKFLOW_RUN),
        STEP_HEADER: "1.h.1",
    }
    sent.update(headers)
    embed = {"callbacks": [CALLBACK], "errbacks": None, "chain": CHAIN_REST, "chord": CHORD_BODY}
    return sent, ([7], {"scale": 2}, embed)


def message_of(
    headers: dict[str, Any],
    body: tuple[Any, Any, Any],
    *,
    queue: str | None = "fast",
    priority: int | None = None,
) -> StepMessage:
    args, kwargs, embed = body
    return step_message(
        headers,
        task=headers["task"],
        args=list(args),
        kwargs=dict(kwargs),
        embed=embed,
        queue=queue,
        priority=priority,
    )


def test_a_steps_message_keeps_its_place_in_the_canvas_as_send_task_options() -> None:
    headers, body = published_pair()

    step = message_of(headers, body, priority=0)

    assert step == StepMessage(
        task_id=step_task_id(WORKFLOW_RUN, "1.h.1"),
        workflow_run_id=WORKFLOW_RUN,
        step="1.h.1",
        task="e2e.member1",
        args=[7],
        kwargs={"scale": 2},
        options={
            "group_id": headers["group"],
            "group_index": 1,
            "root_id": headers["root_id"],
            "parent_id": headers["parent_id"],
            "link": [CALLBACK],
            "chain": CHAIN_REST,
            "chord": CHORD_BODY,
            "headers": {WORKFLOW_HEADER: str(WORKFLOW_RUN), STEP_HEADER: "1.h.1"},
            "queue": "fast",
            "priority": 0,
        },
    )


def test_a_steps_message_drops_the_options_it_does_not_have() -> None:
    """A chain's first step sent by beat: no group, parent, callbacks or chord, no
    queue or priority. The first member of a group keeps its index 0."""
    headers, (args, kwargs, _) = published_pair(group=None, group_index=None, parent_id=None)
    empty: dict[str, Any] = {"callbacks": None, "errbacks": [], "chain": [], "chord": None}

    step = message_of(headers, (args, kwargs, empty), queue=None)

    assert step.options == {
        "root_id": headers["root_id"],
        "headers": {WORKFLOW_HEADER: str(WORKFLOW_RUN), STEP_HEADER: "1.h.1"},
    }
    assert message_of(headers, (args, kwargs, {}), queue="").options == step.options
    first_member = message_of(*published_pair(group_index=0))
    assert first_member.options["group_index"] == 0


@pytest.fixture
def sending_app(test_env: SessionEnv) -> Iterator[Celery]:
    """An app set up for this scheduler whose messages stay in memory, current while
    the test runs (``record_sent_step`` reads ``current_app``)."""
    app = Celery("habeat-steps", broker="memory://", backend="cache+memory://")
    app.conf.update(habeat_database_url=test_env.database_url, habeat_redis_url=test_env.redis_url)
    previous = celery_current_app._get_current_object()
    app.set_current()
    try:
        yield app
    finally:
        previous.set_current()
        app.close()


def sent_by_beat(app: Celery, store: Store, run_id: uuid.UUID) -> list[dict[str, Any]]:
    """The ``before_task_publish`` arguments of the first steps of workflow run ``run_id``
    as beat's publisher sends them (``send_workflow``: Celery's canvas code)."""
    stored = row(store, run_id)
    run = RunToPublish(
        id=stored.id,
        task=stored.task,
        args=stored.args,
        kwargs=stored.kwargs,
        options=stored.options,
        schedule_name=stored.schedule_name,
        fire_at=stored.fire_at,
        attempt=stored.attempt,
    )
    captured: list[dict[str, Any]] = []

    def capture(**sent: Any) -> None:
        captured.append(sent)

    before_task_publish.connect(capture, weak=False)
    try:
        with app.producer_or_acquire() as producer:
            send_workflow(app, producer, run, mandatory=False)
    finally:
        before_task_publish.disconnect(capture)
    return captured


def test_the_steps_celery_sends_are_recorded_with_what_sends_them_again_in_place(
    store: Store, sending_app: Celery
) -> None:
    first = task("e2e.first").set(queue="fast", priority=3)
    canvases = {
        "chain": chain(first, task("e2e.last")),
        "group": group_of(2),
        "chord": chord([task("e2e.h0")], task("e2e.body")),
    }
    runs = {kind: workflow_run(store, canvas) for kind, canvas in canvases.items()}
    for run_id in runs.values():
        for sent in sent_by_beat(sending_app, store, run_id):
            record_sent_step(**sent)

    [chain_step] = run_rows(store, workflow_run_id=runs["chain"])
    assert chain_step.id == uuid.UUID(step_task_id(runs["chain"], "0"))
    assert chain_step.options["queue"] == "fast"
    assert chain_step.options["priority"] == 3
    assert chain_step.options["root_id"] == str(chain_step.id)
    assert [link["task"] for link in chain_step.options["chain"]] == ["e2e.last"]
    assert chain_step.options["headers"] == {
        WORKFLOW_HEADER: str(runs["chain"]),
        STEP_HEADER: "0",
    }
    assert not {"group_id", "parent_id", "link", "link_error", "chord"} & set(chain_step.options)

    members = sorted(
        run_rows(store, workflow_run_id=runs["group"]),
        key=lambda member: member.options["group_index"],
    )
    assert [member.step for member in members] == ["0", "1"]
    assert [member.options["group_index"] for member in members] == [0, 1]
    assert {member.options["group_id"] for member in members} == {group_id(runs["group"], "")}
    assert [member.options["queue"] for member in members] == ["celery", "celery"]

    [header] = run_rows(store, workflow_run_id=runs["chord"])
    assert header.step == "h.0"
    assert header.options["chord"]["task"] == "e2e.body"
    assert header.options["group_index"] == 0
    assert "chain" not in header.options


def test_a_chords_header_steps_are_sent_under_the_group_id_derived_from_the_run(
    store: Store, sending_app: Celery
) -> None:
    """``beat.schedule.workflow``: a run published twice sends the same group IDs, "and a
    chord counts its header's parts in one place" (Celery rebuilds a chord's header as a
    list, which a plain ``signature(stamped(...))`` sends under a new random group ID at
    every publication)."""
    run_id = workflow_run(store, chord([task("e2e.h0"), task("e2e.h1")], task("e2e.body")))

    first = sent_by_beat(sending_app, store, run_id)
    again = sent_by_beat(sending_app, store, run_id)

    assert [sent["headers"][STEP_HEADER] for sent in first] == ["h.0", "h.1"]
    assert [sent["headers"]["id"] for sent in again] == [sent["headers"]["id"] for sent in first]
    groups = {sent["headers"]["group"] for sent in (*first, *again)}
    assert groups == {group_id(run_id, "h")}


@pytest.mark.parametrize("idle", [True, False], ids=["idle", "moving"])
def test_a_workflow_whose_next_step_was_never_sent_is_ended_lost_by_the_reaper(
    store: Store, run_store: RunStore, idle: bool
) -> None:
    """Step 0 succeeded and no step 1 was ever recorded (its sender died before the
    send): once nothing of the workflow moved for the reaper's bound, the run ends
    ``lost`` saying so; a workflow that moved within the bound is left running."""
    run_id = workflow_run(store, chain_of_three())
    first = record(run_store, run_id, "0")
    start(run_store, first)
    finish(run_store, first, RunState.SUCCEEDED)
    if idle:
        with store.engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE beat_runs SET finished_at = now() - interval '2 minutes',"
                    " started_at = now() - interval '2 minutes',"
                    " published_at = now() - interval '2 minutes' WHERE id = :id"
                ),
                {"id": first},
            )
    assert store.take_leadership(EPOCH, "leader")

    reclaim = store.reclaim(EPOCH, stale_queued_after=60, limit=10)

    if not idle:
        assert reclaim.lost == []
        assert state_of(store, run_id) == RunState.RUNNING.value
        return
    assert [lost.id for lost in reclaim.lost] == [run_id]
    workflow = row(store, run_id)
    assert workflow.state == RunState.LOST.value
    assert workflow.error == STALLED


def test_a_step_of_a_workflow_run_that_is_gone_is_recorded_cancelled(
    run_store: RunStore,
) -> None:
    """A leader may send the canvas of a run an edit withdrew (deleted) before its fire
    time: its steps must not run."""
    gone = uuid.uuid4()
    run_store.record_step(message(gone, "0"))
    step_id = uuid.UUID(step_task_id(gone, "0"))
    assert state_of_step(run_store, step_id) == RunState.CANCELLED.value


def test_a_step_that_succeeded_with_its_links_unsent_is_sent_again_a_bounded_number_of_times(
    store: Store, run_store: RunStore
) -> None:
    """Its worker died before it sent the steps after it, and its message is gone (a
    Redis restart): the leader sends the message again, so that a worker finds the
    step succeeded and sends what was left; at most ``MAX_SENDS`` times."""
    run_id = workflow_run(store, chain_of_three())
    first = record(run_store, run_id, "0")
    start(run_store, first)
    done = record(run_store, run_id, "1")
    start(run_store, done)
    finish(run_store, done, RunState.SUCCEEDED)
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE beat_runs SET state = 'succeeded', unsent_links = '{\"result\": 3}',"
                " finished_at = now() - interval '2 minutes' WHERE id = :id"
            ),
            {"id": first},
        )
    assert store.take_leadership(EPOCH, "leader")

    sends = [store.links_left_unsent(EPOCH, older_than=60, limit=10) for _ in range(MAX_SENDS + 1)]

    assert [[run.id for run in sent] for sent in sends] == [[first]] * MAX_SENDS + [[]]
    assert sends[0][0].task == STEP_TASK
    assert state_of_step(run_store, first) == RunState.SUCCEEDED.value
    assert store.links_left_unsent(EPOCH, older_than=600, limit=10) == []
