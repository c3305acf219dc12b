"""Moving in and out: ``import`` reads the schedules of django-celery-beat, RedBeat or
celery beat (with their last runs) into this scheduler; ``export`` writes this
scheduler's schedules back out as a ``beat_schedule``, for a rollback."""

from __future__ import annotations

import sys

import click

from beat.cli.group import _command, _schedules
from beat.cli.options import _json_option
from beat.cli.output import _echo_json, _errors_as_exit_codes, _fail, _say, _show
from beat.ops.exporting import ExportFormat, export_beat_schedule, export_json, export_python
from beat.ops.import_rendering import import_document, import_text, stop_reasons
from beat.ops.importing import OnConflict
from beat.schedule import code as code_schedules
from beat.sources.celery_beat import CeleryBeat
from beat.sources.django_celery_beat import DjangoCeleryBeat
from beat.sources.records import ScheduleSource
from beat.sources.redbeat import DEFAULT_KEY_PREFIX, RedBeat

#: The sources, by the name the command takes, with the option each needs.
_SOURCES = {
    "django-celery-beat": "--database-url",
    "redbeat": "--redis-url",
    "celery-beat": "--schedule-file",
}


@_command(name="import")
@click.argument("source", type=click.Choice(list(_SOURCES)))
@click.option(
    "--database-url",
    help="django-celery-beat: the Django project's database (postgresql://user@host/db)",
)
@click.option("--redis-url", help="redbeat: RedBeat's Redis (its redbeat_redis_url)")
@click.option(
    "--key-prefix",
    default=DEFAULT_KEY_PREFIX,
    show_default=True,
    help="redbeat: RedBeat's redbeat_key_prefix",
)
@click.option(
    "--schedule-file",
    help="celery-beat: the file celery beat kept its last runs in (celerybeat-schedule)",
)
@click.option("--dry-run", is_flag=True, help="show what would be done; write nothing")
@click.option(
    "--only", multiple=True, metavar="NAME", help="import only this schedule (repeatable)"
)
@click.option("--prefix", default="", help="put this before every imported name")
@click.option(
    "--on-conflict",
    type=click.Choice([choice.value for choice in OnConflict]),
    default=OnConflict.FAIL.value,
    show_default=True,
    help="a schedule of the same name that this import did not make: keep it (skip),"
    " write over it (update), or stop (fail)",
)
@click.option(
    "--skip-invalid",
    is_flag=True,
    help="leave out the rows that cannot be carried over (each listed with its reason)"
    " rather than import nothing",
)
@_json_option
@click.pass_context
def import_(
    ctx: click.Context,
    /,
    source: str,
    database_url: str | None,
    redis_url: str | None,
    key_prefix: str,
    schedule_file: str | None,
    dry_run: bool,
    only: tuple[str, ...],
    prefix: str,
    on_conflict: str,
    skip_invalid: bool,
    as_json: bool,
) -> None:
    """Import the schedules of SOURCE (django-celery-beat, redbeat or celery-beat) with
    their last runs and run counts, so that none fires again nor is skipped.

    Stop the old beat first. All or nothing, in one transaction: a row that cannot be
    carried over, or a name already taken, stops it (exit 2) unless --skip-invalid or
    --on-conflict say otherwise. Importing again changes nothing.
    """
    location = {
        "django-celery-beat": database_url,
        "redbeat": redis_url,
        "celery-beat": schedule_file,
    }[source]
    if location is None:
        raise click.UsageError(f"{source} needs {_SOURCES[source]}")
    if source == "celery-beat" and prefix:
        raise click.UsageError(
            "celery-beat keeps the beat_schedule names (beat's sync finds them by name):"
            " leave --prefix out"
        )
    reader = _reader(source, location, key_prefix)
    try:
        # The app's beat_schedule as beat reads it: its entries stay schedules in code.
        code_schedules.load_as_beat_does(ctx.obj.app)
    except ImportError as exc:
        _fail(f"cannot import the task modules ({exc}): fix the module or HABEAT_IMPORTS", 1)
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        report = manager.import_schedules(
            reader,
            dry_run=dry_run,
            only=only,
            prefix=prefix,
            on_conflict=OnConflict(on_conflict),
            skip_invalid=skip_invalid,
        )
    if as_json:
        _echo_json(import_document(report))
    else:
        _show(import_text(report))
    if report.stopped:
        for reason in stop_reasons(report):
            _say(f"Error: {reason}", err=True)
        sys.exit(2)


def _reader(source: str, location: str, key_prefix: str) -> ScheduleSource:
    if source == "django-celery-beat":
        return DjangoCeleryBeat(location)
    if source == "redbeat":
        return RedBeat(location, key_prefix)
    return CeleryBeat(location)


@_command()
@click.option(
    "--format",
    "format_",
    type=click.Choice([choice.value for choice in ExportFormat]),
    default=ExportFormat.PYTHON.value,
    show_default=True,
    help="a Python module defining beat_schedule, or JSON",
)
@click.option("--only", multiple=True, metavar="NAME", help="export only this schedule")
@click.pass_context
def export(ctx: click.Context, format_: str, only: tuple[str, ...]) -> None:
    """Write the schedules out as Celery's beat_schedule, for a rollback to celery beat
    (what it cannot express is left out, each with the reason)."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        found = [schedule for schedule in manager.list() if not only or schedule.name in only]
        zone = code_schedules.app_zone(ctx.obj.app, manager.default_tz)
    missing = sorted(set(only) - {schedule.name for schedule in found})
    if missing:
        _fail(f"--only {missing[0]!r}: no schedule of that name (`schedules list` shows them)", 2)
    exported = export_beat_schedule(found, zone)
    _show(export_json(exported) if format_ == ExportFormat.JSON else export_python(exported))
