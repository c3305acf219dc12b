"""The commands about the cluster: migrate the schema, who leads, the health checks
and the incidents."""

from __future__ import annotations

import sys

import click

from beat.cli.group import _command, _schedules
from beat.cli.options import _json_option, _limit_option
from beat.cli.output import _echo_json, _errors_as_exit_codes, _say, _show
from beat.models import IncidentKind
from beat.ops import incident_rendering, rendering


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


#: The incident kinds ``health --fail-on-incidents`` takes (a stall always fails).
_KINDS_FAILING_HEALTH = [kind.value for kind in IncidentKind if kind is not IncidentKind.STALL]


def _incident_kinds(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> frozenset[IncidentKind]:
    if not value:
        return frozenset()
    kinds = [part.strip() for part in value.split(",")]
    unknown = next((kind for kind in kinds if kind not in _KINDS_FAILING_HEALTH), None)
    if unknown is not None:
        raise click.BadParameter(
            f"{unknown!r:.40} is not an incident kind: give some of"
            f" {', '.join(_KINDS_FAILING_HEALTH)}, separated by commas"
        )
    return frozenset(IncidentKind(kind) for kind in kinds)


@_command()
@click.option(
    "--fail-on-incidents",
    "fail_on",
    callback=_incident_kinds,
    help="also fail while an incident of these kinds is open: some of"
    f" {', '.join(_KINDS_FAILING_HEALTH)}, separated by commas (a stall, and a schedule the"
    " scheduler paused, always fail)",
)
@_json_option
@click.pass_context
def health(ctx: click.Context, fail_on: frozenset[IncidentKind], as_json: bool) -> None:
    """Exit 0 if PostgreSQL answers, the schema is current, Redis answers, a leader
    holds a valid lease, no schedule is quarantined and no critical incident is open;
    else exit 1 with one line per failing check."""
    manager = _schedules(ctx, check_schema=False)
    with _errors_as_exit_codes():
        report = manager.health(fail_on=fail_on)
    if as_json:
        _echo_json(rendering.health_document(report))
    else:
        for ok, line in rendering.health_lines(report):
            _say(line, err=not ok)
    if not report.ok:
        sys.exit(1)


@_command()
@click.option("--all", "include_resolved", is_flag=True, help="resolved incidents too")
@_limit_option(100, 10_000, "most incidents listed")
@_json_option
@click.pass_context
def incidents(ctx: click.Context, include_resolved: bool, limit: int, as_json: bool) -> None:
    """The open incidents, newest first: schedules whose runs failed so many times in a
    row (habeat_alert_after_failures, or a schedule's own --alert-after-failures), that
    overran their --max-runtime, started past their --late-after or missed their
    --missed-after; a stall of the whole cluster."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        found = manager.incidents(include_resolved=include_resolved, limit=limit)
    if as_json:
        _echo_json([incident_rendering.incident_document(incident) for incident in found])
        return
    _show(incident_rendering.incidents_text(found, include_resolved=include_resolved))
