"""The commands that define and steer schedules: add, update, show, list, pause,
resume, remove, and sync (the schedules defined in code)."""

from __future__ import annotations

from typing import Any

import click

from beat.cli.group import _command, _schedules
from beat.cli.options import (
    _MISFIRE_POLICIES,
    _definition_options,
    _json_option,
    monitors_given,
)
from beat.cli.output import _echo_json, _errors_as_exit_codes, _fail, _say, _show
from beat.errors import ConfigError
from beat.models import Origin
from beat.ops import rendering
from beat.ops.user_input import with_wall_times_read
from beat.schedule import code as code_schedules


@_command()
@click.argument("name")
@click.argument("task", required=False)
@click.option(
    "--workflow",
    help="fire this Celery canvas instead of TASK: a signature as JSON, e.g. the output of"
    " json.dumps(chain(a.s(), b.s()))",
)
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
def add(ctx: click.Context, /, name: str, task: str | None, as_json: bool, **options: Any) -> None:
    """Add schedule NAME that runs TASK, or a workflow (--workflow); give one of --cron,
    --every, --at."""
    if (task is None) == (options.get("workflow") is None):
        raise click.UsageError("give TASK, or --workflow JSON instead of it", ctx)
    manager = _schedules(ctx)
    fields = monitors_given({key: value for key, value in options.items() if value is not None})
    fields["enabled"] = not fields.pop("paused", False)
    allow = fields.pop("allow_unregistered", False)
    with _errors_as_exit_codes():
        fields = with_wall_times_read(fields, lambda: fields.get("tz") or manager.default_tz)
        created = manager.create(name, task or "", allow_unregistered=allow, **fields)
    if as_json:
        _echo_json(rendering.schedule_document(created))
        return
    _say(f"added {created.name}: next fire {rendering.time_text(created.next_fire_at)}")


@_command()
@click.argument("name")
@click.option("--task", help="run this task instead")
@click.option("--workflow", help="fire this Celery canvas (a signature as JSON) instead")
@_definition_options
@click.option("--misfire-policy", type=click.Choice(_MISFIRE_POLICIES))
@click.option("--max-attempts", type=click.IntRange(min=1))
@_json_option
@click.pass_context
def update(ctx: click.Context, /, name: str, as_json: bool, **options: Any) -> None:
    """Change schedule NAME: only the options given change; new timing recomputes the next fire."""
    allow = options.pop("allow_unregistered")
    allow_past = options.pop("allow_past")
    changes = monitors_given({key: value for key, value in options.items() if value is not None})
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
@click.option("--note", help="why: shown while it is paused, and kept in the audit log")
@_json_option
@click.pass_context
def pause(ctx: click.Context, name: str, note: str | None, as_json: bool) -> None:
    """Stop firing schedule NAME (fire times while paused are not made up on resume)."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        paused = manager.pause(name, note=note)
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
