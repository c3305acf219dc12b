"""Workflows defined in code: a ``beat_schedule`` entry with a ``workflow`` key, and
``@periodic`` on a plain function that returns the canvas. Each is stored as the API
stores a workflow, and a mistake is one line naming the entry."""

from __future__ import annotations

import pytest
from celery import Celery, chain, group

from beat.errors import ConfigError
from beat.schedule import code
from beat.schedule.code import collect, definition_hash, periodic, task_warnings
from beat.schedule.workflow import WORKFLOW_TASK, canvas_of


@pytest.fixture
def app() -> Celery:
    app = Celery("code-workflows", set_as_current=False)

    @app.task(name="etl.extract", shared=False)
    def extract() -> list[int]:
        return [1]

    @app.task(name="etl.load", shared=False)
    def load(rows: list[int], table: str) -> None: ...

    return app


@pytest.fixture(autouse=True)
def no_workflow_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(code, "_WORKFLOW_FUNCTIONS", [])


def etl(app: Celery) -> chain:
    return chain(app.signature("etl.extract"), app.signature("etl.load", args=["facts"]))


def test_a_beat_schedule_entry_with_a_workflow_fires_that_canvas(app: Celery) -> None:
    app.conf.beat_schedule = {"nightly": {"workflow": etl(app), "schedule": 3600.0}}
    [(definition, digest)] = collect(app, default_tz="UTC")
    assert definition.task == WORKFLOW_TASK
    assert [step["task"] for step in canvas_of(definition.kwargs)["kwargs"]["tasks"]] == [
        "etl.extract",
        "etl.load",
    ]
    assert definition.kwargs["ends"] == ["1"]
    assert digest == definition_hash(definition)
    assert task_warnings(app, [(definition, digest)]) == []


def test_periodic_on_a_function_that_returns_a_canvas_schedules_it(app: Celery) -> None:
    @periodic(cron="0 2 * * *", tz="Europe/Berlin")
    def nightly_etl() -> chain:
        return etl(app)

    [(definition, _)] = collect(app, default_tz="UTC")
    assert definition.name.endswith("nightly_etl")
    assert definition.task == WORKFLOW_TASK
    assert definition.timezone == "Europe/Berlin"
    assert canvas_of(definition.kwargs)["subtask_type"] == "chain"


def test_periodic_on_a_workflow_function_takes_a_name(app: Celery) -> None:
    @periodic(every=60, name="fan-out")
    @periodic(every=3600, name="fan-out-hourly")
    def fan_out() -> group:
        return group(app.signature("etl.extract") for _ in range(3))

    names = sorted(definition.name for definition, _ in collect(app, default_tz="UTC"))
    assert names == ["fan-out", "fan-out-hourly"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"schedule": 60.0}, "needs 'schedule' and one of 'task' or 'workflow'"),
        (
            {"task": "etl.extract", "workflow": {"task": "etl.extract"}, "schedule": 60.0},
            "one of 'task' or 'workflow'",
        ),
        (
            {"workflow": {"task": "celery.chain", "subtask_type": "chain"}, "schedule": 60.0},
            "tasks",
        ),
        (
            {"workflow": {"task": "etl.extract"}, "args": [1], "schedule": 60.0},
            "carry their own arguments",
        ),
    ],
    ids=["neither", "both", "chain-without-tasks", "args-beside"],
)
def test_a_workflow_entry_that_cannot_run_is_refused_naming_it(
    app: Celery, entry: dict[str, object], message: str
) -> None:
    app.conf.beat_schedule = {"broken": entry}
    with pytest.raises(ConfigError, match=message) as refused:
        collect(app, default_tz="UTC")
    assert "beat_schedule['broken']" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_workflow_function_that_raises_is_refused_naming_it(app: Celery) -> None:
    @periodic(every=60)
    def broken() -> chain:
        raise RuntimeError("no canvas today")

    with pytest.raises(ConfigError, match=r"@periodic on .*broken: building its workflow raised"):
        collect(app, default_tz="UTC")


def test_a_workflow_whose_step_the_app_does_not_know_is_warned(app: Celery) -> None:
    canvas = chain(app.signature("etl.extract"), app.signature("etl.missing"))
    app.conf.beat_schedule = {"partly": {"workflow": canvas, "schedule": 60.0}}
    found = collect(app, default_tz="UTC")
    [warning] = task_warnings(app, found)
    assert "step 1 names 'etl.missing'" in warning


def test_a_workflow_step_whose_arguments_do_not_fit_is_warned(app: Celery) -> None:
    canvas = chain(app.signature("etl.extract"), app.signature("etl.load"))  # no table
    app.conf.beat_schedule = {"misfit": {"workflow": canvas, "schedule": 60.0}}
    [warning] = task_warnings(app, collect(app, default_tz="UTC"))
    assert "step 1: task etl.load" in warning
    assert "with the result of the step before it" in warning
