"""A run of the idempotent base whose lease was lost while it ran records no outcome:
the leader's reaper sends it again (the README: "the completion is refused")."""

from __future__ import annotations

import contextlib
import uuid

import pytest

from app.factory import create_app
from beat import IdempotentTask
from beat.models import RunState
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("ending", ["check_lease", "raises", "returns"])
def test_a_run_whose_lease_was_lost_records_no_outcome(
    test_env: SessionEnv, store: Store, ending: str
) -> None:
    """Chaos seed 20261207: PostgreSQL was down long enough for a long job's lease to
    expire; the job's ``check_lease()`` raised ``LeaseLost`` and the base recorded the
    run ``failed`` with it, as if the job had failed: the run was never sent again."""
    app = create_app(test_env.settings())

    @app.task(bind=True, base=IdempotentTask, shared=False)
    def job(self: IdempotentTask) -> str:
        self.request.habeat_execution.lose("its lease expired while PostgreSQL was unreachable")
        if ending == "check_lease":
            self.check_lease()
        if ending == "raises":
            raise RuntimeError("the job's own error, after the lease was lost")
        return "done"

    task = app.tasks[job.name]
    task.push_request(id=str(uuid.uuid4()), called_directly=False, hostname="w", retries=0)
    try:
        with contextlib.suppress(Exception):  # Celery's trace would record the error
            task()
    finally:
        task.pop_request()
    [run] = run_rows(store)
    assert run.state == RunState.RUNNING.value, (run.state, run.error)
