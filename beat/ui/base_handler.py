"""What every page and endpoint of the UI stands on: the context they share and
``BaseHandler``, which checks each request (basic auth from its headers before any body
is read; for a write, read-only, origin and the signed token of its form, see
``beat.ui.security``), caps the body, sets the security headers, calls the facade off
the event loop and renders error pages; plus the URL of a schedule's page and the
template helpers every page uses."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import quote

import tornado.httputil
import tornado.web
from sqlalchemy.exc import SQLAlchemyError

from beat.errors import (
    HABeatError,
    InvalidSchedule,
    ScheduleExists,
    ScheduleNotFound,
    StoreError,
    VersionConflict,
)
from beat.models import ChangeEntry, Role
from beat.ops import audit_rendering, monitor_rendering, rendering
from beat.ops.schedules import Schedules, preview
from beat.ui import charts, wording
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
    "restored": "Restored: the version's fields are the schedule's again, as a new version.",
}


@dataclass(frozen=True, kw_only=True)
class UIContext:
    """What every handler shares."""

    schedules: Schedules
    settings: Any  # beat.ui.server.UISettings (not imported: server imports this module)
    task_names: Callable[[], list[str]]
    stylesheet: str


Write = Callable[Concatenate[Handler, P], Awaitable[None]]


def signed_form(role: Role) -> Callable[[Write[Handler, P]], Write[Handler, P]]:
    """Marks a write that reads a form and that ``role`` may make: the user's role is
    checked, then the body parsed and its token checked. ``BaseHandler`` refuses any
    write not marked so (or ``json_body``)."""

    def marked(method: Write[Handler, P]) -> Write[Handler, P]:
        @functools.wraps(method)
        async def checked(handler: Handler, /, *args: P.args, **kwargs: P.kwargs) -> None:
            handler.require(role)
            handler.read_form()
            await method(handler, *args, **kwargs)

        checked.checks_its_body = True  # type: ignore[attr-defined]
        return checked

    return marked


@tornado.web.stream_request_body  # prepare() runs on the headers, before the body
class BaseHandler(tornado.web.RequestHandler):
    """Basic auth, origin and token checks, the body cap, security headers, blocking
    calls off the loop, and error pages."""

    context: UIContext
    #: Who the credentials prove ("" when the UI has no password; ``token:<name>`` for
    #: an API token).
    user: str = ""
    #: What they may do (``Role.ADMIN`` when the UI has no password).
    role: Role = Role.ADMIN

    def initialize(self, context: UIContext) -> None:
        self.context = context
        self._body = bytearray()

    @property
    def schedules(self) -> Schedules:
        """The facade, acting for this request's user from its address (the audit log
        records them; without a password, the user the UI runs as)."""
        entry = ChangeEntry.API if self.request.path.startswith("/api/") else ChangeEntry.UI
        return self.context.schedules.acting_as(
            entry, actor=self.user or None, address=self.request.remote_ip
        )

    def set_default_headers(self) -> None:
        self.set_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("X-Frame-Options", "DENY")
        self.set_header("Referrer-Policy", "same-origin")
        self.set_header("Cache-Control", "no-store")

    async def prepare(self) -> None:
        if not await self.identify():
            return
        writes = self.request.method not in SAFE_METHODS
        if writes and self.context.settings.read_only:
            self.send_error(403, reason="read-only")
            return
        self.check_request(writes=writes)

    async def identify(self) -> bool:
        """Who sends the request, and their role: an API token (``Bearer``, from the
        header only, looked up on each request so that a revoked one is refused at
        once), a user of ``--basic-auth``, or anyone on a loopback name when the UI has
        no password. False (the error sent) if none of them."""
        header = self.request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            bearer = await self.call(self.context.schedules.token_bearer, header[7:].strip())
            if bearer is None:
                self.send_error(401, reason="unknown or revoked token")
                return False
            self.user, self.role = f"token:{bearer[0]}", bearer[1]
            return True
        users = self.context.settings.users
        if not users and not is_local_host_header(self.request.headers.get("Host")):
            self.send_error(403, reason="not a loopback host")  # see is_local_host_header
            return False
        user = authorised(header, users) if users else ""
        if user is None:
            self.send_error(401)  # write_error asks for the password
            return False
        self.user, self.role = user, self.context.settings.roles.get(user, Role.ADMIN)
        return True

    def may(self, role: str) -> bool:
        """Whether this user may make the writes of ``role`` here (a page shows only
        the buttons of those; the handlers refuse the others anyway)."""
        return not self.context.settings.read_only and self.role.allows(Role(role))

    def require(self, role: Role) -> None:
        """403 unless this request's role includes ``role``."""
        if not self.role.allows(role):
            raise tornado.web.HTTPError(
                403,
                "%s is a %s, and this needs a %s: ask an admin",
                self.user or "this user",
                self.role.value,
                role.value,
            )

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
        """Whether this write would reach a method that checks neither its role nor its
        body (not marked ``signed_form`` or ``json_body``): refused, so a new write
        cannot forget them."""
        name = self.request.method.lower() if self.request.method else ""
        own = getattr(type(self), name, None)
        inherited = getattr(tornado.web.RequestHandler, name, None)  # Tornado's 405
        return own is not inherited and not getattr(own, "checks_its_body", False)

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
        except (*INPUT_ERRORS, VersionConflict):
            raise  # the caller shows them beside the form
        except ScheduleNotFound as exc:
            raise tornado.web.HTTPError(404, "%s", exc) from exc
        except StoreError as exc:
            raise tornado.web.HTTPError(503, "%s", exc) from exc
        except HABeatError as exc:
            raise tornado.web.HTTPError(500, "%s", exc) from exc

    async def render_page(self, template: str, **kwargs: Any) -> None:
        """``template`` rendered, with the count of open incidents its navigation shows."""
        self.render(template, open_incident_count=await self._open_incident_count(), **kwargs)

    async def _open_incident_count(self) -> int | None:
        """None when it cannot be read: the navigation then shows no count, and the
        page itself says what of its own could not be read."""
        loop = tornado.ioloop.IOLoop.current()
        try:
            return await loop.run_in_executor(None, self.schedules.open_incident_count)
        except (HABeatError, SQLAlchemyError):
            return None

    def get_template_namespace(self) -> dict[str, Any]:
        namespace = super().get_template_namespace()
        namespace.update(
            stylesheet=self.context.stylesheet,
            read_only=self.context.settings.read_only,
            may=self.may,
            flower_url=self.context.settings.flower_link,
            time_text=_time_text,
            seconds_text=charts.seconds_text,
            schedule_url=schedule_url,
            in_words=wording.in_words,
            spec_text=rendering.spec_text,
            enabled_text=rendering.enabled_text,
            monitor_settings=monitor_rendering.monitor_settings,
            preview=preview,
            value_text=audit_rendering.value_text,
            open_incident_count=None,  # render_page reads it; an error page goes without
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
