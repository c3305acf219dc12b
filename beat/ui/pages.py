"""The UI's pages: schedules, a schedule, its form, the cluster, the plots and the
incidents; and the actions (pause, resume, trigger, delete).

Each handler reads its parameters, calls :class:`beat.ops.schedules.Schedules` (off the event
loop: the facade's calls block) and renders a template. Every request passes the
basic-auth check first, from its headers, before any of its body is read; every write
also the read-only check, the origin check and its form's signed token (the
handlers' base, ``beat.ui.base_handler``, with ``beat.ui.security``). A write that
fails changes nothing and says why next to the field.
"""

from __future__ import annotations

import functools
import json
import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import tornado.web
from sqlalchemy.exc import SQLAlchemyError

from beat.errors import HABeatError, InvalidSchedule, VersionConflict
from beat.models import (
    FINISHED_STATES,
    MisfirePolicy,
    Origin,
    OverlapPolicy,
    Role,
    RunState,
    Schedule,
)
from beat.ops.incident_rendering import channel_state_text, shown_target
from beat.ops.schedules import ScheduleFilter, Schedules, UnreadableSchedule, preview
from beat.schedule import timing
from beat.store.leader import UnrecordedConsumer
from beat.store.tables import ALL_QUEUES
from beat.ui import charts, forms
from beat.ui.base_handler import INPUT_ERRORS, BaseHandler, UIContext, schedule_url, signed_form

#: Schedules a page of the list shows.
PAGE_SIZE = 50
#: Runs a page of a schedule's history shows.
RUNS_PAGE_SIZE = 50
#: Fire times a schedule's page lists.
UPCOMING = 10
#: Incidents the incidents page lists, newest first (``schedules incidents``' default).
INCIDENTS_LIMIT = 100
#: The windows the plots offer, by the name in the URL.
WINDOWS = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}


# -- schedules ----------------------------------------------------------------------


def schedule_filter(handler: tornado.web.RequestHandler) -> ScheduleFilter:
    """The list's filter from the query: ``q``, ``paused`` (yes/no), ``failing``, ``origin``."""
    paused = {"yes": True, "no": False}.get(handler.get_argument("paused", ""))
    origin_text = handler.get_argument("origin", "")
    origin = Origin(origin_text) if origin_text in {o.value for o in Origin} else None
    return ScheduleFilter(
        search=handler.get_argument("q", "").strip() or None,
        paused=paused,
        failing=handler.get_argument("failing", "") == "yes",
        origin=origin,
    )


def page_number(handler: tornado.web.RequestHandler) -> int:
    try:
        return max(int(handler.get_argument("page", "1")), 1)
    except ValueError:
        return 1


class SchedulesPage(BaseHandler):
    async def get(self) -> None:
        chosen = schedule_filter(self)
        number = page_number(self)
        found = await self.call(
            self.schedules.page, chosen, offset=(number - 1) * PAGE_SIZE, limit=PAGE_SIZE
        )
        pages_count = max(math.ceil(found.total / PAGE_SIZE), 1)
        query = {
            key: self.get_argument(key, "")
            for key in ("q", "paused", "failing", "origin")
            if self.get_argument(key, "")
        }

        def page_link(target: int) -> str:
            return "/?" + urlencode(query | {"page": str(target)})

        await self.render_page(
            "schedules.html",
            section="schedules",
            found=found,
            chosen=chosen,
            query=query,
            number=number,
            pages_count=pages_count,
            page_link=page_link,
            sparkline=charts.sparkline,
            origins=[origin.value for origin in Origin],
        )


class SchedulePage(BaseHandler):
    async def get(self, name: str) -> None:
        details = await self.call(self.schedules.details, name, upcoming=UPCOMING, recent=0)
        before = self.get_argument("before", None)
        history = await self.call(
            self.schedules.run_page, name, before=before, limit=RUNS_PAGE_SIZE
        )
        incidents = await self.call(self.schedules.incidents, schedule=name)
        await self.render_page(
            "schedule.html",
            details=details,
            schedule=details.schedule,
            history=history,
            incidents=incidents,
            first_page=before is None,
            shown_json=shown_json,
            **_definition_parts(details.schedule),
        )


def _definition_parts(schedule: Schedule | UnreadableSchedule) -> dict[str, Any]:
    """What the schedule's page shows of its definition: none (its row cannot be read:
    its problem and stored values instead), or the definition and its zone."""
    if isinstance(schedule, UnreadableSchedule):
        return {
            "definition": None,
            "zone": None,
            "enabled": schedule.enabled,
            "origin": schedule.origin,
        }
    definition = schedule.definition
    return {
        "definition": definition,
        "zone": timing.parse_zone(definition.timezone),
        "enabled": definition.enabled,
        "origin": definition.origin,
    }


def shown_json(value: object) -> str:
    """``value`` as JSON, cut where it is long: a page shows a glimpse of 64 KiB of
    args, not all of it."""
    return preview(json.dumps(value))


# -- the form -----------------------------------------------------------------------


class FormPage(BaseHandler):
    """Shared by the new-schedule and edit pages (none in read-only mode)."""

    async def prepare(self) -> None:
        await super().prepare()
        if self._finished:
            return
        if self.context.settings.read_only:
            self.send_error(403, reason="read-only")
            return
        self.require(Role.ADMIN)

    async def render_form(
        self, form: forms.ScheduleForm, *, editing: str | None, status: int
    ) -> None:
        self.set_status(status)
        await self.render_page(
            "form.html",
            section="" if editing else "new",
            form=form,
            editing=editing,
            task_names=self.context.task_names(),
            kinds=forms.KINDS,
            misfire_policies=[policy.value for policy in MisfirePolicy],
            overlap_policies=[policy.value for policy in OverlapPolicy],
        )

    async def save(
        self,
        form: forms.ScheduleForm,
        write: Callable[[], object] | None,
        *,
        name: str,
        editing: str | None,
        done: str,
    ) -> None:
        """``write`` the form if it was read without error (None: nothing to write),
        then go to the schedule's page; or show the form again with what was wrong."""
        if form.ok and write is not None:
            try:
                await self.call_for_form(write)
            except INPUT_ERRORS as exc:
                form.fail(str(exc))
        if not form.ok:
            await self.render_form(form, editing=editing, status=400)
            return
        self.redirect(f"{schedule_url(name)}?done={done}", status=303)


class NewSchedulePage(FormPage):
    async def get(self) -> None:
        defaults = {"default_tz": self.schedules.default_tz, **self.schedules.defaults}
        await self.render_form(forms.blank_form(defaults), editing=None, status=200)

    @signed_form(Role.ADMIN)
    async def post(self) -> None:
        form = forms.submitted(_form_arguments(self))
        fields = forms.creation_arguments(form, self.schedules.default_tz)
        name, task = form.values["name"], form.values["task"]
        write = functools.partial(self.schedules.create, name, task, **fields)
        await self.save(form, write, name=name, editing=None, done="created")


class EditSchedulePage(FormPage):
    async def get(self, name: str) -> None:
        current = await self.current(name)
        await self.render_form(forms.form_of(current), editing=name, status=200)

    @signed_form(Role.ADMIN)
    async def post(self, name: str) -> None:
        current = await self.current(name)
        form = forms.submitted(_form_arguments(self))
        form.values["name"] = name
        # The version the form was opened on: a save over another person's is refused.
        form.version = self.get_body_argument("version", "") or current.tag
        changes = forms.update_arguments(form, current)
        write = (
            functools.partial(self.schedules.update, name, if_version=form.version, **changes)
            if changes
            else None
        )
        try:
            await self.save(form, write, name=name, editing=name, done="saved")
        except VersionConflict as conflict:
            await self.refuse_stale(form, name, conflict)

    async def refuse_stale(
        self, form: forms.ScheduleForm, name: str, conflict: VersionConflict
    ) -> None:
        """Show the form again as typed, with what changed since it was opened; a save
        from here is over the version now, as the person has seen what changed."""
        seen = conflict.expected.rpartition(".")[2]
        since = int(seen) if seen.isascii() and seen.isdigit() else 0
        changes = await self.call(self.schedules.audit, name, limit=50)
        form.changed_since = [change for change in changes if change.version > since]
        form.version = conflict.current
        form.errors[""] = (
            "someone changed this schedule since you opened it; what they changed is"
            " listed below. Your entries are kept: check them against it, and save again"
        )
        await self.render_form(form, editing=name, status=409)

    async def current(self, name: str) -> Schedule:
        """Schedule ``name`` to edit; 400 if its row cannot be read (the form cannot
        show what it holds: the error says to fix the row or remove it)."""
        try:
            return await self.call(self.schedules.get, name)
        except InvalidSchedule as exc:
            raise tornado.web.HTTPError(400, "%s", exc) from None


def _form_arguments(handler: tornado.web.RequestHandler) -> dict[str, str]:
    return {name: handler.get_body_argument(name, "", strip=False) for name in forms.FIELDS}


# -- actions ------------------------------------------------------------------------


class ActionHandler(BaseHandler):
    """POST /schedules/<name>/<action>: pause, resume, trigger or delete, then back to
    the schedule's page (the list, after a delete) with a message."""

    ACTIONS = {"pause": "paused", "resume": "resumed", "trigger": "triggered", "delete": "deleted"}

    @signed_form(Role.OPERATOR)
    async def post(self, name: str, action: str) -> None:
        if action not in self.ACTIONS:
            raise tornado.web.HTTPError(404)
        if action == "delete":
            self.require(Role.ADMIN)
        note = self.get_body_argument("note", "").strip() or None
        operation: dict[str, Callable[[str], object]] = {
            "pause": functools.partial(self.schedules.pause, note=note),
            "resume": self.schedules.resume,
            "trigger": functools.partial(self.schedules.trigger_run, run_id=self._trigger_id()),
            "delete": self.schedules.delete,
        }
        await self.call(operation[action], name)
        target = "/" if action == "delete" else schedule_url(name)
        self.redirect(f"{target}?done={self.ACTIONS[action]}", status=303)

    def _trigger_id(self) -> uuid.UUID | None:
        """The run ID the page chose for its trigger button: posting the form twice (a
        double click, a resent request) queues one run, not two."""
        given = self.get_body_argument("run_id", "")
        if not given:
            return None
        try:
            return uuid.UUID(given)
        except ValueError:
            raise tornado.web.HTTPError(400, "run_id is not a UUID") from None


# -- the cluster and the plots ------------------------------------------------------


class ClusterPage(BaseHandler):
    async def get(self) -> None:
        overview = await self.call(self.schedules.cluster_overview)
        health = await self.call(self.schedules.health)
        consumers = await self.call(unrecorded_consumers, self.schedules)
        await self.render_page(
            "cluster.html",
            section="cluster",
            overview=overview,
            health=health,
            consumers=consumers,
            all_queues=ALL_QUEUES,
        )


def unrecorded_consumers(schedules: Schedules) -> list[UnrecordedConsumer]:
    """The consumers of beat's queues that do not record runs, as the leader found them
    (``beat.leader.lost_messages``); none when they cannot be read (the overview names the
    database's problem)."""
    try:
        return schedules.store.unrecorded_consumers()
    except (HABeatError, SQLAlchemyError):
        return []


class PlotsPage(BaseHandler):
    async def get(self) -> None:
        window_name = self.get_argument("window", "1h")
        if window_name not in WINDOWS:
            window_name = "1h"
        schedule = self.get_argument("schedule", "", strip=False) or None  # a name, exactly
        stats = await self.call(self.schedules.run_stats, WINDOWS[window_name], schedule=schedule)
        labels = [_bucket_label(bucket.start, stats.bucket) for bucket in stats.buckets]
        percentiles = {
            name: [None if b.lateness is None else getattr(b.lateness, name) for b in stats.buckets]
            for name in ("p50", "p95", "p99", "max")
        }
        minutes = stats.bucket.total_seconds() / 60
        per_minute = [
            {state.value: count / minutes for state, count in bucket.counts.items()}
            for bucket in stats.buckets
        ]
        order = [*(s.value for s in FINISHED_STATES), *(s.value for s in RunState)]
        await self.render_page(
            "plots.html",
            section="plots",
            stats=stats,
            window_name=window_name,
            windows=list(WINDOWS),
            schedule=schedule,
            lateness_chart=charts.line_chart(
                percentiles, labels, colours=charts.PERCENTILE_COLOURS, unit="seconds late"
            ),
            runs_chart=charts.stacked_bars(
                per_minute,
                labels,
                order=list(dict.fromkeys(order)),
                colours=charts.STATE_COLOURS,
                unit="runs per minute",
            ),
        )


def _bucket_label(start: datetime, width: timedelta) -> str:
    moment = start.astimezone(UTC)
    return moment.strftime("%m-%d %H:%M" if width >= timedelta(hours=1) else "%H:%M")


# -- the incidents -------------------------------------------------------------------


def include_resolved(handler: tornado.web.RequestHandler) -> bool:
    """``?all=1``: the resolved incidents too, not only the open ones."""
    return handler.get_argument("all", "") == "1"


class IncidentsPage(BaseHandler):
    async def get(self) -> None:
        resolved_too = include_resolved(self)
        found = await self.call(
            self.schedules.incident_list, include_resolved=resolved_too, limit=INCIDENTS_LIMIT
        )
        channels = await self.call(self.schedules.channels)
        await self.render_page(
            "incidents.html",
            section="incidents",
            found=found,
            include_resolved=resolved_too,
            limit=INCIDENTS_LIMIT,
            channels=channels,
            channel_target=shown_target,
            channel_state=channel_state_text,
        )


class NotFoundHandler(BaseHandler):
    async def prepare(self) -> None:
        await super().prepare()
        if not self._finished:
            raise tornado.web.HTTPError(404, "no such page")


def routes(context: UIContext) -> list[tuple[str, type[tornado.web.RequestHandler], Any]]:
    arguments = {"context": context}
    return [
        (r"/", SchedulesPage, arguments),
        (r"/new", NewSchedulePage, arguments),
        (r"/schedules/([^/]+)", SchedulePage, arguments),
        (r"/schedules/([^/]+)/edit", EditSchedulePage, arguments),
        (r"/schedules/([^/]+)/(pause|resume|trigger|delete)", ActionHandler, arguments),
        (r"/cluster", ClusterPage, arguments),
        (r"/plots", PlotsPage, arguments),
        (r"/incidents", IncidentsPage, arguments),
    ]
