"""``celery -A proj schedules ...``: operate the scheduler without opening psql.

Commands: add, update, show, list, pause, resume, remove, trigger, runs,
leader, sync, migrate, prune, health, and ui (serves the schedules UI, ``beat.ui``).
Each but ui takes ``--json`` for scripts (one JSON document on stdout; for commands
that change something, an object describing the result). Human output is an
aligned table.

Each command parses its options, calls one method of :class:`beat.ops.schedules.Schedules`
and renders what it returns with :mod:`beat.ops.rendering`: no SQL and no Redis here.

Exit codes: 0 ok, 2 bad input (nothing written), 1 failure (e.g. a database
that cannot be reached, or ``health`` finding a problem). Each error is one
line on stderr that says what to do.

All output goes through ``_say`` (one line) or ``_show`` (a rendered text, a JSON
document): whatever a row, a task's result or an argument holds reaches the terminal
escaped, never as an escape sequence it would run.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import IO, Any, NoReturn

import click
from celery.bin.base import CeleryCommand

# Celery imports this module in every ``celery`` command (it is the ``schedules``
# entry point), which is how a worker gets run tracking without a setting.
from beat import worker  # noqa: F401
from beat.errors import (
    ConfigError,
    HABeatError,
    InvalidSchedule,
    ScheduleExists,
    ScheduleNotFound,
)
from beat.models import MisfirePolicy, Origin, OverlapPolicy, RunState
from beat.ops import rendering
from beat.ops.schedules import MAX_BACKFILL_RUNS, Schedules
from beat.ops.user_input import (
    duration_seconds,
    is_duration,
    parse_duration,
    parse_time,
    with_wall_times_read,
)
from beat.schedule import code as code_schedules
from beat.schedule import timing  # noqa: F401
from beat.store.db import masked_url

#: Errors that mean "your input is wrong" (exit 2); every other error exits 1.
INPUT_ERRORS = (InvalidSchedule, ScheduleExists, ScheduleNotFound, ConfigError)
#: Most runs ``runs`` lists at once: what one call reads and prints stays small.
MAX_LISTED_RUNS = 10_000

_MISFIRE_POLICIES = [policy.value for policy in MisfirePolicy]


# -- output: what reaches the terminal --------------------------------------------------


def _say(line: str, *, err: bool = False) -> None:
    """Print one line: whatever it quotes (a name, an error from a worker or a driver)
    is escaped, line breaks too, so it stays one line and runs nothing on the terminal."""
    click.echo(rendering.printable(line), err=err)


def _show(text: str) -> None:
    """Print text of several lines made by :mod:`beat.ops.rendering` (or a JSON document):
    its lines kept, any character a terminal acts on escaped."""
    click.echo(rendering.terminal_text(text))


def _fail(message: str, code: int) -> NoReturn:
    _say(f"Error: {message}", err=True)
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
    """The schedules of the app; refuses (exit 1) a database whose schema is not current.

    The store's connections are closed when the command ends.
    """
    with _errors_as_exit_codes():
        manager = Schedules.for_app(ctx.obj.app)
        ctx.call_on_close(manager.close)
        if check_schema:
            manager.check_schema()
        return manager


def _echo_json(document: Any) -> None:
    _show(json.dumps(document, indent=2))


# -- option parsing -------------------------------------------------------------------


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


# -- the command group ------------------------------------------------------------------


class OneLineUsageError(click.ClickException):
    """A usage error printed as the one ``Error:`` line docs/reference/cli.md promises (click's own
    takes four: usage, a hint, a blank line, the error)."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"Error: {rendering.printable(self.format_message())}", file=file, err=True)


@contextmanager
def _usage_errors_on_one_line() -> Iterator[None]:
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise  # `schedules` alone: the help is what was asked for
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "schedules"
        raise OneLineUsageError(f"{exc.format_message()} (see `{where} --help`)") from None


def _check_utf8(args: list[str]) -> None:
    """Refuse an argument that is not UTF-8 (Python reads each byte it cannot decode as a
    lone surrogate, which no database, page or terminal can take). Its place is named,
    not its text: it may be a password."""
    for place, arg in enumerate(args, start=1):
        if not _is_utf8(arg):
            raise OneLineUsageError(
                f"argument {place} of `schedules` is not UTF-8 text (a byte the locale"
                " could not read): give it in UTF-8"
            )


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class SchedulesGroup(click.Group):
    """The ``schedules`` group: its usage errors, and those of every sub-command (their
    arguments are parsed while the group is invoked), are one line with exit code 2;
    an argument that is not UTF-8 is one of them."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        _check_utf8(args)
        with _usage_errors_on_one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _usage_errors_on_one_line():
            return super().invoke(ctx)


@click.group(cls=SchedulesGroup)
@click.pass_context
def schedules(ctx: click.Context) -> None:
    """Operate the highly-available beat: schedules (in PostgreSQL), runs, leader, health."""


def _command(**kwargs: Any) -> Callable[[Callable[..., Any]], click.Command]:
    return schedules.command(cls=CeleryCommand, **kwargs)


@_command()
@_json_option
@click.pass_context
def migrate(ctx: click.Context, as_json: bool) -> None:
    """Create or upgrade the scheduler's tables (safe to run any time, from several places)."""
    manager = _schedules(ctx, check_schema=False)
    with _errors_as_exit_codes():
        revision = manager.migrate()
    if as_json:
        _echo_json({"revision": revision, "database": manager.database_url})
        return
    _say(f"schema is at revision {revision} ({manager.database_url})")


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


@_command()
@click.argument("name")
@click.argument("task")
@_definition_options
@click.option(
    "--misfire-policy",
    type=click.Choice(_MISFIRE_POLICIES),
    help="when fire times were missed (default: HABEAT_MISFIRE_POLICY, fire_once)",
)
@click.option("--max-attempts", type=click.IntRange(min=1), default=3)
@click.option("--paused", is_flag=True, help="create it paused")
@_json_option
@click.pass_context
def add(ctx: click.Context, /, name: str, task: str, as_json: bool, **options: Any) -> None:
    """Add schedule NAME that runs TASK (give one of --cron, --every, --at)."""
    manager = _schedules(ctx)
    fields = {key: value for key, value in options.items() if value is not None}
    fields["enabled"] = not fields.pop("paused", False)
    allow = fields.pop("allow_unregistered", False)
    with _errors_as_exit_codes():
        fields = with_wall_times_read(fields, lambda: fields.get("tz") or manager.default_tz)
        created = manager.create(name, task, allow_unregistered=allow, **fields)
    if as_json:
        _echo_json(rendering.schedule_document(created))
        return
    _say(f"added {created.name}: next fire {rendering.time_text(created.next_fire_at)}")


@_command()
@click.argument("name")
@click.option("--task", help="run this task instead")
@_definition_options
@click.option("--misfire-policy", type=click.Choice(_MISFIRE_POLICIES))
@click.option("--max-attempts", type=click.IntRange(min=1))
@_json_option
@click.pass_context
def update(ctx: click.Context, /, name: str, as_json: bool, **options: Any) -> None:
    """Change schedule NAME: only the options given change; new timing recomputes the next fire."""
    allow = options.pop("allow_unregistered")
    allow_past = options.pop("allow_past")
    changes = {key: value for key, value in options.items() if value is not None}
    if not changes:
        _fail("nothing to change: give at least one option, e.g. --cron '0 * * * *'", 2)
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        changes = with_wall_times_read(
            changes, lambda: changes.get("tz") or manager.get(name).definition.timezone
        )
        updated = manager.update(name, allow_unregistered=allow, allow_past=allow_past, **changes)
    if as_json:
        _echo_json(rendering.schedule_document(updated))
        return
    _say(f"updated {updated.name}: next fire {rendering.time_text(updated.next_fire_at)}")


@_command()
@click.argument("name")
@_json_option
@click.pass_context
def show(ctx: click.Context, name: str, as_json: bool) -> None:
    """Show schedule NAME: its definition, next fire times and latest runs."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        details = manager.details(name)
    if as_json:
        _echo_json(rendering.details_document(details))
        return
    _show(rendering.details_text(details))


@_command(name="list")
@_json_option
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """List all schedules, with their next fire time and the state of their latest run."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        found = manager.summaries()
    if as_json:
        _echo_json(rendering.summaries_document(found))
        return
    _show(rendering.summaries_table(found))


@_command()
@click.argument("name")
@_json_option
@click.pass_context
def pause(ctx: click.Context, name: str, as_json: bool) -> None:
    """Stop firing schedule NAME (fire times while paused are not made up on resume)."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        paused = manager.pause(name)
    if as_json:
        _echo_json(rendering.schedule_document(paused))
        return
    _say(f"paused {paused.name}")


@_command()
@click.argument("name")
@_json_option
@click.pass_context
def resume(ctx: click.Context, name: str, as_json: bool) -> None:
    """Fire schedule NAME again, from its next fire time after now."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        resumed = manager.resume(name)
    if as_json:
        _echo_json(rendering.schedule_document(resumed))
        return
    _say(f"resumed {resumed.name}: next fire {rendering.time_text(resumed.next_fire_at)}")


@_command()
@click.argument("name")
@_json_option
@click.pass_context
def remove(ctx: click.Context, name: str, as_json: bool) -> None:
    """Remove schedule NAME (its run history is kept)."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        manager.delete(name)
    if as_json:
        _echo_json({"removed": name})
        return
    _say(f"removed {name}")


@_command()
@click.argument("name")
@_json_option
@click.pass_context
def trigger(ctx: click.Context, name: str, as_json: bool) -> None:
    """Run schedule NAME once, now (even if paused); prints the run ID (= Celery task ID).

    The leader publishes the run at its next tick; the schedule's next fire time is unchanged.
    """
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        run = manager.trigger_run(name)
    if as_json:
        _echo_json(rendering.run_document(run))
        return
    _say(f"triggered {name}: run {run.id} (the leader publishes it at its next tick)")


@_command()
@click.argument("name")
@click.option(
    "--from", "start", required=True, callback=_parse_aware_time, help="ISO 8601 with offset"
)
@click.option("--to", "end", required=True, callback=_parse_aware_time, help="ISO 8601 with offset")
@_limit_option(100, MAX_BACKFILL_RUNS, "most runs to create; a window with more is refused")
@_json_option
@click.pass_context
def backfill(
    ctx: click.Context, name: str, start: datetime, end: datetime, limit: int, as_json: bool
) -> None:
    """Create runs of NAME for its fire times between --from and --to (missing ones only)."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        created = manager.backfill(name, start=start, end=end, limit=limit)
    if as_json:
        _echo_json(rendering.runs_document(created))
        return
    _say(f"backfilled {name}: {len(created)} runs queued")


@_command()
@click.argument("name", required=False)
@click.option("--state", type=click.Choice([state.value for state in RunState]))
@click.option(
    "--since",
    callback=_parse_since,
    help="only runs since: a duration back from now (2h, 30m, 7d) or an ISO 8601 time (UTC)",
)
@_limit_option(20, MAX_LISTED_RUNS, "most runs to list; narrow with --since for more")
@_json_option
@click.pass_context
def runs(
    ctx: click.Context,
    name: str | None,
    state: str | None,
    since: datetime | timedelta | None,
    limit: int,
    as_json: bool,
) -> None:
    """Run history, newest first: of schedule NAME, or of all (also of removed schedules)."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        found = manager.runs(
            name, state=None if state is None else RunState(state), since=since, limit=limit
        )
    if as_json:
        _echo_json(rendering.runs_document(found))
        return
    if not found:
        _say("no runs match")
        return
    _show(rendering.runs_table(found))


@_command()
@_json_option
@click.pass_context
def leader(ctx: click.Context, as_json: bool) -> None:
    """Which process leads: holder, epoch and since when (PostgreSQL), lease expiry (Redis)."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        status = manager.cluster_status()
    if as_json:
        _echo_json(rendering.leader_document(status))
        return
    _show(rendering.leader_text(status))


@_command()
@click.option(
    "--prune",
    is_flag=True,
    help="remove the code schedules the code no longer defines, even most of them",
)
@_json_option
@click.pass_context
def sync(ctx: click.Context, prune: bool, as_json: bool) -> None:
    """Push the schedules defined in code (beat_schedule, @periodic, add_periodic_task) to
    PostgreSQL now, reading the app as celery beat does.

    Beat does the same when it starts. Unchanged ones keep their runtime state
    (a pause survives); code schedules no longer in code are removed, but when that
    is more than half of them only with --prune (exit 2 and nothing written without).
    """
    app = ctx.obj.app
    try:
        code_schedules.load_as_beat_does(app)
    except ImportError as exc:
        _fail(f"cannot import the task modules ({exc}): fix the module or HABEAT_IMPORTS", 1)
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        definitions = code_schedules.collect(
            app, default_tz=manager.default_tz, defaults=manager.defaults
        )
        stored = [s.name for s in manager.list() if s.definition.origin is Origin.CODE]
        refusal = code_schedules.prune_refusal(stored, (d.name for d, _ in definitions))
        if refusal is not None and not prune:
            raise ConfigError(refusal)
        report = manager.sync_code(definitions)
    if as_json:
        _echo_json(rendering.sync_document(report))
        return
    _show(rendering.sync_text(len(definitions), report))
    for conflict in rendering.sync_conflicts(report):
        _say(f"Warning: {conflict}", err=True)
    for warning in code_schedules.task_warnings(app, definitions):
        _say(f"Warning: {warning}", err=True)


@_command()
@click.option(
    "--older-than",
    required=True,
    callback=_parse_duration,
    help="age of finished runs to delete, e.g. 30d, 12h, 1h30m",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1, max=100_000),
    default=1000,
    show_default=True,
    help="rows deleted per transaction",
)
@_json_option
@click.pass_context
def prune(ctx: click.Context, older_than: timedelta, batch: int, as_json: bool) -> None:
    """Delete finished runs (succeeded, failed, lost, skipped, cancelled, expired) past a cutoff.

    Age counts from finished_at (from claimed_at where that is missing). Runs still
    pending, queued, running or retrying are never deleted. Deletes --batch rows per
    transaction, so the run table is never locked for long.
    """
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        report = manager.prune(older_than, batch=batch)
    if as_json:
        _echo_json(rendering.prune_document(report))
        return
    _show(rendering.prune_text(report, batch))


@_command()
@_json_option
@click.pass_context
def health(ctx: click.Context, as_json: bool) -> None:
    """Exit 0 if PostgreSQL answers, the schema is current, Redis answers, a leader
    holds a valid lease and no schedule is quarantined; else exit 1 with one line per
    failing check."""
    manager = _schedules(ctx, check_schema=False)
    with _errors_as_exit_codes():
        report = manager.health()
    if as_json:
        _echo_json(rendering.health_document(report))
    else:
        for ok, line in rendering.health_lines(report):
            _say(line, err=not ok)
    if not report.ok:
        sys.exit(1)


@_command()
@click.option(
    "--address",
    default="127.0.0.1",
    envvar="HABEAT_UI_ADDRESS",
    show_default=True,
    help="address to listen on; other than loopback needs --basic-auth",
)
@click.option(
    "--port",
    type=click.IntRange(min=1, max=65535),
    default=5556,
    envvar="HABEAT_UI_PORT",
    show_default=True,
    help="port to listen on (Flower's is 5555)",
)
@click.option(
    "--basic-auth",
    envvar="HABEAT_UI_BASIC_AUTH",
    help="user:password pairs separated by commas, as Flower's (HABEAT_UI_BASIC_AUTH)",
)
@click.option(
    "--read-only",
    is_flag=True,
    envvar="HABEAT_UI_READ_ONLY",
    help="show everything, change nothing",
)
@click.option(
    "--flower-url",
    envvar="HABEAT_UI_FLOWER_URL",
    help="Flower's address, e.g. http://localhost:5555: each run links to its task page",
)
@click.pass_context
def ui(
    ctx: click.Context,
    address: str,
    port: int,
    basic_auth: str | None,
    read_only: bool,
    flower_url: str | None,
) -> None:
    """Serve the schedules UI: schedules, runs, the cluster and plots, in a browser."""
    from beat.ui.security import check_exposure
    from beat.ui.server import UISettings, registered_tasks, serve

    with _errors_as_exit_codes():
        users = _users(basic_auth)
        check_exposure(address, users)  # before connecting: nothing is served on a bad setup
        _check_flower_url(flower_url)
    manager = _schedules(ctx)
    settings = UISettings(
        address=address, port=port, users=users, read_only=read_only, flower_url=flower_url
    )
    try:
        serve(
            manager,
            settings,
            task_names=registered_tasks(ctx.obj.app),
            ready=lambda line: _say(line, err=True),
        )
    except OSError as exc:
        _fail(f"cannot listen on {address}:{port} ({exc.strerror}): choose another --port", 1)


def _users(basic_auth: str | None) -> dict[str, str]:
    """The users of ``--basic-auth``; a malformed value is refused without a word of it:
    whatever part of it is quoted may be a password."""
    from beat.ui.security import parse_users

    try:
        return parse_users(basic_auth)
    except ConfigError:
        raise ConfigError(
            "--basic-auth (HABEAT_UI_BASIC_AUTH) takes user:password pairs separated by"
            " commas, each with a user and a password (the value is not shown: it holds"
            " passwords): give e.g. admin:s3cret"
        ) from None


def _check_flower_url(url: str | None) -> None:
    if url is not None and not re.match(r"^https?://[^\s/]+", url):
        raise ConfigError(
            f"--flower-url {masked_url(url)!r:.80} is not an http(s) address:"
            " give e.g. http://localhost:5555"
        )
