"""The API's errors as problem documents (RFC 9457, ``application/problem+json``): the
status, a title, what went wrong and what to do (``detail``), and the field of the
body it is about; ``error`` repeats ``detail`` for clients of the read API before
problem documents."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tornado.web

from beat.errors import (
    IdempotencyKeyReused,
    InvalidSchedule,
    ScheduleExists,
    ScheduleNotFound,
    VersionConflict,
)
from beat.ui.forms import field_of_error
from beat.ui.rest_input import TIMING_FIELDS, BodyProblem

CONTENT_TYPE = "application/problem+json"
#: The status of each error of the facade a write may meet.
STATUS: tuple[tuple[type[Exception], int], ...] = (
    (VersionConflict, 412),
    (ScheduleNotFound, 404),
    (ScheduleExists, 409),
    (IdempotencyKeyReused, 409),
    (InvalidSchedule, 422),
)


class Problem(tornado.web.HTTPError):
    """An HTTP error the API answers with a problem document naming ``field``."""

    def __init__(self, status: int, detail: str, *, field: str = "", **extra: Any) -> None:
        super().__init__(status, "%s", detail)
        self.detail = detail
        self.field = field
        self.extra = extra


def problem_of(exc: Exception, body: Mapping[str, Any] | None = None) -> Problem | None:
    """The problem of an error of the facade (None for one that is no client's fault)."""
    for kind, status in STATUS:
        if isinstance(exc, kind):
            extra = {}
            if isinstance(exc, VersionConflict):
                extra = {"current_etag": f'"{exc.current}"'}
            field = _field(exc, body) if status == 422 else ""
            return Problem(status, str(exc), field=field, **extra)
    return None


def document(
    status: int, title: str, detail: str, *, field: str = "", **extra: Any
) -> dict[str, Any]:
    found = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
        "error": detail,
    }
    if field:
        found["field"] = field
    return found | extra


def _field(exc: Exception, body: Mapping[str, Any] | None) -> str:
    """The body's field an error of ``define`` is about: the form's names, in the body's."""
    if isinstance(exc, BodyProblem):
        return exc.field
    field = field_of_error(str(exc))
    given = body or {}
    if field == "timing":
        return next((key for key in TIMING_FIELDS if key in given), "cron")
    if field == "queue":
        return "queue" if "queue" in given else "options"
    return field
