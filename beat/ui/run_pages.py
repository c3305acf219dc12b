"""A run's page: what its row recorded (times, worker, attempts, error), and for a
workflow run its canvas as a tree with each step's state, worker, attempts, times and
error (``beat.ops.workflow_rendering``); a step's own page is a run page too, linked
back to its workflow. Reached from the run table of a schedule's page."""

from __future__ import annotations

import uuid
from typing import Any

import tornado.web

from beat.ops.workflow_rendering import is_workflow, step_lines, workflow_label
from beat.ui.base_handler import BaseHandler, UIContext


class RunPage(BaseHandler):
    async def get(self, given: str) -> None:
        try:
            run_id = uuid.UUID(given)
        except ValueError:
            raise tornado.web.HTTPError(404, "no run %r: a run ID is a UUID", given) from None
        run = await self.call(self.schedules.run, run_id)
        if run is None:
            raise tornado.web.HTTPError(404, "no run %s (retention may have removed it)", run_id)
        steps = await self.call(self.schedules.steps, run_id) if is_workflow(run) else []
        await self.render_page(
            "run.html",
            run=run,
            workflow=workflow_label(run) if is_workflow(run) else None,
            lines=step_lines(run, steps) if is_workflow(run) else [],
            section="schedules",
        )


def run_url(run_id: uuid.UUID | str) -> str:
    return f"/runs/{run_id}"


def routes(context: UIContext) -> list[tuple[str, type[tornado.web.RequestHandler], Any]]:
    return [(r"/runs/([^/]+)", RunPage, {"context": context})]
