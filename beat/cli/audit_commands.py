"""The commands of the audit log: audit (who changed which schedule, when, from where,
and what) and restore (an earlier version made the schedule's again)."""

from __future__ import annotations

from datetime import datetime, timedelta

import click

from beat.cli.group import _command, _schedules
from beat.cli.options import _json_option, _limit_option, _since_option
from beat.cli.output import _echo_json, _errors_as_exit_codes, _say, _show
from beat.ops import audit_rendering, rendering
from beat.store.schedule_changes import MAX_CHANGES


@_command()
@click.argument("name", required=False)
@_since_option("changes")
@_limit_option(50, MAX_CHANGES, "most changes to list; narrow with --since for more")
@_json_option
@click.pass_context
def audit(
    ctx: click.Context,
    name: str | None,
    since: datetime | timedelta | None,
    limit: int,
    as_json: bool,
) -> None:
    """Changes to schedule NAME (to every schedule without it), newest first: when, by
    whom, from where, and each field before and after; removed schedules' too."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        found = manager.audit(name, since=since, limit=limit)
    if as_json:
        _echo_json([audit_rendering.change_document(change) for change in found])
        return
    _show(audit_rendering.changes_text(found))


@_command()
@click.argument("name")
@click.option(
    "--version",
    "version",
    type=click.IntRange(min=1),
    required=True,
    help="the version to bring back (`schedules audit NAME` lists them)",
)
@click.option("--allow-unregistered", is_flag=True, help="do not check that the task is known")
@_json_option
@click.pass_context
def restore(
    ctx: click.Context, name: str, version: int, allow_unregistered: bool, as_json: bool
) -> None:
    """Make an earlier version of schedule NAME its own again, as a new change (whether
    it is paused stays; a removed schedule comes back as that version was)."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        restored = manager.restore(name, version, allow_unregistered=allow_unregistered)
    if as_json:
        _echo_json(rendering.schedule_document(restored))
        return
    _say(
        f"restored {restored.name} to version {version} (now version {restored.version}):"
        f" next fire {rendering.time_text(restored.next_fire_at)}"
    )
