"""What a REST write's JSON body may hold, and how it becomes the keyword arguments of
:class:`beat.ops.schedules.Schedules` (``define``'s names): one table of fields, read
by the handlers and by the OpenAPI document, so the two cannot disagree.

A body's problems are ``BodyProblem`` (a 422 naming the field and the fix); a value
``define`` refuses is its ``InvalidSchedule``. Times are ISO 8601, read in the
schedule's zone when they have no offset, as the CLI reads them; durations are seconds
or a text with units (``10m``, ``1h30m``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from beat.errors import InvalidSchedule
from beat.models import MisfirePolicy, OverlapPolicy
from beat.ops.user_input import duration_seconds, parse_time, with_wall_times_read

#: Labels of the time fields in messages: a body names them as it spells them.
TIME_FIELDS = {"at": "at", "start_at": "start_at", "end_at": "end_at"}
#: The fields that set a schedule's timing: a create or a PUT gives exactly one.
TIMING_FIELDS = ("cron", "every", "at", "in_seconds")


class BodyProblem(InvalidSchedule):
    """A body the API cannot read as a schedule's fields: which field, and the fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Field:
    """A body's field: its JSON Schema, and what it becomes."""

    schema: dict[str, Any]
    description: str
    #: How the value is read: "text", "time", "duration", "number", "integer",
    #: "boolean", "array", "object", "names" (an array of strings).
    kind: str


_NULLABLE_NUMBER = {"type": ["number", "string", "null"]}
_TEXT = {"type": "string"}
_NULLABLE_TEXT = {"type": ["string", "null"]}
_COUNT = {"type": ["integer", "null"], "minimum": 0}

#: Every field a body may hold, in the Python API's keyword names.
FIELDS: dict[str, Field] = {
    "name": Field(_TEXT, "the schedule's name (a create's; a PUT's must be the path's)", "text"),
    "task": Field(_TEXT, "the registered Celery task it runs (or give workflow)", "text"),
    "workflow": Field(
        {"type": "object"},
        "a Celery canvas it fires instead of a task, as json.dumps(chain(...)) gives it",
        "object",
    ),
    "cron": Field(_TEXT, "a cron expression (5 fields, or 6 with seconds first)", "text"),
    "every": Field(
        {"type": ["number", "string"]}, "an interval: seconds, or 90s, 10m, 1h30m", "duration"
    ),
    "at": Field(_TEXT, "one run at this ISO 8601 time (no offset: in tz)", "time"),
    "in_seconds": Field({"type": "number"}, "one run this many seconds from now", "number"),
    "tz": Field(_TEXT, "the IANA zone of the cron and of times without an offset", "text"),
    "args": Field({"type": "array"}, "positional arguments, as JSON", "array"),
    "kwargs": Field({"type": "object"}, "keyword arguments, as JSON", "object"),
    "options": Field({"type": "object"}, "publish options: queue, priority, expires...", "object"),
    "queue": Field(_NULLABLE_TEXT, "the queue its runs go to", "text"),
    "enabled": Field({"type": "boolean"}, "false: created paused", "boolean"),
    "misfire_policy": Field(
        {"type": "string", "enum": [policy.value for policy in MisfirePolicy]},
        "what to do with fire times missed for longer than the misfire grace",
        "text",
    ),
    "overlap_policy": Field(
        {"type": "string", "enum": [policy.value for policy in OverlapPolicy]},
        "what to do when a fire time comes while a run is active",
        "text",
    ),
    "max_attempts": Field(
        {"type": "integer", "minimum": 1}, "deliveries before a run is lost", "integer"
    ),
    "jitter": Field(_NULLABLE_NUMBER, "seconds of random delay of each run", "duration"),
    "start_at": Field(_NULLABLE_TEXT, "no fire time before this ISO 8601 time", "time"),
    "end_at": Field(_NULLABLE_TEXT, "no fire time after this ISO 8601 time", "time"),
    "max_runs": Field(
        {"type": ["integer", "null"], "minimum": 1}, "at most so many runs", "integer"
    ),
    "alert_after_failures": Field(_COUNT, "failures in a row that open an incident", "integer"),
    "pause_after_failures": Field(_COUNT, "failures in a row that pause it", "integer"),
    "failure_states": Field(
        {"type": ["array", "null"], "items": {"type": "string"}},
        "the run states that count as failures",
        "names",
    ),
    "max_runtime": Field(_NULLABLE_NUMBER, "a run running longer overran", "duration"),
    "revoke_after_max_runtime": Field({"type": "boolean"}, "revoke a run that overran", "boolean"),
    "late_after": Field(_NULLABLE_NUMBER, "a run started later than this is late", "duration"),
    "missed_after": Field(
        _NULLABLE_NUMBER, "a fire time not sent this long after is missed", "duration"
    ),
    "channels": Field(
        {"type": ["array", "null"], "items": {"type": "string"}},
        "the channels its incidents go to (null: every one)",
        "names",
    ),
    "allow_unregistered": Field(
        {"type": "boolean"}, "do not check that this process knows the task", "boolean"
    ),
}


#: What a PUT gives each field it leaves out (the cluster's default where ``defaults``
#: has one: the policies); the zone and whether it is paused stay as they are.
PUT_RESETS: dict[str, Any] = {
    "args": [],
    "kwargs": {},
    "options": {},
    "misfire_policy": MisfirePolicy.FIRE_ONCE.value,
    "overlap_policy": OverlapPolicy.ALLOW.value,
    "max_attempts": 3,
    "jitter": 0.0,
    "start_at": None,
    "end_at": None,
    "max_runs": None,
    "alert_after_failures": None,
    "pause_after_failures": None,
    "failure_states": None,
    "max_runtime": None,
    "revoke_after_max_runtime": False,
    "late_after": None,
    "missed_after": None,
    "channels": None,
}


def creation_arguments(body: Any, default_tz: str) -> tuple[str, str, dict[str, Any]]:
    """The name, the task and the other keyword arguments of ``Schedules.create``; a
    workflow's task is empty (``define`` refuses a task beside a workflow)."""
    fields = _read(body)
    name = _required(fields, "name")
    task = fields.pop("task", "") if "workflow" in fields else _required(fields, "task")
    _one_timing(fields)
    rest = {key: value for key, value in fields.items() if key not in ("name", "task")}
    return name, task, _times_read(rest, default_tz)


def replacement_arguments(
    body: Any, name: str, zone: str, defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """The keyword arguments of ``Schedules.update`` for a PUT: every field it leaves
    out goes back to its default (``PUT_RESETS``)."""
    fields = _read(body)
    if fields.pop("name", name) != name:
        raise BodyProblem("name", "a PUT cannot rename: give the path's name, or none")
    if "workflow" not in fields:
        _required(fields, "task")
    _one_timing(fields)
    reset = {key: defaults.get(key, value) for key, value in PUT_RESETS.items()}
    return _times_read(reset | fields, zone)


def change_arguments(body: Any, name: str, zone: str) -> dict[str, Any]:
    """The keyword arguments of ``Schedules.update`` for a PATCH: the fields given."""
    fields = _read(body)
    if fields.pop("name", name) != name:
        raise BodyProblem("name", "a PATCH cannot rename: give the path's name, or none")
    if not fields:
        raise BodyProblem("", "the body changes nothing: give the fields to change")
    given = [key for key in TIMING_FIELDS if key in fields]
    if len(given) > 1:
        raise BodyProblem(given[1], f"give one timing, not {' and '.join(given)}")
    return _times_read(fields, fields.get("tz") or zone)


def _read(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BodyProblem("", "the body must be a JSON object of the schedule's fields")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise BodyProblem(
            unknown[0], f"no such field: the fields are {', '.join(FIELDS)} (see /api/openapi.json)"
        )
    return {key: _value(key, value) for key, value in body.items()}


def _value(key: str, value: Any) -> Any:
    """``value`` as ``define`` takes it, by its field's kind."""
    field = FIELDS[key]
    if value is None:
        if "null" not in field.schema.get("type", []):
            raise BodyProblem(key, "must not be null: leave it out for its default")
        return None
    reader = _READERS[field.kind]
    return reader(key, value)


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise BodyProblem(key, f"must be a string, got {_json_type(value)}")
    return value


def _time(key: str, value: Any) -> datetime:
    try:
        return parse_time(_text(key, value))
    except ValueError as exc:
        raise BodyProblem(key, str(exc)) from None


def _duration(key: str, value: Any) -> float:
    if isinstance(value, str):
        try:
            return duration_seconds(value)
        except ValueError as exc:
            raise BodyProblem(key, str(exc)) from None
    return _number(key, value)


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BodyProblem(key, f"must be a number of seconds, got {_json_type(value)}")
    return float(value)


def _integer(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BodyProblem(key, f"must be a whole number, got {_json_type(value)}")
    return value


def _boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise BodyProblem(key, f"must be true or false, got {_json_type(value)}")
    return value


def _array(key: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise BodyProblem(key, f"must be a JSON array, got {_json_type(value)}")
    return value


def _object(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BodyProblem(key, f"must be a JSON object, got {_json_type(value)}")
    return value


def _names(key: str, value: Any) -> list[str]:
    items = _array(key, value)
    if not all(isinstance(item, str) for item in items):
        raise BodyProblem(key, "must be an array of strings")
    return items


_READERS = {
    "text": _text,
    "time": _time,
    "duration": _duration,
    "number": _number,
    "integer": _integer,
    "boolean": _boolean,
    "array": _array,
    "object": _object,
    "names": _names,
}


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names |= {list: "an array", dict: "an object"}
    return names.get(type(value), "null")


def _required(fields: Mapping[str, Any], key: str) -> str:
    value = fields.get(key)
    if not value:
        also = ", or its workflow (a Celery canvas)" if key == "task" else ""
        raise BodyProblem(key, f"is required: give the schedule's {key}{also}")
    return str(value)


def _one_timing(fields: Mapping[str, Any]) -> None:
    given = [key for key in TIMING_FIELDS if fields.get(key) is not None]
    if len(given) != 1:
        listed = " and ".join(given) if given else "none"
        raise BodyProblem(
            "cron" if not given else given[1],
            f"give exactly one of {', '.join(TIMING_FIELDS)} (got {listed})",
        )


def _times_read(fields: dict[str, Any], zone: str) -> dict[str, Any]:
    return with_wall_times_read(fields, lambda: fields.get("tz") or zone, TIME_FIELDS)
