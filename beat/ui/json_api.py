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
from beat.ui import openapi, problems
from beat.ui.base_handler import BaseHandler, UIContext
from beat.ui.openapi import Operation, Query, documented
from beat.ui.pages import INCIDENTS_LIMIT, WINDOWS, include_resolved, schedule_filter

OFFSET = {"type": "integer", "minimum": 0, "maximum": 10**9}
LIMIT_500 = {"type": "integer", "minimum": 1, "maximum": 500}
BAD_QUERY = ("a query parameter is refused", openapi.PROBLEM)
NOT_FOUND = ("no such schedule or run", openapi.PROBLEM)


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
    @documented(
        Operation(
            summary="List schedules, 50 a page, by name",
            query=[
                Query(name="q", schema={"type": "string"}, description="in the name or task"),
                Query(name="paused", schema={"enum": ["yes", "no"]}, description="paused or not"),
                Query(name="failing", schema={"enum": ["yes"]}, description="newest run failed"),
                Query(name="origin", schema={"enum": ["code", "api"]}, description="where made"),
                Query(name="offset", schema=OFFSET, description="rows to skip"),
                Query(name="limit", schema=LIMIT_500, description="rows at most"),
            ],
            answers={200: ("a page of schedules", openapi.SCHEDULE_PAGE), 400: BAD_QUERY},
        )
    )
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
    @documented(
        Operation(
            summary="A schedule, its next 10 fire times and its last runs; its version as ETag",
            path=["name"],
            answers={200: ("the schedule", openapi.SCHEDULE), 404: NOT_FOUND},
        )
    )
    async def get(self, name: str) -> None:
        details = await self.call(self.schedules.details, name, upcoming=10)
        if isinstance(details.schedule, Schedule):
            self.set_header("ETag", f'"{details.schedule.tag}"')
        self.send(rendering.details_document(details))


class RunsAPI(JSONHandler):
    @documented(
        Operation(
            summary="A schedule's runs, newest first",
            path=["name"],
            query=[
                Query(name="before", schema={"type": "string"}, description="next_before"),
                Query(name="limit", schema=LIMIT_500, description="runs at most"),
            ],
            answers={200: ("a page of runs", openapi.RUN_PAGE), 400: BAD_QUERY, 404: NOT_FOUND},
        )
    )
    async def get(self, name: str) -> None:
        limit = self.bounded_int("limit", 50, 1, 500)
        found = await self.call(
            self.schedules.run_page, name, before=self.get_argument("before", None), limit=limit
        )
        self.send({"runs": rendering.runs_document(found.runs), "next_before": found.next_before})


class RunAPI(JSONHandler):
    @documented(
        Operation(
            summary="One run",
            path=["run_id"],
            answers={200: ("the run", openapi.RUN), 400: BAD_QUERY, 404: NOT_FOUND},
        )
    )
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

    @documented(
        Operation(
            summary="The audit log, newest first: of one schedule (a removed one's too), or all",
            path=["name"],
            query=[
                Query(
                    name="limit",
                    schema={"type": "integer", "minimum": 1, "maximum": MAX_CHANGES},
                    description="changes at most",
                )
            ],
            answers={200: ("changes", openapi.CHANGES), 400: BAD_QUERY},
        )
    )
    async def get(self, name: str | None = None) -> None:
        limit = self.bounded_int("limit", 100, 1, MAX_CHANGES)
        found = await self.call(self.schedules.audit, name, limit=limit)
        self.send({"changes": [change_document(change) for change in found]})


class ClusterAPI(JSONHandler):
    @documented(
        Operation(
            summary="The leader, its lease, beats, workers, overdue schedules and health",
            answers={200: ("the cluster", openapi.ANY_OBJECT)},
        )
    )
    async def get(self) -> None:
        overview = await self.call(self.schedules.cluster_overview)
        health = await self.call(self.schedules.health)
        self.send(
            rendering.cluster_document(overview) | {"health": rendering.health_document(health)}
        )


class StatsAPI(JSONHandler):
    @documented(
        Operation(
            summary="Runs by state and lateness percentiles, per bucket",
            query=[
                Query(name="window", schema={"enum": list(WINDOWS)}, description="how far back"),
                Query(name="schedule", schema={"type": "string"}, description="one schedule"),
            ],
            answers={200: ("statistics", openapi.ANY_OBJECT), 400: BAD_QUERY, 404: NOT_FOUND},
        )
    )
    async def get(self) -> None:
        window = self.get_argument("window", "1h")
        if window not in WINDOWS:
            raise tornado.web.HTTPError(400, f"window must be one of {', '.join(WINDOWS)}")
        schedule = self.get_argument("schedule", "").strip() or None
        stats = await self.call(self.schedules.run_stats, WINDOWS[window], schedule=schedule)
        self.send(stats_document(stats))


class IncidentsAPI(JSONHandler):
    @documented(
        Operation(
            summary="The open incidents, newest first (all=1: resolved ones too)",
            query=[
                Query(name="all", schema={"enum": ["1"]}, description="resolved ones too"),
                Query(name="schedule", schema={"type": "string"}, description="one schedule's"),
                Query(name="limit", schema=LIMIT_500, description="incidents at most"),
            ],
            answers={200: ("incidents", openapi.INCIDENTS), 400: BAD_QUERY},
        )
    )
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


class NoSuchEndpoint(JSONHandler):
    """Any other path under ``/api/``: a problem document, as every answer of the API."""

    async def prepare(self) -> None:
        await super().prepare()
        if not self._finished:
            raise tornado.web.HTTPError(404, "no such endpoint: /api/openapi.json lists them")


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
        (r"/api(?:/.*)?", NoSuchEndpoint, arguments),
    ]
