"""The options of the ``schedules`` commands and how their values are read: JSON
arguments, times, durations, bounded limits, ``--json``, and the options that define
a schedule (shared by add and update)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from beat.limits import MAX_FAILURE_THRESHOLD
from beat.models import MisfirePolicy, OverlapPolicy
from beat.ops.user_input import (
    duration_seconds,
    is_duration,
    parse_duration,
    parse_time,
)

_MISFIRE_POLICIES = [policy.value for policy in MisfirePolicy]


def _json_argument(
    kind: type, what: str
) -> Callable[[click.Context, click.Parameter, str | None], Any]:
    def parse(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON ({exc.msg}): give {what}") from None
        except RecursionError:
            raise click.BadParameter(f"nested too deeply to read: give {what}") from None
        except ValueError as exc:  # e.g. an integer of more than 4300 digits
            raise click.BadParameter(f"not usable JSON ({exc}): give {what}") from None
        if not isinstance(parsed, kind):
            raise click.BadParameter(f"must be {what}, got {type(parsed).__name__}")
        return parsed

    return parse


def _parse_time(_ctx: click.Context, _param: click.Parameter, value: str | None) -> datetime | None:
    """An ISO 8601 time; without an offset it is a wall time, read later in the zone of
    the schedule (``with_wall_times_read``)."""
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _parse_aware_time(_ctx: click.Context, param: click.Parameter, value: str) -> datetime:
    """An ISO 8601 time with its UTC offset (backfill windows are instants)."""
    moment = _parse_time(_ctx, param, value)
    assert moment is not None
    if moment.utcoffset() is None:
        raise click.BadParameter(f"{value!r} has no UTC offset: add one, e.g. {value}+00:00")
    return moment


def _parse_duration(_ctx: click.Context, _param: click.Parameter, value: str) -> timedelta:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _parse_seconds(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    """--every, --in, --jitter: seconds, bare or with units; bounds are the API's."""
    if value is None:
        return None
    try:
        return duration_seconds(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


#: What ``--alert-after-failures default`` means: the cluster's default again.
DEFAULT_THRESHOLD = "default"


def _parse_threshold(
    _ctx: click.Context, param: click.Parameter, value: str | None
) -> int | str | None:
    """--alert-after-failures, --pause-after-failures: failures in a row, 0 (never) or
    ``default``; bounds are the API's."""
    if value is None or value == DEFAULT_THRESHOLD:
        return value
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a number of failures: give 0 (never) to"
            f" {MAX_FAILURE_THRESHOLD}, or {DEFAULT_THRESHOLD}"
        ) from None


#: What ``--max-runtime none`` (and ``--late-after``, ``--missed-after``) means: no
#: such monitor.
NO_MONITOR = "none"
_RUN_MONITORS = frozenset({"max_runtime", "late_after", "missed_after"})


def _parse_monitor_seconds(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> float | str | None:
    """--max-runtime, --late-after, --missed-after: seconds, bare or with units, or
    ``none``; bounds are the API's."""
    if value is None or value == NO_MONITOR:
        return value
    return _parse_seconds(ctx, param, value)


#: What ``--channels all`` and ``--failure-states all`` mean: every one.
ALL = "all"
_LISTS = frozenset({"channels", "failure_states"})


def _parse_names(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> list[str] | str | None:
    """--channels, --failure-states: names separated by commas, or ``all``; the names
    are the API's to check."""
    if value is None or value == ALL:
        return value
    return [name.strip() for name in value.split(",")]


def monitors_given(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with a threshold given as ``default`` set back to None (the cluster's),
    a run monitor given as ``none`` to None (none), and a list given as ``all`` to None
    (every channel, every failure state)."""

    def meant(key: str, value: Any) -> Any:
        if value == DEFAULT_THRESHOLD and key.endswith("_after_failures"):
            return None
        if value == NO_MONITOR and key in _RUN_MONITORS:
            return None
        if value == ALL and key in _LISTS:
            return None
        return value

    return {key: meant(key, value) for key, value in fields.items()}


def _parse_since(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> datetime | timedelta | None:
    """A duration back from now (``2h``), or an ISO 8601 time (UTC unless it has an offset)."""
    if value is None:
        return None
    if is_duration(value):
        return _parse_duration(ctx, param, value)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a duration (2h, 30m, 7d) nor an ISO 8601 time"
            " (2027-01-31T09:00:00+00:00)"
        ) from None
    return moment if moment.utcoffset() is not None else moment.replace(tzinfo=UTC)


def _since_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--since``: a duration back from the database's now, or an ISO 8601 time."""
    return click.option(
        "--since",
        callback=_parse_since,
        help=f"only {what} since: a duration back from now (2h, 30m, 7d) or an ISO 8601 time (UTC)",
    )


def _limit_option(
    default: int, maximum: int, what: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--limit``, bounded: what one command reads and writes stays small, and a number
    past PostgreSQL's bigint never reaches it."""
    return click.option(
        "--limit",
        type=click.IntRange(min=1, max=maximum),
        default=default,
        show_default=True,
        help=f"{what} (at most {maximum})",
    )


def _json_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--json", "as_json", is_flag=True, help="one JSON document on stdout, for scripts"
    )(function)


_DEFINITION_OPTIONS = (
    click.option(
        "--cron",
        help="cron expression: 5 fields 'minute hour day month weekday', or 6 read seconds"
        " first, 'second minute hour day month weekday' (croniter puts seconds last)",
    ),
    click.option(
        "--every",
        callback=_parse_seconds,
        help="interval: seconds (90) or with units (90s, 10m, 1h30m, 2d, 1w); 1s to 3650 days,"
        " counted from now (or --start-at)",
    ),
    click.option(
        "--at",
        "at",
        callback=_parse_time,
        help="one-off time, ISO 8601: 2027-01-31T09:00 in --tz (else in the default zone, or"
        " on update the schedule's), or with an offset, 2027-01-31T09:00:00+01:00",
    ),
    click.option(
        "--tz",
        help="IANA time zone of the cron fields and of times without an offset, e.g."
        " Europe/Berlin (not for --every: an interval has no zone)",
    ),
    click.option(
        "--args",
        "args",
        callback=_json_argument(list, "a JSON array"),
        help="JSON array (checked against the task's signature)",
    ),
    click.option(
        "--kwargs",
        "kwargs",
        callback=_json_argument(dict, "a JSON object"),
        help="JSON object (checked against the task's signature)",
    ),
    click.option("--queue", help="queue to publish to"),
    click.option(
        "--in",
        "in_seconds",
        callback=_parse_seconds,
        help="one-off in a while: seconds (90) or with units (90s, 10m, 1h30m)",
    ),
    click.option(
        "--start-at", callback=_parse_time, help="no fire time before this (ISO 8601, as --at)"
    ),
    click.option(
        "--end-at",
        callback=_parse_time,
        help="no fire time after this; then it disables (ISO 8601, as --at)",
    ),
    click.option(
        "--allow-past",
        is_flag=True,
        help="accept an --at more than a minute in the past: it runs once, at once",
    ),
    click.option(
        "--max-runs", type=click.IntRange(min=1), help="at most this many runs (up to 2147483647)"
    ),
    click.option(
        "--jitter",
        callback=_parse_seconds,
        help="delay each run by a stable random time up to this: seconds (30) or 5m; at most"
        " 1d, and at most the interval",
    ),
    click.option(
        "--alert-after-failures",
        callback=_parse_threshold,
        help="open an incident after this many failures in a row: 0 (never) to"
        f" {MAX_FAILURE_THRESHOLD}, or default (HABEAT_ALERT_AFTER_FAILURES)",
    ),
    click.option(
        "--pause-after-failures",
        callback=_parse_threshold,
        help="pause the schedule after this many failures in a row: 0 (never) to"
        f" {MAX_FAILURE_THRESHOLD}, or default (HABEAT_PAUSE_AFTER_FAILURES)",
    ),
    click.option(
        "--failure-states",
        callback=_parse_names,
        help="what the failing monitor counts as a failure: some of failed, lost, expired,"
        " separated by commas, or all (the default)",
    ),
    click.option(
        "--max-runtime",
        callback=_parse_monitor_seconds,
        help="open an overran incident while a run has been running this long: seconds (600)"
        " or with units (10m, 1h30m), or none",
    ),
    click.option(
        "--revoke-after-max-runtime/--no-revoke-after-max-runtime",
        default=None,
        help="revoke a run past its --max-runtime (Celery terminates its pool process; the"
        " run ends failed)",
    ),
    click.option(
        "--late-after",
        callback=_parse_monitor_seconds,
        help="open a late incident when a run starts this long after it was due: seconds"
        " or with units, or none",
    ),
    click.option(
        "--missed-after",
        callback=_parse_monitor_seconds,
        help="open a missed incident when a fire time is not sent this long after it:"
        " seconds or with units, or none",
    ),
    click.option(
        "--channels",
        callback=_parse_names,
        help="tell its incidents to these channels only: names separated by commas (see"
        " `schedules channels list`), or all (every channel, the default)",
    ),
    click.option(
        "--overlap-policy",
        type=click.Choice([policy.value for policy in OverlapPolicy]),
        help="while the previous run is active (default allow)",
    ),
    click.option(
        "--allow-unregistered",
        is_flag=True,
        help="accept a task this app does not know, or arguments its signature does not take"
        " (workers that run other code)",
    ),
)


def _definition_options(function: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_DEFINITION_OPTIONS):
        function = option(function)
    return function
