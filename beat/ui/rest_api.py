"""The write API under ``/api/schedules``, beside the read API (``beat.ui.json_api``) on
the UI's server, behind the same credentials: an API token (``Authorization: Bearer``)
or a user of ``--basic-auth``, each with a role.

- ``POST /api/schedules`` (admin): create; ``Idempotency-Key`` makes a retried create
  return the schedule the first made (200) instead of a second (201)
- ``PUT /api/schedules/<name>`` (admin): every field anew (those left out go back to
  their defaults); ``PATCH`` (admin): the fields given; ``DELETE`` (admin)
- ``POST /api/schedules/<name>/pause`` (``{"note": ...}``), ``resume``, ``trigger``
  (``Idempotency-Key``: the same key, the same run), ``backfill``
  (``{"from": ..., "to": ..., "limit": ...}``) (operator); ``restore``
  (``{"version": N}``) (admin)

Every write goes through :class:`beat.ops.schedules.Schedules`, validated by ``define``
as the CLI's and the UI's are, and is recorded in the audit log as the token's (or the
user's), from the client's address. A schedule's document carries its version as an
``ETag``; a write with ``If-Match`` is refused (412) if the schedule changed since.
Errors are problem documents (``beat.ui.problems``): 400 a body that is no JSON, 404 no
such schedule, 409 a name taken or an idempotency key reused, 412 a stale version,
415 a body that is not ``application/json``, 422 a field ``define`` refuses, naming it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

import tornado.ioloop
import tornado.web

from beat.errors import HABeatError, StoreError
from beat.models import Role, Schedule
from beat.ops import rendering
from beat.ops.schedule_commands import trigger_run_id
from beat.ops.user_input import parse_time
from beat.store.schedules import check_version
from beat.ui import openapi, rest_input
from beat.ui.base_handler import UIContext, schedule_url
from beat.ui.json_api import JSONHandler, ScheduleAPI, SchedulesAPI
from beat.ui.openapi import PROBLEM, Operation, documented
from beat.ui.problems import Problem, problem_of

#: What every write may answer besides its own.
WRITE_ANSWERS = openapi.WRITE
#: And a write of one schedule, which may name a version (If-Match).
STALE_ANSWERS = {**openapi.WRITE, **openapi.PRECONDITION, 409: ("conflict", PROBLEM)}

T = TypeVar("T")
Handler = TypeVar("Handler", bound="RestHandler")
P = ParamSpec("P")
Write = Callable[Concatenate[Handler, P], Awaitable[None]]

#: The media types a write's body may have.
JSON_TYPES = ("application/json", "application/merge-patch+json")


def json_body(role: Role) -> Callable[[Write[Handler, P]], Write[Handler, P]]:
    """Marks a write of the API that ``role`` may make: the role is checked, then the
    body read as JSON (415 if it says it is not JSON: a form posted from another site
    cannot say it is without the browser asking this server first)."""

    def marked(method: Write[Handler, P]) -> Write[Handler, P]:
        @functools.wraps(method)
        async def checked(handler: Handler, /, *args: P.args, **kwargs: P.kwargs) -> None:
            handler.require(role)
            handler.read_json()
            await method(handler, *args, **kwargs)

        checked.checks_its_body = True  # type: ignore[attr-defined]
        checked.required_role = role  # type: ignore[attr-defined]
        return checked

    return marked


class RestHandler(JSONHandler):
    """A write of the API: its JSON body, its preconditions, the facade's errors as
    problem documents."""

    body: Any = None

    def read_json(self) -> None:
        """The body as a JSON object. It must say it is JSON, but for an empty body
        (a DELETE, an action without options) sent with an API token: a browser sends
        a password it keeps (basic auth) with a page of another site's form, never a
        token, and such a form cannot say it sends JSON without asking this server."""
        raw = bytes(self._body)
        media = self.request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        with_token = self.user.startswith("token:")
        if media not in JSON_TYPES and (raw or not with_token):
            raise Problem(415, "the body must be JSON: send Content-Type: application/json")
        if not raw:
            self.body = {}
            return
        try:
            self.body = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise Problem(400, f"the body is not JSON ({exc}): send a JSON object") from None
        if not isinstance(self.body, dict):
            raise Problem(400, "the body must be a JSON object")

    @property
    def if_match(self) -> str | None:
        """The version an ``If-Match`` header names (``Schedule.tag``); None without one
        or with ``*`` (any version). A weak tag never matches (RFC 9110 compares If-Match
        strongly); a list of tags is refused (one version is read, one sent back)."""
        given = self.request.headers.get("If-Match")
        if given is None or given.strip() == "*":
            return None
        if "," in given:
            raise Problem(400, "If-Match takes one ETag: the one of the version you read")
        tag = given.strip()
        if tag.startswith("W/"):
            return "weak " + tag  # matches no version: every write with it is 412
        return tag.strip('"')

    def idempotency_key(self) -> str | None:
        return self.request.headers.get("Idempotency-Key")

    async def write_call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``function`` off the loop; the facade's errors as problem documents: its
        refusals (``problems.STATUS``), PostgreSQL unreachable 503, any other 500."""
        loop = tornado.ioloop.IOLoop.current()
        try:
            return await loop.run_in_executor(None, functools.partial(function, *args, **kwargs))
        except HABeatError as exc:
            found = problem_of(exc, self.body if isinstance(self.body, dict) else None)
            if found is not None:
                raise found from None
            raise Problem(503 if isinstance(exc, StoreError) else 500, str(exc)) from exc

    def send_schedule(self, schedule: Schedule, status: int = 200) -> None:
        """The schedule's document (``schedules show --json``), its version the ETag."""
        self.set_status(status)
        self.set_header("ETag", f'"{schedule.tag}"')
        if status == 201:
            self.set_header("Location", "/api" + schedule_url(schedule.name))
        self.send(rendering.schedule_document(schedule))


class SchedulesResource(SchedulesAPI, RestHandler):
    """``GET`` lists (``SchedulesAPI``); ``POST`` creates."""

    @json_body(Role.ADMIN)
    @documented(
        Operation(
            summary="Create a schedule (Idempotency-Key: a retried create makes one)",
            body=openapi.SCHEDULE_BODY,
            headers=["Idempotency-Key"],
            answers={
                201: ("created; its version is the ETag", openapi.SCHEDULE),
                200: ("the schedule this Idempotency-Key created before", openapi.SCHEDULE),
                409: ("the name is taken, or the key was used for another request", PROBLEM),
                **WRITE_ANSWERS,
            },
        )
    )
    async def post(self) -> None:
        schedules = self.schedules
        name, task, fields = await self.write_call(
            rest_input.creation_arguments, self.body, schedules.default_tz
        )
        key = self.idempotency_key()
        if key is None:
            created = await self.write_call(schedules.create, name, task, **fields)
            self.send_schedule(created, 201)
            return
        found, made = await self.write_call(schedules.create_once, key, name, task, **fields)
        self.send_schedule(found, 201 if made else 200)


class ScheduleResource(ScheduleAPI, RestHandler):
    """``GET`` reads (``ScheduleAPI``, with its ``ETag``); ``PUT``, ``PATCH``, ``DELETE``."""

    @json_body(Role.ADMIN)
    @documented(
        Operation(
            summary="Replace a schedule's definition: the fields left out go back to defaults",
            path=["name"],
            body=openapi.SCHEDULE_BODY,
            headers=["If-Match"],
            answers={200: ("the schedule, its new ETag", openapi.SCHEDULE), **STALE_ANSWERS},
        )
    )
    async def put(self, name: str) -> None:
        schedules = self.schedules
        current = await self.write_call(schedules.get, name)
        changes = await self.write_call(
            rest_input.replacement_arguments,
            self.body,
            name,
            current.definition.timezone,
            schedules.defaults,
        )
        await self._update(name, changes)

    @json_body(Role.ADMIN)
    @documented(
        Operation(
            summary="Change the fields given of a schedule",
            path=["name"],
            body=openapi.SCHEDULE_BODY,
            headers=["If-Match"],
            answers={200: ("the schedule, its new ETag", openapi.SCHEDULE), **STALE_ANSWERS},
        )
    )
    async def patch(self, name: str) -> None:
        schedules = self.schedules
        current = await self.write_call(schedules.get, name)
        changes = await self.write_call(
            rest_input.change_arguments, self.body, name, current.definition.timezone
        )
        await self._update(name, changes)

    async def _update(self, name: str, changes: dict[str, Any]) -> None:
        updated = await self.write_call(
            self.schedules.update, name, if_version=self.if_match, **changes
        )
        self.send_schedule(updated)

    @json_body(Role.ADMIN)
    @documented(
        Operation(
            summary="Remove a schedule made at runtime (its runs and audit log stay)",
            path=["name"],
            body=openapi.EMPTY_BODY,
            headers=["If-Match"],
            answers={204: ("removed", None), **STALE_ANSWERS},
        )
    )
    async def delete(self, name: str) -> None:
        await self.write_call(self.schedules.delete, name, if_version=self.if_match)
        self.set_status(204)
        self.finish()


class ScheduleActionResource(RestHandler):
    """``POST /api/schedules/<name>/<action>``."""

    ROLES = {
        "pause": Role.OPERATOR,
        "resume": Role.OPERATOR,
        "trigger": Role.OPERATOR,
        "backfill": Role.OPERATOR,
        "restore": Role.ADMIN,
    }

    @json_body(Role.OPERATOR)
    @documented(
        Operation(
            summary=(
                "pause ({note}), resume, trigger (Idempotency-Key: one run per key),"
                " backfill ({from, to, limit}) (operator); restore ({version}) (admin)"
            ),
            path=["name", "action"],
            body={
                "anyOf": [
                    openapi.NOTE_BODY,
                    openapi.RESTORE_BODY,
                    openapi.BACKFILL_BODY,
                    openapi.EMPTY_BODY,
                ]
            },
            headers=["If-Match", "Idempotency-Key"],
            answers={
                200: ("paused, resumed or restored: the schedule", openapi.SCHEDULE),
                202: ("triggered (the run) or backfilled ({runs})", openapi.ANY_OBJECT),
                **STALE_ANSWERS,
            },
        )
    )
    async def post(self, name: str, action: str) -> None:
        self.require(self.ROLES[action])
        schedules = self.schedules
        if action == "pause":
            note = _optional_text(self.body, "note")
            self.send_schedule(
                await self.write_call(schedules.pause, name, note=note, if_version=self.if_match)
            )
        elif action == "resume":
            self.send_schedule(
                await self.write_call(schedules.resume, name, if_version=self.if_match)
            )
        elif action == "restore":
            version = _whole(self.body, "version")
            self.send_schedule(
                await self.write_call(schedules.restore, name, version, if_version=self.if_match)
            )
        else:
            # These change no field: If-Match says the schedule is still what was read.
            if self.if_match is not None:
                current = await self.write_call(schedules.get, name)
                await self.write_call(check_version, name, current.tag, self.if_match)
            if action == "trigger":
                await self._trigger(name)
            else:
                await self._backfill(name)

    async def _trigger(self, name: str) -> None:
        key = self.idempotency_key()
        run_id = None if key is None else await self.write_call(trigger_run_id, name, key)
        run = await self.write_call(self.schedules.trigger_run, name, run_id=run_id)
        self.set_status(202)
        self.send(rendering.run_document(run))

    async def _backfill(self, name: str) -> None:
        start = _time(self.body, "from")
        end = _time(self.body, "to")
        limit = self.body.get("limit", 100)
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise Problem(422, "limit: must be a whole number of runs", field="limit")
        made = await self.write_call(
            self.schedules.backfill, name, start=start, end=end, limit=limit
        )
        self.set_status(202)
        self.send({"runs": rendering.runs_document(made)})


def _optional_text(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise Problem(422, f"{key}: must be a string", field=key)
    return value


def _whole(body: dict[str, Any], key: str) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Problem(422, f"{key}: give the version number to restore", field=key)
    return value


def _time(body: dict[str, Any], key: str) -> Any:
    value = body.get(key)
    if not isinstance(value, str):
        raise Problem(422, f"{key}: give an ISO 8601 time with its offset", field=key)
    try:
        moment = parse_time(value)
    except ValueError as exc:
        raise Problem(422, f"{key}: {exc}", field=key) from None
    if moment.utcoffset() is None:
        raise Problem(422, f"{key}: give the time with its offset (+00:00)", field=key)
    return moment


class OpenAPIDocument(JSONHandler):
    """``GET /api/openapi.json``: the document of this API, made from its handlers."""

    @documented(
        Operation(summary="This document", answers={200: ("OpenAPI 3.1", openapi.ANY_OBJECT)})
    )
    async def get(self) -> None:
        self.send(openapi.document(self.application))


def routes(context: UIContext) -> list[tuple[str, type[tornado.web.RequestHandler], Any]]:
    arguments = {"context": context}
    return [
        (r"/api/openapi.json", OpenAPIDocument, arguments),
        (r"/api/schedules", SchedulesResource, arguments),
        (r"/api/schedules/([^/]+)", ScheduleResource, arguments),
        (
            r"/api/schedules/([^/]+)/(pause|resume|trigger|backfill|restore)",
            ScheduleActionResource,
            arguments,
        ),
    ]
