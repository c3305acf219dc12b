"""`celery -A app schedules add NAME --workflow JSON` and `runs NAME --steps` against
real PostgreSQL: a canvas given as JSON is stored as a workflow schedule; a canvas that
cannot run is refused in one line with nothing written; a workflow run's steps are
listed as the canvas's tree, each with what its run recorded."""

from __future__ import annotations

import json
import uuid

import pytest
import redis
from celery import Celery, chain, chord
from sqlalchemy import text

from app.factory import create_app
from beat.store.all_roles import Store
from beat.store.runs import RunStore
from beat.store.workflow_steps import StepMessage
from tests.conftest import SessionEnv
from tests.integration.helpers import as_json, error_lines, invoke, table_rows

pytestmark = pytest.mark.integration


@pytest.fixture
def app(test_env: SessionEnv, store: Store, redis_client: redis.Redis) -> Celery:
    return create_app(
        test_env.settings(lock_ttl=3.0, max_wait=0.2, result_backend=test_env.redis_url)
    )


def test_a_workflow_with_a_chord_is_refused_on_an_app_without_a_result_backend(
    test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    without = create_app(test_env.settings())
    before = table_rows(store)
    refused = invoke(without, "add", "nightly", "--workflow", canvas(without), "--every", "60")
    assert refused.exit_code == 2
    [line] = error_lines(refused)
    assert "this workflow has a chord, which needs a result backend" in line
    assert "CELERY_RESULT_BACKEND" in line
    assert table_rows(store) == before


def canvas(app: Celery) -> str:
    add = app.signature("tasks.demo.add", args=[1, 2])
    total = chord(
        [
            app.signature("tasks.demo.add", args=[index, index], immutable=True)
            for index in range(2)
        ],
        app.signature("tasks.demo.report", immutable=True),
    )
    return json.dumps(chain(add, total))


def test_a_workflow_given_as_json_is_stored_and_listed(app: Celery) -> None:
    added = invoke(app, "add", "nightly", "--workflow", canvas(app), "--every", "3600", "--json")
    assert added.exit_code == 0, added.stderr
    shown = as_json(added)
    assert shown["task"] == "habeat.workflow"
    assert shown["kwargs"]["ends"] == ["1.b"]
    listed = invoke(app, "list")
    assert "habeat.workflow" in listed.stdout
    details = invoke(app, "show", "nightly")
    assert "habeat.workflow: chain(tasks.demo.add | chord([tasks.demo.add" in details.stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["nightly"], "give TASK, or --workflow JSON instead of it"),
        (
            ["nightly", "tasks.demo.add", "--workflow", "{}"],
            "give TASK, or --workflow JSON instead of it",
        ),
        (["nightly", "--workflow", "[1, 2"], "workflow must be a Celery signature as JSON"),
        (
            ["nightly", "--workflow", json.dumps({"task": "tasks.demo.nope"})],
            "step 0 names 'tasks.demo.nope', which is not a registered task",
        ),
        (
            ["nightly", "--workflow", json.dumps({"task": "tasks.demo.add", "args": [1]})],
            "step 0: task tasks.demo.add(x, y) cannot take these arguments",
        ),
        (
            ["nightly", "--workflow", json.dumps({"task": "tasks.demo.add"}), "--queue", "q"],
            "leave the schedule's options and queue out",
        ),
    ],
    ids=["neither", "both", "not-json", "unknown-step", "arguments", "queue"],
)
def test_a_workflow_that_cannot_run_is_refused_in_one_line_with_nothing_written(
    app: Celery, store: Store, arguments: list[str], message: str
) -> None:
    before = table_rows(store)
    refused = invoke(app, "add", *arguments, "--every", "60")
    assert refused.exit_code == 2
    [line] = error_lines(refused)
    assert message in line
    assert table_rows(store) == before


def test_runs_with_steps_shows_the_canvas_as_a_tree_with_each_steps_state(
    app: Celery, store: Store, test_env: SessionEnv
) -> None:
    invoke(app, "add", "nightly", "--workflow", canvas(app), "--every", "3600")
    triggered = as_json(invoke(app, "trigger", "nightly", "--json"))
    run_id = uuid.UUID(triggered["id"])
    first = str(uuid.uuid4())
    steps = RunStore.connect(test_env.database_url)
    try:
        steps.record_step(
            StepMessage(
                task_id=first,
                workflow_run_id=run_id,
                step="0",
                task="tasks.demo.add",
                args=[1, 2],
                kwargs={},
            )
        )
    finally:
        steps.engine.dispose()
    # Marked published, as the leader does once it sent the first steps: a workflow run
    # leaves ``pending`` only then (migration 0023).
    assert store.mark_published([run_id]) == 1
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE beat_runs SET state = 'running', worker = 'w1@host' WHERE id = :id"),
            {"id": first},
        )

    shown = invoke(app, "runs", "nightly", "--steps")
    document = as_json(invoke(app, "runs", "nightly", "--steps", "--json"))

    assert shown.exit_code == 0, shown.stderr
    lines = shown.stdout.splitlines()
    heading = next(index for index, line in enumerate(lines) if line.startswith(f"run {run_id}"))
    assert lines[heading - 1] == "", "the tree is apart from the runs above it"
    tree = shown.stdout.split(f"run {run_id} (running): ")[1].splitlines()
    assert (
        tree[0]
        == "chain(tasks.demo.add | chord([tasks.demo.add, tasks.demo.add], tasks.demo.report))"
    )
    cells = [line.split() for line in tree[2:]]
    assert cells[0] == ["chain"]
    assert cells[1][:4] == ["0", "tasks.demo.add", "running", "w1@host"]
    assert cells[2] == ["chord", "1"]
    assert cells[3] == ["header", "1.h"]
    assert cells[4][:3] == ["1.h.0", "tasks.demo.add", "waiting"]
    assert cells[6][:3] == ["1.b", "tasks.demo.report", "waiting"]
    [run] = document
    assert [(step["path"], step["state"]) for step in run["steps"]] == [
        ("0", "running"),
        ("1.h.0", "waiting"),
        ("1.h.1", "waiting"),
        ("1.b", "waiting"),
    ]
    assert run["steps"][0]["task_id"] == first
