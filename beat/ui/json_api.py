"""The UI's JSON API under ``/api/``: the documents of the CLI's ``--json``
(``beat.ops.rendering``), read-only, behind the same basic auth as the pages.

- ``GET /api/schedules?q=&paused=yes|no&failing=yes&origin=code|api&offset=&limit=``:
  ``{"total", "offset", "limit", "schedules": [schedule document + "last_run" +
  "recent_lateness_seconds"]}``
- ``GET /api/schedules/<name>``: ``schedules show --json``, with the next 10 fire times
- ``GET /api/schedules/<name>/runs?before=&limit=``: ``{"runs": [...], "next_before"}``
  (pass ``next_before`` back as ``before`` for the next, older page)
- ``GET /api/runs/<id>``: one run (``schedules runs`` document)
- ``GET /api/cluster``: the leader, lease, beat processes, workers, overdue schedules,
  queues nobody consumes, and the health checks
- ``GET /api/stats?window=1h&schedule=``: lateness percentiles and runs per bucket by state
- ``GET /api/incidents?all=1&schedule=&limit=``: ``{"incidents": [...]}``, the open ones
  newest first (``schedules incidents --json`` documents); ``all=1``: resolved ones too;
  ``schedule``: only those of the schedule of that name
- ``GET /api/schedules/<name>/changes?limit=``, ``GET /api/changes?limit=``:
  ``{"changes": [...]}``, the audit log newest first (``schedules audit --json``
  documents), of one schedule (a removed one's too) or of all
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import tornado.web

from beat.models import Schedule
from beat.ops import rendering
from beat.ops.audit_rendering import change_document
from beat.ops.incident_rendering import incident_document
from beat.store.schedule_changes import MAX_CHANGES
from beat.ui import problems
from beat.ui.base_handler import BaseHandler, UIContext
from beat.ui.pages import INCIDENTS_LIMIT, WINDOWS, include_resolved, schedule_filter


class JSONHandler(BaseHandler):
    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Content-Type", "application/json; charset=UTF-8")

    def send(self, document: Any) -> None:
        self.finish(json.dumps(document, indent=2))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """A problem document (``beat.ui.problems``)."""
        exc_info = kwargs.get("exc_info")
        exc = None if exc_info is None else exc_info[1]
        message = self.error_message(exc_info)
        self.set_header("Content-Type", problems.CONTENT_TYPE)
        self.challenge(status_code)
        field, extra = (exc.field, exc.extra) if isinstance(exc, problems.Problem) else ("", {})
        found = problems.document(status_code, self._reason, message, field=field, **extra)
        self.finish(json.dumps(found))

    def bounded_int(self, name: str, default: int, low: int, high: int) -> int:
        text = self.get_argument(name, str(default))
        try:
            value = int(text)
        except ValueError:
            raise tornado.web.HTTPError(400, f"{name} must be a whole number") from None
        if not low <= value <= high:
            raise tornado.web.HTTPError(400, f"{name} must be from {low} to {high}")
        return value


class SchedulesAPI(JSONHandler):
    async def get(self) -> None:
        offset = self.bounded_int("offset", 0, 0, 10**9)
        limit = self.bounded_int("limit", 50, 1, 500)
        found = await self.call(
            self.schedules.page, schedule_filter(self), offset=offset, limit=limit
        )
        self.send(
            {
                "total": found.total,
                "offset": found.offset,
                "limit": found.limit,
                "schedules": [
                    rendering.schedule_document(row.schedule)
                    | {
                        "last_run": rendering.last_run_document(row.last_run),
                        "recent_lateness_seconds": row.recent_lateness,
                    }
                    for row in found.rows
                ],
            }
        )


class ScheduleAPI(JSONHandler):
    async def get(self, name: str) -> None:
        details = await self.call(self.schedules.details, name, upcoming=10)
        if isinstance(details.schedule, Schedule):
            self.set_header("ETag", f'"{details.schedule.tag}"')
        self.send(rendering.details_document(details))


class RunsAPI(JSONHandler):
    async def get(self, name: str) -> None:
        limit = self.bounded_int("limit", 50, 1, 500)
        found = await self.call(
            self.schedules.run_page, name, before=self.get_argument("before", None), limit=limit
        )
        self.send({"runs": rendering.runs_document(found.runs), "next_before": found.next_before})


class RunAPI(JSONHandler):
    async def get(self, run_id: str) -> None:
        try:
            parsed = uuid.UUID(run_id)
        except ValueError:
            raise tornado.web.HTTPError(400, "a run ID is a UUID") from None
        run = await self.call(self.schedules.run, parsed)
        if run is None:
            raise tornado.web.HTTPError(404, f"no run {run_id}")
        self.send(rendering.run_document(run))


class ChangesAPI(JSONHandler):
    """Changes of the audit log, newest first: of one schedule, or of every one."""

    async def get(self, name: str | None = None) -> None:
        limit = self.bounded_int("limit", 100, 1, MAX_CHANGES)
        found = await self.call(self.schedules.audit, name, limit=limit)
        self.send({"changes": [change_document(change) for change in found]})


class ClusterAPI(JSONHandler):
    async def get(self) -> None:
        overview = await self.call(self.schedules.cluster_overview)
        health = await self.call(self.schedules.health)
        self.send(
            rendering.cluster_document(overview) | {"health": rendering.health_document(health)}
        )


class StatsAPI(JSONHandler):
    async def get(self) -> None:
        window = self.get_argument("window", "1h")
        if window not in WINDOWS:
            raise tornado.web.HTTPError(400, f"window must be one of {', '.join(WINDOWS)}")
        schedule = self.get_argument("schedule", "").strip() or None
        stats = await self.call(self.schedules.run_stats, WINDOWS[window], schedule=schedule)
        self.send(stats_document(stats))


class IncidentsAPI(JSONHandler):
    async def get(self) -> None:
        limit = self.bounded_int("limit", INCIDENTS_LIMIT, 1, 500)
        schedule = self.get_argument("schedule", "", strip=False) or None  # a name, exactly
        found = await self.call(
            self.schedules.incidents,
            include_resolved=include_resolved(self),
            limit=limit,
            schedule=schedule,
        )
        self.send({"incidents": [incident_document(incident) for incident in found]})


def stats_document(stats: Any) -> dict[str, Any]:
    """Run statistics as JSON: per bucket, the runs by state and the lateness percentiles."""

    def percentiles(found: Any) -> dict[str, float] | None:
        if found is None:
            return None
        return {name: getattr(found, name) for name in ("p50", "p95", "p99", "max")}

    return {
        "now": rendering.iso(stats.now),
        "window_seconds": stats.window.total_seconds(),
        "bucket_seconds": stats.bucket.total_seconds(),
        "lateness_seconds": percentiles(stats.lateness),
        "counts": {state.value: count for state, count in stats.total_counts.items()},
        "buckets": [
            {
                "start": rendering.iso(bucket.start),
                "counts": {state.value: count for state, count in bucket.counts.items()},
                "lateness_seconds": percentiles(bucket.lateness),
            }
            for bucket in stats.buckets
        ],
    }


def routes(context: UIContext) -> list[tuple[str, type[tornado.web.RequestHandler], Any]]:
    arguments = {"context": context}
    return [
        (r"/api/schedules/([^/]+)/runs", RunsAPI, arguments),
        (r"/api/schedules/([^/]+)/changes", ChangesAPI, arguments),
        (r"/api/changes", ChangesAPI, arguments),
        (r"/api/runs/([^/]+)", RunAPI, arguments),
        (r"/api/cluster", ClusterAPI, arguments),
        (r"/api/stats", StatsAPI, arguments),
        (r"/api/incidents", IncidentsAPI, arguments),
    ]
