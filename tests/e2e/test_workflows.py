"""Scheduled workflows end to end: a schedule fires a Celery canvas, real beat and
worker processes run it, and the run is the whole workflow: ``succeeded`` once every
step did, each step once, ``failed`` naming the step that failed; the overlap policy
``skip`` looks at the whole workflow, not at its first step."""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from typing import Any

import pytest
from celery import chain, chord, group
from playwright.sync_api import expect

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.records import RunRecord
from beat.schedule.workflow import plan, stored_canvas
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.e2e import jobs
from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.test_incidents import FAST
from tests.e2e.ui_browser import PASSWORD, USER, browser, screenshot, start_ui

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def results_where_schedules_are_checked(
    monkeypatch: pytest.MonkeyPatch, test_env: SessionEnv
) -> None:
    """The app the tests define schedules with has the cluster's result backend: a
    workflow with a chord is refused on an app without one."""
    monkeypatch.setitem(jobs.celery_app.conf, "result_backend", test_env.redis_url)


def record(app: Any, label: str) -> Any:
    return app.signature("e2e.record", args=[label], immutable=True)


def plain(app: Any, label: str) -> Any:
    return app.signature("e2e.plain_record", args=[label], immutable=True)


def with_results_backend(cluster: Cluster, test_env: SessionEnv) -> None:
    cluster.settings = {
        "CELERY_RESULT_BACKEND": test_env.redis_url,
        "HABEAT_LEASE_TIMEOUT": "4",
        "HABEAT_MAX_WAIT": "1",
    }


def finished_runs(store: Store, name: str) -> list[RunRecord]:
    found = Schedules(store).runs(name, limit=50)
    done = [run for run in found if run.finished_at and run.state is not RunState.SKIPPED]
    return sorted(done, key=lambda run: run.fire_at or run.claimed_at)


def steps_of(store: Store, run: RunRecord) -> list[RunRecord]:
    return Schedules(store).steps(run.id)


def workflows(app: Any) -> dict[str, Any]:
    return {
        "chain": chain(record(app, "c0"), plain(app, "c1"), record(app, "c2")),
        "group": group(record(app, f"g{index}") for index in range(5)),
        "chord": chord(
            [record(app, f"h{index}") for index in range(5)],
            app.signature("e2e.gather", args=["body"]),
        ),
        "nested": chain(
            record(app, "n0"),
            group(record(app, "n1a"), plain(app, "n1b")),
            app.signature("e2e.gather", args=["n2"]),
        ),
    }


def test_each_scheduled_workflow_succeeds_with_every_step_run_once(
    cluster: Cluster, store: Store, test_env: SessionEnv
) -> None:
    with_results_backend(cluster, test_env)
    app = cluster.app()
    schedules = Schedules(store, app=jobs.celery_app)
    shapes = workflows(app)
    for name, canvas in shapes.items():
        schedules.create(f"wf-{name}", workflow=canvas, every=3, max_runs=2)
    cluster.worker("worker1", concurrency=4, pool="threads")
    cluster.beat("beat0")

    def all_done() -> bool:
        return all(len(finished_runs(store, f"wf-{name}")) == 2 for name in shapes)

    wait_until(all_done, timeout=90, interval=0.5)
    for name, canvas in shapes.items():
        expected = {step.path for step in plan(stored_canvas(canvas)).steps}
        for run in finished_runs(store, f"wf-{name}"):
            assert run.state is RunState.SUCCEEDED, (name, run.error)
            steps = steps_of(store, run)
            assert {step.step for step in steps} == expected, name
            assert all(step.state is RunState.SUCCEEDED for step in steps), name
            assert all(step.attempt == 1 for step in steps), name
            assert run.started_at is not None
            assert run.finished_at is not None
            last_step_end = max(step.finished_at for step in steps if step.finished_at)
            assert run.finished_at >= last_step_end, "the run ended before its last step"
    labels = cluster.labels()
    for label in ("c0", "c1", "c2", "body", "n0", "n1a", "n1b", "n2"):
        assert labels[label] == 2, (label, labels)
    for index in range(5):
        assert labels[f"g{index}"] == 2
        assert labels[f"h{index}"] == 2


def test_a_step_that_fails_fails_its_workflow_naming_the_step(
    cluster: Cluster, store: Store, test_env: SessionEnv
) -> None:
    with_results_backend(cluster, test_env)
    app = cluster.app()
    canvas = chain(
        record(app, "before"),
        app.signature("e2e.fail", args=["broken"], immutable=True),
        record(app, "never"),
    )
    Schedules(store, app=jobs.celery_app).create("wf-failing", workflow=canvas, every=3, max_runs=1)
    cluster.worker("worker1", concurrency=2, pool="threads")
    cluster.beat("beat0")

    wait_until(lambda: finished_runs(store, "wf-failing"), timeout=60, interval=0.5)
    (run,) = finished_runs(store, "wf-failing")
    assert run.state is RunState.FAILED
    assert run.error is not None
    assert "step 1 (e2e.fail)" in run.error
    assert "fails every time" in run.error
    time.sleep(2)
    assert "never" not in cluster.labels()
    states = {step.step: step.state for step in steps_of(store, run)}
    assert states == {"0": RunState.SUCCEEDED, "1": RunState.FAILED}


def test_skip_overlap_skips_a_fire_time_while_the_whole_workflow_runs(
    cluster: Cluster, store: Store, test_env: SessionEnv
) -> None:
    """The workflow's first step ends at once, its second takes 6 s: fire times every
    2 s meanwhile are skipped until the second step ends, not after the first."""
    with_results_backend(cluster, test_env)
    app = cluster.app()
    canvas = chain(
        record(app, "quick"),
        app.signature("e2e.slow", args=["slow", 6], immutable=True),
    )
    schedules = Schedules(store, app=jobs.celery_app)
    schedules.create("wf-overlap", workflow=canvas, every=2, overlap_policy="skip")
    cluster.worker("worker1", concurrency=2, pool="threads")
    cluster.beat("beat0")

    def succeeded() -> list[RunRecord]:
        ran = [run for run in schedules.runs("wf-overlap", limit=50)]
        return sorted(
            (run for run in ran if run.state is RunState.SUCCEEDED), key=lambda run: run.fire_at
        )

    wait_until(lambda: len(succeeded()) >= 2, timeout=60, interval=0.5)
    schedules.pause("wf-overlap")
    first, second = succeeded()[:2]
    assert first.finished_at is not None
    assert second.fire_at is not None
    assert second.fire_at >= first.finished_at - timedelta(seconds=2.5), "fired while it ran"
    between = [
        run
        for run in schedules.runs("wf-overlap", limit=50)
        if run.fire_at is not None
        and first.fire_at is not None
        and first.fire_at < run.fire_at < second.fire_at
    ]
    assert len(between) >= 2, "no fire time skipped while the workflow's slow step ran"
    assert all(run.state is RunState.SKIPPED for run in between), between


def _kill_the_worker_running(cluster: Cluster, schedules: Schedules, path: str) -> None:
    """Wait for the step at ``path`` of the schedule's first run to run, a second in,
    then SIGKILL the worker process running it."""

    def running_step() -> RunRecord | None:
        runs = schedules.runs("wf-killed", limit=5)
        for run in runs:
            for step in schedules.steps(run.id):
                if step.step == path and step.state is RunState.RUNNING:
                    return step
        return None

    wait_until(lambda: running_step() is not None, timeout=60, interval=0.1)
    step = running_step()
    assert step is not None
    assert step.worker is not None
    time.sleep(1)
    cluster.process_for_worker(step.worker).signal(signal.SIGKILL)


@pytest.mark.parametrize(
    ("shape", "killed", "ends"),
    [
        ("chain", "1", ("k0", "k1", "k2")),
        ("chord", "h.0", ("k0", "k1", "k2", "body")),
    ],
    ids=["middle-of-a-chain", "in-a-chords-header"],
)
def test_a_step_whose_worker_is_killed_is_sent_again_alone_and_runs_once(
    cluster: Cluster,
    store: Store,
    test_env: SessionEnv,
    shape: str,
    killed: str,
    ends: tuple[str, ...],
) -> None:
    with_results_backend(cluster, test_env)
    app = cluster.app()
    slow = app.signature("e2e.long", args=["k1" if shape == "chain" else "k0", 4], immutable=True)
    if shape == "chain":
        canvas = chain(record(app, "k0"), slow, record(app, "k2"))
    else:
        canvas = chord(
            [slow, record(app, "k1"), record(app, "k2")], app.signature("e2e.gather", args=["body"])
        )
    schedules = Schedules(store, app=jobs.celery_app)
    schedules.create("wf-killed", workflow=canvas, in_seconds=0)
    for index in range(2):
        cluster.worker(f"worker{index}", concurrency=1)
    cluster.beat("beat0")

    _kill_the_worker_running(cluster, schedules, killed)
    cluster.worker("worker2", concurrency=1)
    wait_until(lambda: finished_runs(store, "wf-killed"), timeout=90, interval=0.5)
    (run,) = finished_runs(store, "wf-killed")
    assert run.state is RunState.SUCCEEDED, run.error
    labels = cluster.labels()
    for label in ends:
        assert labels[label] == 1, (label, labels)
    slow_label = "k1" if shape == "chain" else "k0"
    assert labels[f"{slow_label}:start"] == 2, "the killed step was not started again"
    steps = {step.step: step for step in schedules.steps(run.id)}
    assert steps[killed].attempt - steps[killed].retries >= 2
    assert all(step.attempt == 1 for path, step in steps.items() if path != killed), {
        path: step.attempt for path, step in steps.items()
    }


def test_a_workflow_runs_page_shows_its_steps_as_a_tree_in_a_browser(
    cluster: Cluster, store: Store, test_env: SessionEnv
) -> None:
    """From the schedule's page to the run's page: the canvas as a tree, each step with
    its state and worker, the failed step's error; a step's link leads to its own page,
    which names its workflow run. (Celery itself makes ``chord | task`` a chord whose
    body is a chain: the paths are those of the canvas as stored.)"""
    with_results_backend(cluster, test_env)
    app = cluster.app()
    canvas = chain(
        record(app, "extract"),
        chord(
            [record(app, f"transform-{index}") for index in range(3)],
            app.signature("e2e.gather", args=["load"]),
        ),
        app.signature("e2e.fail", args=["publish"], immutable=True),
    )
    schedules = Schedules(store, app=jobs.celery_app)
    schedules.create("nightly-etl", workflow=canvas, in_seconds=0)
    cluster.worker("worker1", concurrency=2)
    cluster.beat("beat0")
    wait_until(lambda: finished_runs(store, "nightly-etl"), timeout=60, interval=0.5)
    (run,) = finished_runs(store, "nightly-etl")
    _, base = start_ui(cluster)

    with browser() as chromium:
        context = chromium.new_context(
            http_credentials={"username": USER, "password": PASSWORD},
            viewport={"width": 1400, "height": 900},
        )
        page = context.new_page()
        page.goto(base + "/schedules/nightly-etl")
        page.locator(f'#runs tr[data-run="{run.id}"] a.run-link').click()
        expect(page.locator("#run-state")).to_have_text("failed")
        expect(page.locator("#run-error")).to_contain_text("step 1.b.1 (e2e.fail) failed")
        expect(page.locator("#run-target")).to_have_text(
            "chain(e2e.record | chord([e2e.record, e2e.record, e2e.record],"
            " chain(e2e.gather | e2e.fail)))"
        )
        rows = page.locator("#steps tr.step")
        expect(rows).to_have_count(6)
        states = {
            rows.nth(index).get_attribute("data-step"): rows.nth(index).get_attribute("data-state")
            for index in range(6)
        }
        assert states == {
            "0": "succeeded",
            "1.h.0": "succeeded",
            "1.h.1": "succeeded",
            "1.h.2": "succeeded",
            "1.b.0": "succeeded",
            "1.b.1": "failed",
        }
        containers = page.locator("#steps tr.container")
        expect(containers).to_have_count(4)  # the chain, the chord, its header, its body
        expect(page.locator('#steps tr[data-step="1.b.1"]')).to_contain_text("fails every time")
        screenshot(page, "workflow-run")
        page.locator('#steps tr[data-step="1.b.0"] a').click()
        expect(page.locator("body")).to_contain_text(f"step 1.b.0 of workflow run {run.id}")
        expect(page.locator("#run-state")).to_have_text("succeeded")
        context.close()


def test_a_workflow_revoked_past_its_max_runtime_ends_failed_and_its_running_step_is_terminated(
    cluster: Cluster, store: Store, test_env: SessionEnv
) -> None:
    """``max_runtime`` is the whole workflow's: past it, the run ends ``failed``, its
    running step is cancelled and its process terminated (its effect never written), and
    the steps after it are never sent."""
    with_results_backend(cluster, test_env)
    cluster.settings |= FAST
    app = cluster.app()
    canvas = chain(
        record(app, "first"),
        app.signature("e2e.slow", args=["hung", 12], immutable=True),
        record(app, "after"),
    )
    schedules = Schedules(store, app=jobs.celery_app)
    schedules.create(
        "wf-hung", workflow=canvas, in_seconds=0, max_runtime=3, revoke_after_max_runtime=True
    )
    cluster.worker("worker0", concurrency=2, pool="prefork")
    cluster.beat("beat0")

    wait_until(lambda: finished_runs(store, "wf-hung"), timeout=45, interval=0.5)
    (run,) = finished_runs(store, "wf-hung")
    assert run.state is RunState.FAILED
    assert run.error == "revoked: it ran past its max_runtime of 3s"
    steps = {step.step: step for step in schedules.steps(run.id)}
    assert steps["0"].state is RunState.SUCCEEDED
    assert steps["1"].state is RunState.CANCELLED
    assert "its workflow run was revoked" in (steps["1"].reason or "")
    time.sleep(12)  # past the hung step's own 12 s, had it gone on
    assert "hung" not in cluster.labels()
    assert "after" not in cluster.labels()
    assert {step.step for step in schedules.steps(run.id)} == {"0", "1"}


def test_cancel_previous_cancels_the_running_workflow_and_its_steps(
    cluster: Cluster, store: Store, test_env: SessionEnv
) -> None:
    """A newer fire time cancels the workflow still running, its running step with it:
    that step's completion is refused (its effect never written), and its next step is
    never sent."""
    with_results_backend(cluster, test_env)
    app = cluster.app()
    canvas = chain(
        record(app, "first"),
        app.signature("e2e.slow", args=["slow", 5], immutable=True),
        record(app, "after"),
    )
    schedules = Schedules(store, app=jobs.celery_app)
    schedules.create(
        "wf-cancelled", workflow=canvas, every=3, overlap_policy="cancel_previous", max_runs=2
    )
    cluster.worker("worker0", concurrency=2)
    cluster.beat("beat0")

    def runs() -> list[RunRecord]:
        return sorted(schedules.runs("wf-cancelled", limit=10), key=lambda run: run.fire_at)

    wait_until(lambda: len(runs()) == 2 and runs()[1].finished_at, timeout=60, interval=0.5)
    first, second = runs()
    assert first.state is RunState.CANCELLED
    assert second.state is RunState.SUCCEEDED, second.error
    steps = {step.step: step for step in schedules.steps(first.id)}
    assert steps["1"].state is RunState.CANCELLED
    assert "its workflow run was cancelled" in (steps["1"].reason or "")
    assert "2" not in steps, "the cancelled workflow's next step was sent"
    assert cluster.labels()["slow"] == 1, "only the second workflow's slow step completed"
    assert cluster.labels()["after"] == 1


def test_a_plain_step_whose_worker_is_killed_is_not_run_again_and_its_workflow_is_lost(
    cluster: Cluster, store: Store, test_env: SessionEnv
) -> None:
    """A plain task runs at most once once taken: a step on no idempotent base whose
    worker dies while it runs ends ``lost`` (it may have had its effect), and so does its
    workflow, naming it; the steps after it are never sent."""
    with_results_backend(cluster, test_env)
    app = cluster.app()
    canvas = chain(
        record(app, "k0"),
        app.signature("e2e.plain_long", args=["plain", 4], immutable=True),
        record(app, "k2"),
    )
    schedules = Schedules(store, app=jobs.celery_app)
    schedules.create("wf-killed", workflow=canvas, in_seconds=0)
    for index in range(2):
        cluster.worker(f"worker{index}", concurrency=1)
    cluster.beat("beat0")

    _kill_the_worker_running(cluster, schedules, "1")
    wait_until(lambda: finished_runs(store, "wf-killed"), timeout=60, interval=0.5)
    (run,) = finished_runs(store, "wf-killed")
    assert run.state is RunState.LOST
    assert run.error is not None
    assert run.error.startswith("step 1 (e2e.plain_long) lost:")
    time.sleep(5)  # past the plain step's own 4 s, had it been sent again
    labels = cluster.labels()
    assert labels["plain:start"] == 1, "a plain step ran twice"
    assert "k2" not in labels
