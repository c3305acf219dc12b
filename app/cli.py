"""``celery -A app schedules ...``: manage schedules without opening psql.

Exit codes: 0 ok, 2 bad input (nothing written), 1 failure (e.g. a database
that cannot be reached). Each error is one line that says what to do.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NoReturn

import click
from celery.bin.base import CeleryCommand

from beat.api import Schedules
from beat.errors import ConfigError, HABeatError, InvalidSchedule, ScheduleExists, ScheduleNotFound
from beat.models import Schedule
from beat.timing import Cron, Every, Once

#: Errors that mean "your input is wrong" (exit 2); every other error exits 1.
INPUT_ERRORS = (InvalidSchedule, ScheduleExists, ScheduleNotFound, ConfigError)


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


@contextmanager
def _errors_as_exit_codes() -> Iterator[None]:
    try:
        yield
    except INPUT_ERRORS as exc:
        _fail(str(exc), 2)
    except HABeatError as exc:
        _fail(str(exc), 1)


def _schedules(ctx: click.Context, *, check_schema: bool = True) -> Schedules:
    """The schedules of the app; refuses (exit 1) a database whose schema is not current."""
    with _errors_as_exit_codes():
        manager = Schedules.for_app(ctx.obj.app)
        if check_schema:
            manager.store.check_schema()
        return manager


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
        if not isinstance(parsed, kind):
            raise click.BadParameter(f"must be {what}, got {type(parsed).__name__}")
        return parsed

    return parse


def _parse_at(_ctx: click.Context, _param: click.Parameter, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO 8601 time such as 2027-01-31T09:00:00+01:00"
        ) from None
    if moment.utcoffset() is None:
        raise click.BadParameter(f"{value!r} has no UTC offset: add one, e.g. {value}+00:00")
    return moment


@click.group(cls=click.Group)
@click.pass_context
def schedules(ctx: click.Context) -> None:
    """Manage the highly-available beat's schedules (stored in PostgreSQL)."""


def _command(**kwargs: Any) -> Callable[[Callable[..., Any]], click.Command]:
    return schedules.command(cls=CeleryCommand, **kwargs)


@_command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Create or upgrade the scheduler's tables (safe to run any time, from several places)."""
    manager = _schedules(ctx, check_schema=False)
    with _errors_as_exit_codes():
        revision = manager.store.migrate()
    click.echo(f"schema is at revision {revision} ({manager.store.url})")


@_command()
@click.argument("name")
@click.argument("task")
@click.option("--cron", help="cron expression: 5 fields, or 6 with seconds first")
@click.option("--every", type=float, help="interval in seconds (>= 1)")
@click.option("--at", "at", callback=_parse_at, help="one-off time, ISO 8601 with offset")
@click.option("--tz", help="IANA time zone of the cron fields, e.g. Europe/Berlin")
@click.option("--args", "args", callback=_json_argument(list, "a JSON array"), help="JSON array")
@click.option(
    "--kwargs", "kwargs", callback=_json_argument(dict, "a JSON object"), help="JSON object"
)
@click.option("--queue", help="queue to publish to")
@click.option(
    "--misfire-policy", type=click.Choice(["fire_once", "fire_all", "skip"]), default="fire_once"
)
@click.option("--max-attempts", type=click.IntRange(min=1), default=3)
@click.option("--paused", is_flag=True, help="create it paused")
@click.option(
    "--allow-unregistered", is_flag=True, help="accept a task name this app does not know"
)
@click.pass_context
def add(ctx: click.Context, /, name: str, task: str, **options: Any) -> None:
    """Add schedule NAME that runs TASK (give one of --cron, --every, --at)."""
    manager = _schedules(ctx)
    fields = {key: value for key, value in options.items() if value is not None}
    fields["enabled"] = not fields.pop("paused", False)
    allow = fields.pop("allow_unregistered", False)
    with _errors_as_exit_codes():
        created = manager.create(name, task, allow_unregistered=allow, **fields)
    click.echo(f"added {created.name}: next fire {_time(created.next_fire_at)}")


@_command(name="list")
@click.option("--json", "as_json", is_flag=True, help="one JSON document, for scripts")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """List all schedules."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        found = manager.list()
    if as_json:
        click.echo(json.dumps([schedule_document(s) for s in found], indent=2))
        return
    rows = [
        (
            s.name,
            s.definition.task,
            spec_text(s),
            s.definition.timezone,
            "yes" if s.definition.enabled else "paused",
            _time(s.next_fire_at),
        )
        for s in found
    ]
    click.echo(_table(("NAME", "TASK", "SCHEDULE", "ZONE", "ENABLED", "NEXT FIRE (UTC)"), rows))


@_command()
@click.argument("name")
@click.pass_context
def remove(ctx: click.Context, name: str) -> None:
    """Remove schedule NAME (its run history is kept)."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        manager.delete(name)
    click.echo(f"removed {name}")


def spec_text(schedule: Schedule) -> str:
    trigger = schedule.definition.trigger
    if isinstance(trigger, Cron):
        return f"cron {trigger.expression}"
    if isinstance(trigger, Every):
        return f"every {trigger.seconds:g}s"
    assert isinstance(trigger, Once)
    return f"at {trigger.at.isoformat()}"


def schedule_document(schedule: Schedule) -> dict[str, Any]:
    definition = schedule.definition
    return {
        "name": definition.name,
        "task": definition.task,
        "schedule": spec_text(schedule),
        "timezone": definition.timezone,
        "args": list(definition.args),
        "kwargs": definition.kwargs,
        "options": definition.options,
        "enabled": definition.enabled,
        "origin": definition.origin.value,
        "misfire_policy": definition.misfire_policy.value,
        "max_attempts": definition.max_attempts,
        "next_fire_at": _iso(schedule.next_fire_at),
        "last_fire_at": _iso(schedule.last_fire_at),
    }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _time(moment: datetime | None) -> str:
    return "finished" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=False)]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]
    return "\n".join(lines)
