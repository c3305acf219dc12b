"""The commands about runs: trigger one now, backfill a past window, list the run
history, prune old runs."""

from __future__ import annotations

from datetime import datetime, timedelta

import click

from beat.cli.group import _command, _schedules
from beat.cli.options import (
    _json_option,
    _limit_option,
    _parse_aware_time,
    _parse_duration,
    _since_option,
)
from beat.cli.output import _echo_json, _errors_as_exit_codes, _say, _show
from beat.models import RunState
from beat.ops import rendering
from beat.ops.schedules import MAX_BACKFILL_RUNS
from beat.ops.workflow_rendering import is_workflow, steps_document, steps_table, workflow_label

#: Most runs ``runs`` lists at once: what one call reads and prints stays small.
MAX_LISTED_RUNS = 10_000


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
@_since_option("runs")
@_limit_option(20, MAX_LISTED_RUNS, "most runs to list; narrow with --since for more")
@click.option("--steps", is_flag=True, help="with each workflow run, its steps as a tree")
@_json_option
@click.pass_context
def runs(
    ctx: click.Context,
    name: str | None,
    state: str | None,
    since: datetime | timedelta | None,
    limit: int,
    steps: bool,
    as_json: bool,
) -> None:
    """Run history, newest first: of schedule NAME, or of all (also of removed schedules)."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        found = manager.runs(
            name, state=None if state is None else RunState(state), since=since, limit=limit
        )
        workflows = [run for run in found if steps and is_workflow(run)]
        tree = {run.id: manager.steps(run.id) for run in workflows}
    if as_json:
        documents = rendering.runs_document(found)
        for document, run in zip(documents, found, strict=True):
            if run.id in tree:
                document["steps"] = steps_document(run, tree[run.id])
        _echo_json(documents)
        return
    if not found:
        _say("no runs match")
        return
    _show(rendering.runs_table(found))
    for run in workflows:
        _say("")
        _say(f"run {run.id} ({run.state.value}): {workflow_label(run)}")
        _show(steps_table(run, tree[run.id]))


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
    transaction, so the run table is never locked for long. The incidents resolved and
    the notifications sent or given up before the cutoff go too; never an open incident,
    a notification not sent yet, nor the incident of one. Prints the runs deleted.
    """
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        report = manager.prune(older_than, batch=batch)
    if as_json:
        _echo_json(rendering.prune_document(report))
        return
    _show(rendering.prune_text(report, batch))
