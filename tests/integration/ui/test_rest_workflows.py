"""Workflow schedules over the write API: a canvas in the body (as
``json.dumps(chain(...))`` gives it) makes a workflow schedule, a PATCH replaces its
canvas, a PUT of what a GET returned changes nothing, and a canvas that cannot run is a
problem document naming the fix, with nothing written."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery, chain, group

from beat.ops.schedules import Schedules
from beat.schedule.workflow import WORKFLOW_TASK
from beat.store.all_roles import Store
from tests.integration.helpers import table_rows
from tests.integration.ui import test_rest_api, test_ui_http
from tests.integration.ui.test_rest_api import call
from tests.integration.ui.test_ui_http import PASSWORD, UI, USER

pytestmark = pytest.mark.integration

app, serve, schedules = test_ui_http.app, test_ui_http.serve, test_ui_http.schedules
api = test_rest_api.api


def canvas(app: Celery, *labels: str) -> Any:
    steps = [app.signature("ui.job", args=[label], immutable=True) for label in labels]
    return json.loads(json.dumps(chain(steps[0], group(steps[1:]))))


def test_a_workflow_is_created_changed_and_put_back_as_it_was_read(
    api: UI, app: Celery, schedules: Schedules
) -> None:
    body = {"name": "fan-out", "workflow": canvas(app, "a", "b", "c"), "every": 600}
    created = call(api, "POST", "/api/schedules", body)
    assert created.status == 201, created.document
    assert created.document["task"] == WORKFLOW_TASK
    assert created.document["kwargs"]["ends"] == ["1.0", "1.1"]

    patched = call(
        api, "PATCH", "/api/schedules/fan-out", {"workflow": canvas(app, "a", "b", "c", "d")}
    )
    assert patched.status == 200, patched.document
    assert patched.document["kwargs"]["ends"] == ["1.0", "1.1", "1.2"]

    read = call(api, "GET", "/api/schedules/fan-out")
    put_back = {
        "task": read.document["task"],
        "kwargs": read.document["kwargs"],
        "every": 600,
    }
    again = call(api, "PUT", "/api/schedules/fan-out", put_back)
    assert again.status == 200, again.document
    assert again.document["kwargs"] == read.document["kwargs"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"workflow": {"task": "ui.nope"}}, "step 0 names 'ui.nope'"),
        ({"workflow": {"task": "ui.job"}, "task": "ui.job"}, "give a task or a workflow"),
        ({"workflow": {"task": "ui.job"}, "args": [1]}, "carry their own arguments"),
        ({"workflow": [1, 2]}, "workflow: must be"),
        ({"workflow": {"task": "celery.group", "subtask_type": "group"}}, "tasks must be"),
    ],
    ids=["unknown-step", "task-beside", "args-beside", "not-an-object", "no-tasks"],
)
def test_a_workflow_that_cannot_run_is_a_problem_with_nothing_written(
    api: UI, store: Store, body: dict[str, Any], says: str
) -> None:
    before = table_rows(store)
    refused = call(api, "POST", "/api/schedules", {"name": "bad", "every": 60} | body)
    assert refused.status in (400, 422), refused.document
    assert says in refused.document["detail"]
    assert table_rows(store) == before


def test_a_workflow_needs_no_task_but_a_schedule_needs_one_of_them(
    serve: Callable[..., UI], store: Store
) -> None:
    ui = serve(users={USER: PASSWORD})
    refused = call(ui, "POST", "/api/schedules", {"name": "neither", "every": 60})
    assert refused.status == 422
    assert refused.document["detail"].startswith("task: is required")
