"""The OpenAPI 3.1 document of the HTTP API (``GET /api/openapi.json``), made from the
handlers themselves: the application's routes give the paths and the methods, each
method's ``documented`` declaration its parameters, body and answers, its role the
``json_body`` mark, and a write's body the fields of ``beat.ui.rest_input``. A handler
method under ``/api/`` without a declaration fails ``tests/unit/ui/test_openapi.py``."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import tornado.web

from beat.models import ChangeAction, ChangeEntry, Role, RunState
from beat.ui import rest_input

F = TypeVar("F", bound=Callable[..., Any])

METHODS = ("get", "post", "put", "patch", "delete")
#: A route's group: a path parameter, or a choice of words (``(pause|resume)``).
_GROUP = re.compile(r"\(([^()]*)\)")


@dataclass(frozen=True, kw_only=True)
class Query:
    name: str
    schema: dict[str, Any]
    description: str


@dataclass(frozen=True, kw_only=True)
class Operation:
    """What a handler method takes and answers, for the document."""

    summary: str
    #: The names of the route's groups, in order.
    path: Sequence[str] = ()
    query: Sequence[Query] = ()
    #: The request body's schema (None: no body).
    body: dict[str, Any] | None = None
    #: Request headers it reads: ``If-Match``, ``Idempotency-Key``.
    headers: Sequence[str] = ()
    #: Status → (description, the answer's schema; None for no body).
    answers: dict[int, tuple[str, dict[str, Any] | None]] = field(default_factory=dict)


def documented(operation: Operation) -> Callable[[F], F]:
    def mark(method: F) -> F:
        method.operation = operation  # type: ignore[attr-defined]
        return method

    return mark


# -- the documents -----------------------------------------------------------------

NULLABLE_TEXT = {"type": ["string", "null"]}
PROBLEM = {
    "type": "object",
    "description": "RFC 9457: what went wrong, what to do, the body's field it is about",
    "required": ["title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "error": {"type": "string"},
        "field": {"type": "string"},
        "current_etag": {"type": "string"},
    },
}
SCHEDULE = {
    "type": "object",
    "description": "`schedules show --json`",
    "required": ["name", "task", "enabled"],
    "properties": {
        "name": {"type": "string"},
        "task": {"type": "string"},
        "schedule": {"type": "string"},
        "timezone": {"type": "string"},
        "enabled": {"type": "boolean"},
        "origin": {"type": "string"},
        "next_fire_at": NULLABLE_TEXT,
        "last_fire_at": NULLABLE_TEXT,
        "disabled_reason": NULLABLE_TEXT,
        "version": {"type": "integer"},
        "problem": NULLABLE_TEXT,
    },
}
SCHEDULE_PAGE = {
    "type": "object",
    "required": ["total", "offset", "limit", "schedules"],
    "properties": {
        "total": {"type": "integer"},
        "offset": {"type": "integer"},
        "limit": {"type": "integer"},
        "schedules": {"type": "array", "items": SCHEDULE},
    },
}
RUN = {
    "type": "object",
    "description": "a run, as `schedules runs --json` shows it",
    "required": ["id", "state"],
    "properties": {
        "id": {"type": "string"},
        "task_id": {"type": "string"},
        "schedule": NULLABLE_TEXT,
        "state": {"type": "string", "enum": [state.value for state in RunState]},
        "fire_at": NULLABLE_TEXT,
    },
}
RUN_PAGE = {
    "type": "object",
    "required": ["runs", "next_before"],
    "properties": {"runs": {"type": "array", "items": RUN}, "next_before": NULLABLE_TEXT},
}
RUNS = {
    "type": "object",
    "required": ["runs"],
    "properties": {"runs": {"type": "array", "items": RUN}},
}
CHANGE = {
    "type": "object",
    "description": "a change of the audit log, as `schedules audit --json` shows it",
    "required": ["id", "schedule", "version", "action", "actor", "entry", "changed_at"],
    "properties": {
        "id": {"type": "integer"},
        "schedule": {"type": "string"},
        "version": {"type": "integer"},
        "changed_at": {"type": "string"},
        "action": {"type": "string", "enum": [action.value for action in ChangeAction]},
        "actor": {"type": "string"},
        "entry": {"type": "string", "enum": [entry.value for entry in ChangeEntry]},
        "host": NULLABLE_TEXT,
        "address": NULLABLE_TEXT,
        "note": NULLABLE_TEXT,
        "changes": {"type": "object"},
        "before": {"type": ["object", "null"]},
        "after": {"type": ["object", "null"]},
    },
}
CHANGES = {
    "type": "object",
    "required": ["changes"],
    "properties": {"changes": {"type": "array", "items": CHANGE}},
}
INCIDENTS = {
    "type": "object",
    "required": ["incidents"],
    "properties": {"incidents": {"type": "array", "items": {"type": "object"}}},
}
ANY_OBJECT = {"type": "object"}
SCHEDULE_BODY = {
    "type": "object",
    "description": "the Python API's keyword names; one of cron, every, at, in_seconds",
    "properties": {
        name: {**field.schema, "description": field.description}
        for name, field in rest_input.FIELDS.items()
    },
}
NOTE_BODY = {"type": "object", "properties": {"note": {"type": "string", "maxLength": 500}}}
EMPTY_BODY = {"type": "object"}
RESTORE_BODY = {
    "type": "object",
    "required": ["version"],
    "properties": {"version": {"type": "integer", "minimum": 1}},
}
BACKFILL_BODY = {
    "type": "object",
    "required": ["from", "to"],
    "properties": {
        "from": {"type": "string", "description": "ISO 8601 with its offset"},
        "to": {"type": "string", "description": "ISO 8601 with its offset"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 10000},
    },
}

#: Answers every operation may give.
COMMON = {
    401: ("no credentials, or wrong ones, or a token unknown or revoked", PROBLEM),
    403: ("the role may not do this, read-only, or another origin's write", PROBLEM),
}
#: Answers of every write.
WRITE = {
    400: ("the body is no JSON object", PROBLEM),
    404: ("no schedule of that name", PROBLEM),
    415: ("the body is not application/json", PROBLEM),
    422: ("a field is refused: which, and the fix", PROBLEM),
}
PRECONDITION = {412: ("If-Match names another version: read it again", PROBLEM)}


def document(application: tornado.web.Application) -> dict[str, Any]:
    """The OpenAPI document of ``application``'s routes under ``/api/``."""
    paths: dict[str, dict[str, Any]] = {}
    for pattern, handler in _api_routes(application):
        for method in METHODS:
            function = getattr(handler, method, None)
            operation = getattr(function, "operation", None)
            if operation is None:
                continue
            template, parameters = _path(pattern, operation)
            role = getattr(function, "required_role", Role.VIEWER)
            identifier = method + re.sub(r"[^A-Za-z0-9]+", "_", template).rstrip("_")
            paths.setdefault(template, {})[method] = _operation(
                operation, parameters, role, identifier
            )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "habeat schedules",
            "version": "1",
            "description": (
                "Schedules of the highly-available Celery beat: read them, change them and"
                " read who changed what. Each schedule's version is its ETag; a write with"
                " If-Match is refused (412) if it changed since. Roles: viewer (read),"
                " operator (pause, resume, trigger, backfill), admin (everything)."
            ),
        },
        "paths": dict(sorted(paths.items())),
        "components": {
            "securitySchemes": {
                "token": {"type": "http", "scheme": "bearer"},
                "password": {"type": "http", "scheme": "basic"},
            }
        },
        "security": [{"token": []}, {"password": []}],
    }


def undocumented(application: tornado.web.Application) -> list[str]:
    """Handler methods under ``/api/`` that declare nothing (the test keeps it empty)."""
    missing = []
    for pattern, handler in _api_routes(application):
        for method in METHODS:
            function = getattr(handler, method, None)
            own = function is not getattr(tornado.web.RequestHandler, method)
            if own and getattr(function, "operation", None) is None:
                missing.append(f"{method.upper()} {pattern} ({handler.__name__})")
    return missing


def _api_routes(application: tornado.web.Application) -> list[tuple[str, Any]]:
    found = []
    for rule in application.wildcard_router.rules:
        pattern = getattr(rule.matcher, "regex", None)
        if pattern is None or not pattern.pattern.startswith("/api/"):
            continue
        found.append((pattern.pattern.rstrip("$"), rule.target))
    return found


def _path(pattern: str, operation: Operation) -> tuple[str, list[dict[str, Any]]]:
    """The route as a path template, and its parameters."""
    names = iter(operation.path)
    parameters: list[dict[str, Any]] = []

    def named(match: re.Match[str]) -> str:
        name = next(names)
        group = match.group(1)
        schema: dict[str, Any] = {"type": "string"}
        if "|" in group:
            schema["enum"] = group.split("|")
        parameters.append({"name": name, "in": "path", "required": True, "schema": schema})
        return "{" + name + "}"

    return _GROUP.sub(named, pattern), parameters


def _operation(
    operation: Operation, parameters: list[dict[str, Any]], role: Role, identifier: str
) -> dict[str, Any]:
    found: dict[str, Any] = {
        "operationId": identifier,
        "summary": operation.summary,
        "description": f"Role: {role.value} or above.",
        "parameters": [
            *parameters,
            *(
                {"name": q.name, "in": "query", "schema": q.schema, "description": q.description}
                for q in operation.query
            ),
            *(
                {"name": header, "in": "header", "schema": {"type": "string"}}
                for header in operation.headers
            ),
        ],
        "responses": {
            str(status): _answer(description, schema)
            for status, (description, schema) in sorted({**COMMON, **operation.answers}.items())
        },
    }
    if operation.body is not None:
        found["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": operation.body}},
        }
    return found


def _answer(description: str, schema: dict[str, Any] | None) -> dict[str, Any]:
    if schema is None:
        return {"description": description}
    media = "application/problem+json" if schema is PROBLEM else "application/json"
    return {"description": description, "content": {media: {"schema": schema}}}


def markdown(document: dict[str, Any]) -> str:
    """The operations of ``document`` as a Markdown table, for the reference page
    (``docs/reference/http-api.md`` holds it; a test keeps the two the same)."""
    lines = ["| method and path | what | role | answers |", "| --- | --- | --- | --- |"]
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            role = operation["description"].removeprefix("Role: ").removesuffix(" or above.")
            answers = ", ".join(
                code for code in operation["responses"] if code not in ("401", "403")
            )
            summary = operation["summary"].replace("|", "\\|")
            lines.append(f"| `{method.upper()} {path}` | {summary} | {role} | {answers} |")
    return "\n".join(lines) + "\n"
