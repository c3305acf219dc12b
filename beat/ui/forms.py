"""The schedule form: its fields as text, read into the arguments of
:meth:`beat.ops.schedules.Schedules.create` and
:meth:`~beat.ops.schedules.Schedules.update`, and each error put beside the field it is about.

What a field means is the CLI's (``celery -A app schedules add --help``): the same
parsers (``beat.ops.user_input``) and the same validation (``beat.schedule.define.define``) apply,
so a schedule the CLI refuses is refused here with the same words.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from beat.errors import InvalidSchedule
from beat.models import MisfirePolicy, OverlapPolicy, Schedule
from beat.ops.user_input import duration_seconds, parse_time, with_wall_times_read
from beat.records import ScheduleChange
from beat.schedule.timing import Cron, Every, Once

#: The timing kinds, in the order the form offers them.
KINDS = ("cron", "every", "at")
#: The fields of the form, in order (``name`` only when creating).
FIELDS = (
    "name",
    "task",
    "kind",
    "timing",
    "tz",
    "args",
    "kwargs",
    "queue",
    "misfire_policy",
    "overlap_policy",
    "max_attempts",
    "jitter",
    "start_at",
    "end_at",
    "max_runs",
    "alert_after_failures",
    "pause_after_failures",
    "failure_states",
    "max_runtime",
    "late_after",
    "missed_after",
    "channels",
    "revoke_after_max_runtime",
    "enabled",
)
#: The fields that are checkboxes: "on" when checked, absent when not.
_CHECKBOXES = frozenset({"enabled", "revoke_after_max_runtime"})
#: How the times are named in errors (the form's labels).
_TIME_LABELS = {"at": "time", "start_at": "start", "end_at": "end"}
#: Where an error of the API belongs, by how it starts (its subject comes first): the
#: first match wins.
_ERROR_SUBJECTS = (
    ("schedule name", "name"),
    ("task", "task"),
    ("invalid cron", "timing"),
    ("cron", "timing"),
    ("invalid interval", "timing"),
    ("every", "timing"),
    ("at ", "timing"),
    ("time ", "timing"),
    ("give exactly one of", "timing"),
    ("unknown time zone", "tz"),
    ("an interval counts elapsed seconds", "tz"),
    ("args and kwargs", "args"),
    ("args", "args"),
    ("kwargs", "kwargs"),
    ("options", "queue"),
    ("unsupported publish option", "queue"),
    ("jitter", "jitter"),
    ("max_attempts", "max_attempts"),
    ("max_runs", "max_runs"),
    ("alert_after_failures", "alert_after_failures"),
    ("pause_after_failures", "pause_after_failures"),
    ("failure_states", "failure_states"),
    ("max_runtime", "max_runtime"),
    ("revoke_after_max_runtime needs", "max_runtime"),
    ("revoke_after_max_runtime", "revoke_after_max_runtime"),
    ("late_after", "late_after"),
    ("missed_after", "missed_after"),
    ("channel", "channels"),
    ("no channel", "channels"),
    ("start_at", "start_at"),
    ("start ", "start_at"),
    ("end_at", "end_at"),
    ("end ", "end_at"),
    ("unknown misfire policy", "misfire_policy"),
    ("unknown overlap policy", "overlap_policy"),
)
#: And, failing that, by words it holds.
_ERROR_WORDS = (("exists already", "name"), ("cron", "timing"))


@dataclass(kw_only=True)
class ScheduleForm:
    """The form as typed (to show again) and what was wrong with it, by field ("" for
    the form as a whole)."""

    values: dict[str, str]
    errors: dict[str, str] = field(default_factory=dict)
    #: The version of the schedule the form was opened on (``Schedule.tag``): a save
    #: is refused if it changed since, rather than overwrite what another person did.
    version: str = ""
    #: The changes made since then, when a save was refused for them.
    changed_since: list[ScheduleChange] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def fail(self, message: str) -> None:
        """Put an error of the API beside the field it is about."""
        self.errors.setdefault(field_of_error(message), message)


def blank_form(defaults: Mapping[str, Any]) -> ScheduleForm:
    """A new schedule's form, with the cluster's defaults filled in."""
    return ScheduleForm(
        values={
            "kind": "cron",
            "tz": str(defaults.get("default_tz", "UTC")),
            "args": "[]",
            "kwargs": "{}",
            "misfire_policy": str(defaults.get("misfire_policy", MisfirePolicy.FIRE_ONCE)),
            "overlap_policy": OverlapPolicy.ALLOW.value,
            "max_attempts": str(defaults.get("max_attempts", 3)),
            "jitter": "0",
            "enabled": "on",
        }
    )


def form_of(schedule: Schedule) -> ScheduleForm:
    """The form of a stored schedule, as the edit page shows it, at its version."""
    form = _form_of(schedule)
    form.version = schedule.tag
    return form


def _form_of(schedule: Schedule) -> ScheduleForm:
    """The form of a stored schedule, as the edit page shows it."""
    definition = schedule.definition
    trigger = definition.trigger
    kind, timing_text = _timing_of(trigger)
    options = dict(definition.options)
    return ScheduleForm(
        values={
            "name": definition.name,
            "task": definition.task,
            "kind": kind,
            "timing": timing_text,
            "tz": "" if isinstance(trigger, Every) else definition.timezone,
            "args": json.dumps(list(definition.args)),
            "kwargs": json.dumps(definition.kwargs),
            "queue": str(options.get("queue") or ""),
            "misfire_policy": definition.misfire_policy.value,
            "overlap_policy": definition.overlap_policy.value,
            "max_attempts": str(definition.max_attempts),
            "jitter": f"{definition.jitter_seconds:g}",
            "start_at": "" if definition.start_at is None else definition.start_at.isoformat(),
            "end_at": "" if definition.end_at is None else definition.end_at.isoformat(),
            "max_runs": "" if definition.max_runs is None else str(definition.max_runs),
            "alert_after_failures": _count_text(definition.alert_after_failures),
            "pause_after_failures": _count_text(definition.pause_after_failures),
            "failure_states": ", ".join(definition.failure_states or ()),
            "max_runtime": _seconds_text(definition.max_runtime_seconds),
            "late_after": _seconds_text(definition.late_after_seconds),
            "missed_after": _seconds_text(definition.missed_after_seconds),
            "channels": ", ".join(definition.channels or ()),
            "revoke_after_max_runtime": "on" if definition.revoke_after_max_runtime else "",
            "enabled": "on" if definition.enabled else "",
        }
    )


def _count_text(count: int | None) -> str:
    return "" if count is None else str(count)


def _seconds_text(seconds: float | None) -> str:
    return "" if seconds is None else seconds_field(seconds)


def seconds_field(seconds: float) -> str:
    """Seconds as the form shows them, read back as they were: whole ones without a
    fraction, others exactly, never in an exponent (``1e+06s`` would be refused)."""
    return f"{seconds:.0f}s" if seconds.is_integer() else f"{seconds!r}s"


def _timing_of(trigger: Cron | Every | Once) -> tuple[str, str]:
    if isinstance(trigger, Cron):
        return "cron", trigger.expression
    if isinstance(trigger, Every):
        return "every", seconds_field(trigger.seconds)
    return "at", trigger.at.isoformat()


def submitted(arguments: Mapping[str, str]) -> ScheduleForm:
    """The form as posted: every field as text, stripped but the name, which is kept as
    typed, as the CLI and code keep it (an unchecked box is absent)."""
    return ScheduleForm(
        values={
            name: (text if name == "name" else text.strip())
            for name in FIELDS
            for text in [arguments.get(name, "")]
        }
    )


def creation_arguments(form: ScheduleForm, default_tz: str) -> dict[str, Any]:
    """The keyword arguments of ``Schedules.create`` (besides name and task); the errors
    of reading the fields are left on ``form``."""
    fields = _read(form, [name for name in FIELDS if name not in {"name", "task"}])
    for checkbox in _CHECKBOXES:
        fields[checkbox] = form.values.get(checkbox) == "on"
    return _wall_times_read(form, fields, lambda: fields.get("tz") or default_tz)


def update_arguments(form: ScheduleForm, current: Schedule) -> dict[str, Any]:
    """The changes for ``Schedules.update``: only the fields whose text differs from the
    stored schedule's form, so an unchanged interval keeps its anchor and an
    unchanged one-off is not checked against the past again."""
    before = form_of(current).values
    changed = [
        name
        for name in FIELDS
        if name != "name"
        and name not in _CHECKBOXES
        and form.values.get(name, "") != before.get(name, "")
    ]
    if "kind" in changed or "tz" in changed:
        changed.append("timing")  # a timing of another kind, or read in another zone
    fields = _read(form, list(dict.fromkeys(changed)))
    for checkbox in _CHECKBOXES:
        checked = form.values.get(checkbox) == "on"
        if checked != getattr(current.definition, checkbox):
            fields[checkbox] = checked
    zone = fields.get("tz") or current.definition.timezone
    return _wall_times_read(form, fields, lambda: zone)


def _wall_times_read(
    form: ScheduleForm, fields: dict[str, Any], zone: Callable[[], str]
) -> dict[str, Any]:
    """``fields`` with the times typed without an offset read in the schedule's zone."""
    if not form.ok:
        return fields
    try:
        return with_wall_times_read(fields, zone, _TIME_LABELS)
    except InvalidSchedule as exc:  # a time the clocks skip or repeat; an unknown zone
        form.fail(str(exc))
    return fields


def _read(form: ScheduleForm, names: list[str]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in names:
        if name in {"name", "kind"} or name in _CHECKBOXES:
            continue
        text = form.values.get(name, "")
        try:
            fields.update(_field(name, text, form.values.get("kind", "cron")))
        except ValueError as exc:
            form.errors[name] = str(exc)
    return fields


def _field(name: str, text: str, kind: str) -> dict[str, Any]:
    """One field as the API's keyword arguments; ValueError says what to type."""
    if name == "timing":
        return _timing(kind, text)
    if name in {"args", "kwargs"}:
        return {name: _json(text, list if name == "args" else dict, name)}
    if name in {"max_attempts", "max_runs", "alert_after_failures", "pause_after_failures"}:
        return {name: _whole_number(text, name)} if text else {name: None}
    if name == "jitter":
        return {"jitter": duration_seconds(text) if text else 0.0}
    if name in {"max_runtime", "late_after", "missed_after"}:
        return {name: duration_seconds(text) if text else None}
    if name in {"channels", "failure_states"}:
        names = [part.strip() for part in text.split(",") if part.strip()]
        return {name: names or None}
    if name in {"start_at", "end_at"}:
        return {name: parse_time(text) if text else None}
    if name == "queue":
        return {"queue": text} if text else {}
    if name == "tz":
        return {"tz": text} if text else {}
    return {name: text}  # the policies: the API names the choices when one is wrong


def _timing(kind: str, text: str) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"unknown timing kind {kind!r:.40}: choose cron, every or at")
    if not text:
        examples = {"cron": "30 2 * * *", "every": "10m", "at": "2027-01-31T09:00"}
        raise ValueError(f"give the {kind} timing, e.g. {examples[kind]}")
    if kind == "every":
        return {"every": duration_seconds(text)}
    if kind == "at":
        return {"at": parse_time(text)}
    return {"cron": text}


def _json(text: str, kind: type, name: str) -> Any:
    what = 'a JSON array, e.g. [1, "a"]' if kind is list else 'a JSON object, e.g. {"k": 1}'
    try:
        value = json.loads(text or ("[]" if kind is list else "{}"))
    except (json.JSONDecodeError, RecursionError):
        raise ValueError(f"{name} is not JSON: give {what}") from None
    if not isinstance(value, kind):
        raise ValueError(f"{name} must be {what}, got {type(value).__name__}")
    return value


def _whole_number(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {text!r:.40}") from None


def field_of_error(message: str) -> str:
    """The field an error of the API is about ("" when it is about none in particular)."""
    lowered = message.lower()
    for subject, name in _ERROR_SUBJECTS:
        if lowered.startswith(subject):
            return name
    for words, name in _ERROR_WORDS:
        if words in lowered:
            return name
    return ""
