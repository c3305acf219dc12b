"""The UI's pages: schedules, a schedule, its form, the cluster and the plots; and the
actions (pause, resume, trigger, delete).

Each handler reads its parameters, calls :class:`beat.ops.schedules.Schedules` (off the event
loop: the facade's calls block) and renders a template. Every request passes the
basic-auth check first, from its headers, before any of its body is read; every write
also the read-only check, the origin check and its form's signed token
(``beat.ui.security``). A write that fails changes nothing and says why next to the
field.
"""

from __future__ import annotations

import functools
import json
import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import quote, urlencode

import tornado.httputil
import tornado.web
from sqlalchemy.exc import SQLAlchemyError

from beat.errors import (
    HABeatError,
    InvalidSchedule,
    ScheduleExists,
    ScheduleNotFound,
    StoreError,
)
from beat.models import FINISHED_STATES, MisfirePolicy, Origin, OverlapPolicy, RunState, Schedule
from beat.ops import rendering
from beat.ops.schedules import ScheduleFilter, Schedules, UnreadableSchedule, preview
from beat.schedule import timing
from beat.store.leader import UnrecordedConsumer
from beat.store.tables import ALL_QUEUES
from beat.ui import charts, forms, wording
from beat.ui.security import (
    FORM_BODY_LIMIT,
    REALM,
    SAFE_METHODS,
    FormTokens,
    authorised,
    foreign_origin,
    is_local_host_header,
)

T = TypeVar("T")
Handler = TypeVar("Handler", bound="BaseHandler")
P = ParamSpec("P")

#: Schedules a page of the list shows.
PAGE_SIZE = 50
#: Runs a page of a schedule's history shows.
RUNS_PAGE_SIZE = 50
#: Fire times a schedule's page lists.
UPCOMING = 10
#: The windows the plots offer, by the name in the URL.
WINDOWS = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
#: Errors that mean "what was asked is wrong" (shown, status 400), not "it broke".
INPUT_ERRORS = (InvalidSchedule, ScheduleExists)
#: No script, nothing from elsewhere: the pages need neither.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:;"
    " form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
#: Messages shown after an action, by the ``done`` parameter of the redirect.
DONE = {
    "paused": "Paused: it fires no more until resumed.",
    "resumed": "Resumed: it fires again from its next fire time.",
    "triggered": "Triggered: the leader publishes the run at once.",
    "created": "Created.",
    "saved": "Saved.",
    "deleted": "Deleted.",
}


@dataclass(frozen=True, kw_only=True)
class UIContext:
    """What every handler shares."""

    schedules: Schedules
    settings: Any  # beat.ui.server.UISettings (not imported: server imports this module)
    task_names: Callable[[], list[str]]
    stylesheet: str


def signed_form(
    method: Callable[Concatenate[Handler, P], Awaitable[None]],
) -> Callable[Concatenate[Handler, P], Awaitable[None]]:
    """Marks a write that reads a form: its body is parsed and its token checked first.
    ``BaseHandler`` refuses any write not so marked."""

    @functools.wraps(method)
    async def checked(handler: Handler, /, *args: P.args, **kwargs: P.kwargs) -> None:
        handler.read_form()
        await method(handler, *args, **kwargs)

    checked.signed_form = True  # type: ignore[attr-defined]
    return checked


@tornado.web.stream_request_body  # prepare() runs on the headers, before the body
class BaseHandler(tornado.web.RequestHandler):
    """Basic auth, origin and token checks, the body cap, security headers, blocking
    calls off the loop, and error pages."""

    context: UIContext
    #: Who the credentials prove ("" when the UI has no password).
    user: str = ""

    def initialize(self, context: UIContext) -> None:
        self.context = context
        self._body = bytearray()

    @property
    def schedules(self) -> Schedules:
        return self.context.schedules

    def set_default_headers(self) -> None:
        self.set_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("X-Frame-Options", "DENY")
        self.set_header("Referrer-Policy", "same-origin")
        self.set_header("Cache-Control", "no-store")

    def prepare(self) -> None:
        users = self.context.settings.users
        if not users and not is_local_host_header(self.request.headers.get("Host")):
            self.send_error(403, reason="not a loopback host")  # see is_local_host_header
            return
        user = authorised(self.request.headers.get("Authorization"), users) if users else ""
        if user is None:
            self.send_error(401)  # write_error asks for the password
            return
        self.user = user
        writes = self.request.method not in SAFE_METHODS
        if writes and self.context.settings.read_only:
            self.send_error(403, reason="read-only")
            return
        self.check_request(writes=writes)

    def check_request(self, *, writes: bool) -> None:
        """What the headers and the path alone refuse, before any body is read."""
        if writes:
            refusal = foreign_origin(self.request.headers, self.request.host)
            if refusal is not None:
                raise tornado.web.HTTPError(
                    403, "%s: open the UI's own page and submit it there", refusal
                )
            if self.writes_unchecked():
                raise tornado.web.HTTPError(405)
        length = self.request.headers.get("Content-Length", "0")
        if not (length.isascii() and length.isdigit()) or int(length) > FORM_BODY_LIMIT:
            raise tornado.web.HTTPError(
                413, "a request's body is at most %d KiB", FORM_BODY_LIMIT // 1024
            )
        if any("\x00" in part for part in self.path_args):
            # PostgreSQL holds no NUL: no schedule or run is named with one
            raise tornado.web.HTTPError(404, "no such page: a path with a NUL byte names nothing")

    def writes_unchecked(self) -> bool:
        """Whether this write would reach a method that does not check its form's token
        (not marked ``signed_form``): refused, so a new write cannot forget it."""
        name = self.request.method.lower() if self.request.method else ""
        own = getattr(type(self), name, None)
        inherited = getattr(tornado.web.RequestHandler, name, None)  # Tornado's 405
        return own is not inherited and not getattr(own, "signed_form", False)

    def data_received(self, chunk: bytes) -> None:
        # the server reads at most FORM_BODY_LIMIT; only a write keeps what it reads
        if self.request.method not in SAFE_METHODS:
            self._body.extend(chunk)

    def read_form(self) -> None:
        """The body as the form's arguments, once its token proves the form was the
        server's own, handed to this user: 403 otherwise."""
        self.request.body = bytes(self._body)
        try:
            tornado.httputil.parse_body_arguments(
                self.request.headers.get("Content-Type", ""),
                self.request.body,
                self.request.body_arguments,
                self.request.files,
                self.request.headers,
            )
        except tornado.httputil.HTTPInputError as exc:
            raise tornado.web.HTTPError(400, "the body is not a form: %s", exc) from None
        for name, values in self.request.body_arguments.items():
            self.request.arguments.setdefault(name, []).extend(values)
        if not self.tokens.valid(self.get_body_argument("_xsrf", ""), self.user):
            raise tornado.web.HTTPError(
                403,
                "the form's token is missing, expired or another user's:"
                " reload the page and submit it again",
            )

    @property
    def tokens(self) -> FormTokens:
        return FormTokens(self.context.settings.secret)

    @property
    def xsrf_token(self) -> bytes:
        """The token the forms carry (``xsrf_form_html`` puts it in ``_xsrf``)."""
        return self.tokens.issue(self.user).encode()

    async def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``function`` in a thread (``call_for_form``), an input error (a search too
        long) a 400 with its message."""
        try:
            return await self.call_for_form(function, *args, **kwargs)
        except INPUT_ERRORS as exc:
            raise tornado.web.HTTPError(400, "%s", exc) from None

    async def call_for_form(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``function`` in a thread: a slow query must not stall the other requests.

        The facade's errors become HTTP statuses here, the one place it is called: an
        unknown schedule 404, PostgreSQL unreachable 503, any other failure 500, each
        with its message. Input errors (``INPUT_ERRORS``) are left to the caller, which
        shows them beside the field they are about."""
        loop = tornado.ioloop.IOLoop.current()
        try:
            return await loop.run_in_executor(None, functools.partial(function, *args, **kwargs))
        except INPUT_ERRORS:
            raise
        except ScheduleNotFound as exc:
            raise tornado.web.HTTPError(404, "%s", exc) from exc
        except StoreError as exc:
            raise tornado.web.HTTPError(503, "%s", exc) from exc
        except HABeatError as exc:
            raise tornado.web.HTTPError(500, "%s", exc) from exc

    def get_template_namespace(self) -> dict[str, Any]:
        namespace = super().get_template_namespace()
        namespace.update(
            stylesheet=self.context.stylesheet,
            read_only=self.context.settings.read_only,
            flower_url=self.context.settings.flower_link,
            time_text=_time_text,
            seconds_text=charts.seconds_text,
            schedule_url=schedule_url,
            in_words=wording.in_words,
            spec_text=rendering.spec_text,
            enabled_text=rendering.enabled_text,
            state_colours=charts.STATE_COLOURS,
            done=DONE.get(self.get_argument("done", "")),
            new_run_id=lambda: str(uuid.uuid4()),
            section="",
        )
        return namespace

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message = self.error_message(kwargs.get("exc_info"))
        if self.challenge(status_code):
            message = "This page needs a user name and password (--basic-auth)."
        self.render("error.html", status=status_code, message=message)

    def error_message(self, exc_info: Any) -> str:
        """What to tell the user of an error: an HTTPError's message (``call`` made the
        facade's errors into those), else only the status's reason."""
        exc = None if exc_info is None else exc_info[1]
        if isinstance(exc, tornado.web.HTTPError) and exc.log_message:
            return exc.log_message % exc.args if exc.args else exc.log_message
        return self._reason

    def challenge(self, status_code: int) -> bool:
        """Ask for the password on a 401 (set in ``write_error``: ``send_error`` clears
        the headers set before it)."""
        if status_code != 401:
            return False
        self.set_header("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')
        return True


def schedule_url(name: str, *parts: str) -> str:
    """The page of schedule ``name`` (a name may hold ``/``, so it is escaped)."""
    return "/".join(["/schedules", quote(name, safe=""), *parts])


def _time_text(moment: datetime | None, zone: Any = None) -> str:
    if moment is None:
        return "-"
    if zone is None:
        return f"{rendering.time_text(moment)} UTC"
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")


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

        self.render(
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
        self.render(
            "schedule.html",
            details=details,
            schedule=details.schedule,
            history=history,
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

    def prepare(self) -> None:
        super().prepare()
        if not self._finished and self.context.settings.read_only:
            self.send_error(403, reason="read-only")

    def render_form(self, form: forms.ScheduleForm, *, editing: str | None, status: int) -> None:
        self.set_status(status)
        self.render(
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
            self.render_form(form, editing=editing, status=400)
            return
        self.redirect(f"{schedule_url(name)}?done={done}", status=303)


class NewSchedulePage(FormPage):
    async def get(self) -> None:
        defaults = {"default_tz": self.schedules.default_tz, **self.schedules.defaults}
        self.render_form(forms.blank_form(defaults), editing=None, status=200)

    @signed_form
    async def post(self) -> None:
        form = forms.submitted(_form_arguments(self))
        fields = forms.creation_arguments(form, self.schedules.default_tz)
        name, task = form.values["name"], form.values["task"]
        write = functools.partial(self.schedules.create, name, task, **fields)
        await self.save(form, write, name=name, editing=None, done="created")


class EditSchedulePage(FormPage):
    async def get(self, name: str) -> None:
        current = await self.current(name)
        self.render_form(forms.form_of(current), editing=name, status=200)

    @signed_form
    async def post(self, name: str) -> None:
        current = await self.current(name)
        form = forms.submitted(_form_arguments(self))
        form.values["name"] = name
        changes = forms.update_arguments(form, current)
        write = functools.partial(self.schedules.update, name, **changes) if changes else None
        await self.save(form, write, name=name, editing=name, done="saved")

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

    @signed_form
    async def post(self, name: str, action: str) -> None:
        if action not in self.ACTIONS:
            raise tornado.web.HTTPError(404)
        operation: dict[str, Callable[[str], object]] = {
            "pause": self.schedules.pause,
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
        self.render(
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
        self.render(
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


class NotFoundHandler(BaseHandler):
    def prepare(self) -> None:
        super().prepare()
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
    ]
