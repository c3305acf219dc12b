"""What a schedule may be: ``define`` checks what a user gives (from the Python API,
the CLI, the UI or code) and returns a :class:`~beat.models.ScheduleDefinition`, or
raises :class:`~beat.errors.InvalidSchedule` naming the fix, before anything is
written; ``first_fire_at`` is when a new definition fires first. Pure: no I/O, the
clock is the one given."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from beat.errors import (
    InvalidSchedule,
)
from beat.limits import (
    CHANNEL_NAME,
    MAX_CHANNEL_NAME_LENGTH,
    MAX_DURATION,
    MAX_FAILURE_THRESHOLD,
    MAX_INT4,
    MAX_JITTER_SECONDS,
    MAX_SCHEDULE_CHANNELS,
)
from beat.models import MisfirePolicy, Origin, OverlapPolicy, ScheduleDefinition
from beat.schedule import timing
from beat.schedule.options import check_publish_options
from beat.schedule.payload import check_payload
from beat.schedule.timing import Trigger
from beat.schedule.workflow import WORKFLOW_TASK, canvas_of, plan, stored_canvas, workflow_kwargs

#: Longest schedule name.
MAX_NAME_LENGTH = 200


#: Longest task name (a dotted path).
MAX_TASK_NAME_LENGTH = 255


#: A one-off this little before now is "now" (clock skew, the time a call takes); one
#: further in the past is refused unless allowed (``allow_past``).
PAST_ONE_OFF_GRACE = timedelta(minutes=1)


def define(
    name: str,
    task: str,
    *,
    cron: str | timing.Cron | None = None,
    every: float | timedelta | None = None,
    at: datetime | None = None,
    tz: str | None = None,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    queue: str | None = None,
    options: Mapping[str, Any] | None = None,
    enabled: bool = True,
    misfire_policy: MisfirePolicy | str = MisfirePolicy.FIRE_ONCE,
    max_attempts: int = 3,
    origin: Origin = Origin.API,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    max_runs: int | None = None,
    overlap_policy: OverlapPolicy | str = OverlapPolicy.ALLOW,
    jitter: float = 0.0,
    alert_after_failures: int | None = None,
    pause_after_failures: int | None = None,
    failure_states: Sequence[str] | None = None,
    max_runtime: float | timedelta | None = None,
    revoke_after_max_runtime: bool = False,
    late_after: float | timedelta | None = None,
    missed_after: float | timedelta | None = None,
    channels: Sequence[str] | None = None,
    in_seconds: float | None = None,
    allow_past: bool = False,
    default_tz: str = "UTC",
    now: datetime | None = None,
    workflow: Any = None,
) -> ScheduleDefinition:
    """Validate a schedule; raise :class:`InvalidSchedule` naming the first problem.

    Exactly one of ``cron`` (5 fields, or 6 with seconds first; or a
    :class:`beat.schedule.timing.Cron`, e.g. with ``both_days``), ``every``
    (seconds or a timedelta; first run at ``start_at`` if given, else one
    period from now), ``at`` (an aware datetime: one run; refused if it is more
    than ``PAST_ONE_OFF_GRACE`` in the past unless ``allow_past``, then it runs
    at once) and ``in_seconds`` (one run that many seconds from now). The window:
    no fire time before ``start_at`` or after ``end_at``, at most ``max_runs``
    runs; a schedule past its window disables itself. ``alert_after_failures`` and
    ``pause_after_failures`` set its failing monitor (None: the cluster's default; 0:
    never), ``failure_states`` what it counts (None: failed, lost and expired);
    ``max_runtime`` (revoked past it with ``revoke_after_max_runtime``), ``late_after``
    and ``missed_after`` its run monitors (seconds or a timedelta; None: none);
    ``channels`` the notification channels its incidents go to (None: every channel).
    ``workflow`` (a Celery canvas, its dict or JSON) makes the schedule fire that canvas
    instead of one task: ``task`` is then :data:`WORKFLOW_TASK` (or empty) and the steps
    carry their own arguments and options (``beat.schedule.workflow``).

    Relative times (``in_seconds``, an ``every`` without ``start_at``) count from
    ``now``: :class:`Schedules` passes the database's ``now()`` of the transaction
    that writes the schedule, the one clock of all nodes. Without it (validating
    only) this host's clock stands in.
    """
    now = now or datetime.now(UTC)
    _check_name(name)
    if workflow is not None:
        if task not in ("", WORKFLOW_TASK):
            raise InvalidSchedule(f"give a task or a workflow, not both (task {task!r:.80})")
        task = WORKFLOW_TASK
    check_task_name(task)
    zone_name = default_tz if tz is None else tz  # an empty name is refused, not defaulted
    timing.parse_zone(zone_name)
    for label, moment in (("at", at), ("start_at", start_at), ("end_at", end_at)):
        _check_representable_in_utc(moment, label)
    if at is not None and not allow_past:
        _check_not_past(at, now)
    if in_seconds is not None:
        if at is not None:
            raise InvalidSchedule("give in_seconds or at, not both")
        at = now + timedelta(seconds=_checked_seconds(in_seconds, "in_seconds", minimum=0))
    trigger = _trigger(cron=cron, every=every, at=at, start_at=start_at, now=now)
    if isinstance(trigger, timing.Every) and tz is not None:
        raise InvalidSchedule(
            "an interval counts elapsed seconds and has no time zone: leave tz (--tz) out,"
            " or use a cron (--cron) to fire at wall-clock times of a zone"
        )
    _check_window(start_at, end_at, max_runs)
    _check_jitter(jitter, trigger)
    if task == WORKFLOW_TASK:
        kwargs = _workflow_payload(workflow, args, kwargs, options, queue)
    payload_args, payload_kwargs = check_payload(args, kwargs)
    publish_options = _check_options(options, queue)
    policy = _misfire_policy(misfire_policy)
    check_count(max_attempts, "max_attempts")
    check_failure_threshold(alert_after_failures, "alert_after_failures")
    check_failure_threshold(pause_after_failures, "pause_after_failures")
    for flag, label in (
        (enabled, "enabled"),
        (revoke_after_max_runtime, "revoke_after_max_runtime"),
    ):
        if not isinstance(flag, bool):
            raise InvalidSchedule(f"{label} must be true or false, got {flag!r:.80}")
    if revoke_after_max_runtime and max_runtime is None:
        raise InvalidSchedule(
            "revoke_after_max_runtime needs a max_runtime: give one (--max-runtime SECONDS)"
        )
    return ScheduleDefinition(
        name=name,
        task=task,
        trigger=trigger,
        timezone=zone_name,
        args=payload_args,
        kwargs=payload_kwargs,
        options=publish_options,
        enabled=enabled,
        misfire_policy=policy,
        max_attempts=max_attempts,
        origin=origin,
        overlap_policy=_overlap_policy(overlap_policy),
        jitter_seconds=float(jitter),
        start_at=start_at,
        end_at=end_at,
        max_runs=max_runs,
        alert_after_failures=alert_after_failures,
        pause_after_failures=pause_after_failures,
        failure_states=check_failure_states(failure_states),
        max_runtime_seconds=check_monitor_seconds(max_runtime, "max_runtime"),
        revoke_after_max_runtime=revoke_after_max_runtime,
        late_after_seconds=check_monitor_seconds(late_after, "late_after"),
        missed_after_seconds=check_monitor_seconds(missed_after, "missed_after"),
        channels=check_channel_names(channels),
    )


def _checked_seconds(value: object, what: str, *, minimum: float) -> float:
    """A number of seconds from ``minimum`` to ``MAX_DURATION`` (NaN and infinities are
    not); compared before any conversion, so a huge integer cannot overflow."""
    longest = MAX_DURATION.total_seconds()
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not minimum <= value <= longest
    ):
        raise InvalidSchedule(
            f"{what} must be a number of seconds >= {minimum:g} and at most {longest:.0f}"
            f" ({MAX_DURATION.days} days), got {value!r:.80}"
        )
    return float(value)


def _check_representable_in_utc(moment: object, what: str) -> None:
    """An aware time whose UTC instant is a datetime: a far offset can push year 1 or
    year 9999 over the edge, where every comparison and conversion would overflow."""
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        return  # left to the checks of its kind, which say what is expected
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise InvalidSchedule(
            f"{what} {moment.isoformat()} lies outside the years 1 to 9999 once in UTC:"
            " give a time within them"
        ) from None


def _check_not_past(at: object, now: datetime) -> None:
    """A one-off more than ``PAST_ONE_OFF_GRACE`` before ``now`` is a mistake (a year, a
    zone) more often than a wish to run at once: refused unless allowed."""
    if isinstance(at, datetime) and at.utcoffset() is not None and at < now - PAST_ONE_OFF_GRACE:
        raise InvalidSchedule(
            f"at {at.isoformat()} is in the past (now is {now.astimezone(UTC):%Y-%m-%d %H:%M:%S}"
            " UTC): give a time to come, or allow it (--allow-past, allow_past=True)"
            " to run it once, at once"
        )


def _check_window(start_at: datetime | None, end_at: datetime | None, max_runs: int | None) -> None:
    for label, moment in (("start_at", start_at), ("end_at", end_at)):
        if moment is not None and (not isinstance(moment, datetime) or moment.utcoffset() is None):
            raise InvalidSchedule(
                f"{label} must be an aware datetime (with a UTC offset), got {moment!r}"
            )
    if start_at is not None and end_at is not None and end_at <= start_at:
        raise InvalidSchedule(
            f"end_at {end_at.isoformat()} is not after start_at {start_at.isoformat()}"
        )
    if max_runs is not None:
        check_count(max_runs, "max_runs")


def check_count(value: object, what: str, *, maximum: int = MAX_INT4) -> None:
    """A whole number from 1 to ``maximum``: by default what its ``integer`` column
    holds (PostgreSQL refuses more)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidSchedule(
            f"{what} must be a whole number from 1 to {maximum}, got {value!r:.80}"
        )


def check_monitor_seconds(value: object, what: str) -> float | None:
    """None (no such monitor), or a run monitor's time: seconds (or a timedelta) from 1
    to ``MAX_DURATION``; the monitors look every few seconds, so less means nothing."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return _checked_seconds(value, what, minimum=1)


#: The outcomes a failing monitor may count as failures.
FAILURE_STATES = ("failed", "lost", "expired")


def check_failure_states(states: object) -> tuple[str, ...] | None:
    """None (all of ``FAILURE_STATES``), or some of them, each once."""
    if states is None:
        return None
    if isinstance(states, str) or not isinstance(states, Sequence) or not states:
        raise InvalidSchedule(
            f"failure_states must be a list of some of {', '.join(FAILURE_STATES)},"
            f" got {states!r:.80}"
        )
    unknown = next((state for state in states if state not in FAILURE_STATES), None)
    if unknown is not None:
        raise InvalidSchedule(
            f"failure_states: {unknown!r:.40} is not an outcome counted as a failure: give"
            f" some of {', '.join(FAILURE_STATES)}"
        )
    return tuple(dict.fromkeys(states))


def check_channel_names(names: object) -> tuple[str, ...] | None:
    """None (every channel), or the names of up to ``MAX_SCHEDULE_CHANNELS`` channels,
    each once, in the order given. Whether they exist is the store's to say."""
    if names is None:
        return None
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise InvalidSchedule(f"channels must be a list of channel names, got {names!r:.80}")
    if not 1 <= len(names) <= MAX_SCHEDULE_CHANNELS:
        raise InvalidSchedule(
            f"channels must name 1 to {MAX_SCHEDULE_CHANNELS} channels (leave it out for"
            f" every channel), got {len(names)}"
        )
    for name in names:
        if (
            not isinstance(name, str)
            or not CHANNEL_NAME.fullmatch(name)
            or len(name) > MAX_CHANNEL_NAME_LENGTH
        ):
            raise InvalidSchedule(
                f"channel name {name!r:.120}: use letters, digits, '.', '_' and '-' (at most"
                f" {MAX_CHANNEL_NAME_LENGTH}), starting with a letter or digit"
            )
    return tuple(dict.fromkeys(names))


def check_failure_threshold(value: object, what: str) -> None:
    """None (the cluster's default), or failures in a row from 0 (never) to
    ``MAX_FAILURE_THRESHOLD``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSchedule(f"{what} must be a whole number of failures, got {value!r:.80}")
    if not 0 <= value <= MAX_FAILURE_THRESHOLD:
        raise InvalidSchedule(
            f"{what} must be from 0 (never) to {MAX_FAILURE_THRESHOLD} failures in a row,"
            f" got {value}"
        )


def _check_jitter(jitter: object, trigger: Trigger) -> None:
    """At most a day, and at most the interval: a longer one lets a run be published
    after the next one."""
    if (
        isinstance(jitter, bool)
        or not isinstance(jitter, int | float)
        or not 0 <= jitter <= MAX_JITTER_SECONDS  # NaN is not
    ):
        raise InvalidSchedule(
            f"jitter must be a number of seconds from 0 to {MAX_JITTER_SECONDS:g} (a day),"
            f" got {jitter!r:.80}"
        )
    if isinstance(trigger, timing.Every) and jitter > trigger.seconds:
        raise InvalidSchedule(
            f"jitter {jitter:g}s is longer than its interval {trigger.seconds:g}s: runs would"
            " overtake each other; give at most the interval"
        )


def _overlap_policy(value: OverlapPolicy | str) -> OverlapPolicy:
    return _choice(OverlapPolicy, value, "overlap policy")


PolicyT = TypeVar("PolicyT", MisfirePolicy, OverlapPolicy)


def _choice(kind: type[PolicyT], value: PolicyT | str, what: str) -> PolicyT:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(member.value for member in kind)
        raise InvalidSchedule(f"unknown {what} {value!r}: use one of {choices}") from None


def first_fire_at(definition: ScheduleDefinition, now: datetime) -> datetime | None:
    """The first fire time of a new (or redefined) schedule at database time ``now``.

    A one-off in the past fires once, now: its fire time is kept as it was given.
    """
    trigger = definition.trigger
    if isinstance(trigger, timing.Once):
        return trigger.at
    zone = timing.parse_zone(definition.timezone)
    after = now
    if definition.start_at is not None and definition.start_at > now:
        after = definition.start_at - timedelta(microseconds=1)  # start_at itself may fire
    first = timing.next_fire_after(trigger, zone, after)
    if first is not None and definition.end_at is not None and first > definition.end_at:
        return None
    return first


def _trigger(
    *,
    cron: str | timing.Cron | None,
    every: float | timedelta | None,
    at: datetime | None,
    start_at: datetime | None,
    now: datetime,
) -> Trigger:
    given = [
        kind for kind, value in (("cron", cron), ("every", every), ("at", at)) if value is not None
    ]
    if len(given) != 1:
        raise InvalidSchedule(
            "give exactly one of cron, every or at"
            + (f" (got {', '.join(given)})" if given else "")
        )
    if isinstance(cron, timing.Cron):
        return cron  # validated when it was built
    if cron is not None:
        return _parse_cron(cron)
    if every is not None:
        seconds = every.total_seconds() if isinstance(every, timedelta) else every
        checked = _checked_seconds(seconds, "every", minimum=timing.MIN_INTERVAL_SECONDS)
        return timing.every(checked, anchor=start_at or now)
    assert at is not None
    return timing.once(at)


def _parse_cron(expression: str) -> timing.Cron:
    """A cron; for a bad one of six fields the error says in which order they are read,
    since croniter (and so many a reader) puts the seconds last by default."""
    try:
        return timing.parse_cron(expression)
    except InvalidSchedule as exc:
        if isinstance(expression, str) and len(expression.split()) == 6:
            raise InvalidSchedule(
                f"{exc}; six fields are read seconds first: second minute hour day month"
                " weekday (croniter's default puts the seconds last)"
            ) from exc
        raise


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise InvalidSchedule(
            f"schedule name must be 1 to {MAX_NAME_LENGTH} characters, got {name!r}"
        )
    # Celery takes any text as an entry's name ('add every 10' in its docs); a control
    # character (NUL, a newline, an escape) would break a log line, a terminal or a header.
    if not name.isprintable():
        raise InvalidSchedule(f"schedule name {name!r} has control characters: use printable text")


def _workflow_payload(
    workflow: Any,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    options: Mapping[str, Any] | None,
    queue: str | None,
) -> dict[str, Any]:
    """The kwargs of a workflow schedule: from ``workflow``, or (a stored one defined
    again) from its stored kwargs."""
    if options or queue:
        raise InvalidSchedule(
            "a workflow's steps carry their own options (sig.set(queue=...)): leave the"
            " schedule's options and queue out"
        )
    if args:
        raise InvalidSchedule("a workflow's steps carry their own arguments: leave args out")
    if workflow is None:
        return workflow_kwargs(stored_canvas(canvas_of(kwargs or {})))
    if kwargs:
        raise InvalidSchedule("a workflow's steps carry their own arguments: leave kwargs out")
    return workflow_kwargs(stored_canvas(workflow))


def check_task_name(task: str) -> None:
    if not isinstance(task, str) or not task.strip() or task != task.strip():
        raise InvalidSchedule(f"task must be a registered Celery task name, got {task!r:.80}")
    if len(task) > MAX_TASK_NAME_LENGTH:
        raise InvalidSchedule(f"task name {task!r:.80} is over {MAX_TASK_NAME_LENGTH} characters")
    if not task.isprintable():
        raise InvalidSchedule(f"task name {task!r:.80} has control characters")


#: The longest note a pause (or another change) may carry.
MAX_NOTE_LENGTH = 500


def check_note(note: str) -> str:
    """A change's note, as people wrote it: one line of printable text, trimmed."""
    if not isinstance(note, str) or not note.strip():
        raise InvalidSchedule("note must be some text saying why: leave it out to give none")
    trimmed = note.strip()
    if len(trimmed) > MAX_NOTE_LENGTH:
        raise InvalidSchedule(f"note is over {MAX_NOTE_LENGTH} characters: shorten it")
    if not trimmed.isprintable():
        raise InvalidSchedule("note has control characters (a line break?): write it on one line")
    return trimmed


def _check_options(options: Mapping[str, Any] | None, queue: str | None) -> dict[str, Any]:
    """The publish options, with ``queue`` (the CLI's --queue) among them."""
    checked = check_publish_options({} if options is None else options)
    return checked if queue is None else check_publish_options(checked | {"queue": queue})


def arguments_problem(task: Any, definition: ScheduleDefinition) -> str | None:
    """Why ``task`` (a Celery task object, or None if unknown) cannot be called with the
    args and kwargs of ``definition``; None if it can, or if that cannot be told.

    ``task.run`` is what a worker calls: for a ``bind=True`` task it is bound already,
    so its signature leaves ``self`` out."""
    if task is None:
        return None
    try:
        signature = inspect.signature(task.run)
    except (AttributeError, TypeError, ValueError):
        return None  # no signature to read (a C function, an odd task class)
    try:
        signature.bind(*definition.args, **definition.kwargs)
    except TypeError as exc:
        shown = f"{definition.task}{_parameters_only(signature)}"
        return f"task {shown:.200} cannot take these arguments ({exc})"
    return None


def steps_problem(tasks: Mapping[str, Any], definition: ScheduleDefinition) -> str | None:
    """Why the workflow of ``definition`` cannot run on an app whose tasks are ``tasks``:
    a step's task is not registered, or cannot take its arguments (with the result of
    the step before it, where it takes one); None if every step can."""
    for step in plan(canvas_of(definition.kwargs)).steps:
        task = tasks.get(step.task)
        if task is None:
            return f"step {step.path} names {step.task!r:.200}, which is not a registered task"
        received = (None,) if step.takes_result else ()
        problem = arguments_problem(
            task,
            ScheduleDefinition(
                name=definition.name,
                task=step.task,
                trigger=definition.trigger,
                timezone=definition.timezone,
                args=(*received, *step.args),
                kwargs=dict(step.kwargs),
            ),
        )
        if problem is not None:
            taking = " (with the result of the step before it)" if step.takes_result else ""
            return f"step {step.path}: {problem}{taking}"
    return None


def _parameters_only(signature: inspect.Signature) -> str:
    """``(x, y=1, *, z)``: the names a call binds to, without the annotations."""
    bare = [
        parameter.replace(annotation=inspect.Parameter.empty)
        for parameter in signature.parameters.values()
    ]
    return str(signature.replace(parameters=bare, return_annotation=inspect.Signature.empty))


def _misfire_policy(value: MisfirePolicy | str) -> MisfirePolicy:
    return _choice(MisfirePolicy, value, "misfire policy")
