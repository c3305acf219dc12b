"""Scheduled workflows under the faults a review found each to break, with real beat
and worker processes: a worker killed between a chord step's completion and its count
in the chord, a header step whose worker was paused past its lease, a step nobody could
record, a plain step ended ``lost`` that succeeds after all, a cancelled workflow whose
plain step runs on, and a step with a countdown whose worker died holding it. Each
test failed before its fix (the workflow stayed ``running`` for ever, a step ran early,
or steps ran after their workflow ended)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from celery import chain, chord
from sqlalchemy import text

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.records import RunRecord
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.e2e import jobs
from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.test_workflows import finished_runs, record

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def results_where_schedules_are_checked(
    monkeypatch: pytest.MonkeyPatch, test_env: SessionEnv
) -> None:
    monkeypatch.setitem(jobs.celery_app.conf, "result_backend", test_env.redis_url)


def with_faults(cluster: Cluster, test_env: SessionEnv, tmp_path: Path, **extra: str) -> None:
    cluster.settings = {
        "CELERY_RESULT_BACKEND": test_env.redis_url,
        "HABEAT_LEASE_TIMEOUT": "4",
        "HABEAT_MAX_WAIT": "1",
        "HABEAT_VISIBILITY_TIMEOUT": "8",
        "E2E_MARKS": str(tmp_path / "marks"),
        **extra,
    }


def faulty_worker(cluster: Cluster, name: str, concurrency: int) -> Any:
    """A worker that imports the faults besides the jobs."""
    return cluster.worker(name, concurrency=concurrency, HABEAT_IMPORTS=FAULTY)


#: What the faulty workers import.
FAULTY = "tests.e2e.jobs,tests.e2e.workflow_faults"


def the_run(schedules: Schedules, name: str) -> RunRecord:
    (run,) = schedules.runs(name, limit=10)
    return run


def step_states(schedules: Schedules, run: RunRecord) -> dict[str, RunState]:
    return {step.step or "": step.state for step in schedules.steps(run.id)}


def test_a_chord_step_whose_worker_died_before_its_count_is_counted_by_its_next_delivery(
    cluster: Cluster, store: Store, test_env: SessionEnv, tmp_path: Path
) -> None:
    with_faults(cluster, test_env, tmp_path)
    app = cluster.app()
    canvas = chord(
        [
            record(app, "h0"),
            app.signature("e2e.die_before_chord_count", args=["h1"], immutable=True),
            record(app, "h2"),
        ],
        app.signature("e2e.gather", args=["body"]),
    )
    schedules = Schedules(store, app=jobs.celery_app)
    # The faulty task is the workers' (tests.e2e.workflow_faults), not this process's.
    schedules.create("wf-count", workflow=canvas, in_seconds=0, allow_unregistered=True)
    worker = faulty_worker(cluster, "worker0", 1)
    cluster.beat("beat0")
    wait_until(lambda: not worker.alive(), timeout=40, interval=0.2)
    faulty_worker(cluster, "worker1", 1)

    wait_until(lambda: finished_runs(store, "wf-count"), timeout=90, interval=0.5)
    run = the_run(schedules, "wf-count")
    assert run.state is RunState.SUCCEEDED, run.error
    assert step_states(schedules, run)["b"] is RunState.SUCCEEDED
    labels = cluster.labels()
    assert (labels["h0"], labels["h1"], labels["h2"], labels["body"]) == (1, 1, 1, 1)


def test_a_header_step_that_lost_its_lease_does_not_fail_its_chord(
    cluster: Cluster, store: Store, test_env: SessionEnv, tmp_path: Path
) -> None:
    """Its worker paused past the lease: the step is sent again and succeeds elsewhere;
    the paused attempt, resumed, finds its lease lost and stores nothing in the chord."""
    with_faults(cluster, test_env, tmp_path)
    app = cluster.app()
    canvas = chord(
        [app.signature("e2e.slow", args=["s0", 12], immutable=True), record(app, "h1")],
        app.signature("e2e.gather", args=["body"]),
    )
    schedules = Schedules(store, app=jobs.celery_app)
    schedules.create("wf-paused", workflow=canvas, in_seconds=0)
    paused = faulty_worker(cluster, "worker0", 1)
    cluster.beat("beat0")

    def slow_running_on_worker0() -> bool:
        return any(
            step.step == "h.0"
            and step.state is RunState.RUNNING
            and (step.worker or "").startswith("worker0")
            for run in schedules.runs("wf-paused", limit=5)
            for step in schedules.steps(run.id)
        )

    wait_until(slow_running_on_worker0, timeout=40, interval=0.1)
    time.sleep(0.5)
    paused.signal(signal.SIGSTOP)
    faulty_worker(cluster, "worker1", 2)
    time.sleep(9)  # past the lease: the reaper sends h.0 again, to worker1
    paused.signal(signal.SIGCONT)

    wait_until(lambda: finished_runs(store, "wf-paused"), timeout=90, interval=0.5)
    run = the_run(schedules, "wf-paused")
    assert run.state is RunState.SUCCEEDED, run.error
    assert cluster.labels()["body"] == 1
    assert cluster.labels()["s0"] == 1


def test_a_step_neither_its_send_nor_its_receipt_could_record_runs_once(
    cluster: Cluster, store: Store, test_env: SessionEnv, tmp_path: Path
) -> None:
    with_faults(cluster, test_env, tmp_path, E2E_UNRECORDED_STEP="1")
    app = cluster.app()
    canvas = chain(record(app, "a"), record(app, "b"), record(app, "c"))
    schedules = Schedules(store, app=jobs.celery_app)
    schedules.create("wf-unrecorded", workflow=canvas, in_seconds=0)
    faulty_worker(cluster, "worker0", 1)
    cluster.beat("beat0")

    wait_until(lambda: finished_runs(store, "wf-unrecorded"), timeout=60, interval=0.5)
    run = the_run(schedules, "wf-unrecorded")
    assert run.state is RunState.SUCCEEDED, run.error
    labels = cluster.labels()
    assert (labels["a"], labels["b"], labels["c"]) == (1, 1, 1)
    assert "could not record step 1" in cluster.logs()


def test_a_plain_step_that_succeeds_after_its_workflow_was_lost_sends_no_step_that_runs(
    cluster: Cluster, store: Store, test_env: SessionEnv, tmp_path: Path
) -> None:
    """Its worker paused past the lease: the plain step ends ``lost``, and so does the
    workflow; resumed, it succeeds, and Celery sends the next step: that step, sent
    after its workflow ended, is recorded ``cancelled`` and not run."""
    with_faults(cluster, test_env, tmp_path)
    app = cluster.app()
    canvas = chain(
        record(app, "a"),
        app.signature("e2e.plain_long", args=["p", 8], immutable=True),
        record(app, "c"),
    )
    schedules = Schedules(store, app=jobs.celery_app)
    schedules.create("wf-late", workflow=canvas, in_seconds=0)
    worker = faulty_worker(cluster, "worker0", 1)
    cluster.beat("beat0")

    def plain_started() -> Any:
        with store.engine.connect() as conn:
            return conn.execute(text("SELECT 1 FROM e2e_effects WHERE label = 'p:start'")).first()

    wait_until(plain_started, timeout=40, interval=0.1)
    worker.signal(signal.SIGSTOP)
    time.sleep(14)  # past the lease: the reaper ends the plain step lost
    worker.signal(signal.SIGCONT)
    time.sleep(15)  # the plain body ends (8 s) and Celery sends step 2

    run = the_run(schedules, "wf-late")
    assert run.state is RunState.LOST
    states = step_states(schedules, run)
    assert states.get("2", RunState.CANCELLED) is RunState.CANCELLED
    assert "c" not in cluster.labels(), "a step ran after its workflow had ended"


def test_a_step_with_a_countdown_whose_worker_died_holding_it_is_not_run_early(
    cluster: Cluster, store: Store, test_env: SessionEnv, tmp_path: Path
) -> None:
    with_faults(cluster, test_env, tmp_path)
    app = cluster.app()
    canvas = chain(record(app, "a"), record(app, "b").set(countdown=20))
    schedules = Schedules(store, app=jobs.celery_app)
    schedules.create("wf-countdown", workflow=canvas, in_seconds=0)
    worker = faulty_worker(cluster, "worker0", 1)
    cluster.beat("beat0")

    def held_since() -> Any:
        with store.engine.connect() as conn:
            return conn.execute(
                text(
                    "SELECT published_at FROM beat_runs WHERE step = '1'"
                    " AND lease_owner IS NOT NULL"
                )
            ).scalar()

    wait_until(held_since, timeout=40, interval=0.1)
    sent_at = held_since()
    worker.signal(signal.SIGKILL)
    faulty_worker(cluster, "worker1", 1)
    wait_until(lambda: cluster.labels().get("b"), timeout=90, interval=0.5)
    with store.engine.connect() as conn:
        ran_at = conn.execute(text("SELECT at FROM e2e_effects WHERE label = 'b'")).scalar()
    assert (ran_at - sent_at).total_seconds() >= 19, "the step ran before its countdown ended"
    assert cluster.labels()["b"] == 1


def test_a_chord_step_whose_outcome_could_not_be_recorded_stores_no_result_and_runs_again(
    cluster: Cluster, store: Store, test_env: SessionEnv, tmp_path: Path
) -> None:
    """Seen in the chaos suite at a PostgreSQL restart: the outcome of a header step could
    not be recorded, Celery stored the error it raised, and the chord failed while the
    step's next attempt succeeded. Now the message is handed back and nothing stored."""
    with_faults(cluster, test_env, tmp_path)
    app = cluster.app()
    canvas = chord(
        [
            record(app, "h0"),
            app.signature("e2e.unrecorded_outcome_once", args=["h1"], immutable=True),
            record(app, "h2"),
        ],
        app.signature("e2e.gather", args=["body"]),
    )
    schedules = Schedules(store, app=jobs.celery_app)
    schedules.create("wf-outcome", workflow=canvas, in_seconds=0, allow_unregistered=True)
    faulty_worker(cluster, "worker0", 2)
    cluster.beat("beat0")

    wait_until(lambda: finished_runs(store, "wf-outcome"), timeout=90, interval=0.5)
    run = the_run(schedules, "wf-outcome")
    assert run.state is RunState.SUCCEEDED, run.error
    labels = cluster.labels()
    assert (labels["h0"], labels["h1"], labels["h2"], labels["body"]) == (1, 1, 1, 1)
    assert "could not record run" in cluster.logs()
