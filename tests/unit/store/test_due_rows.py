"""A due schedule's row is read by position
(``beat.store.leader.due_rows._due_from_row``): each field must come from the column of
its name in ``_due_query``, whatever the order. The payload comes as PostgreSQL's text
of the ``jsonb`` columns."""

from __future__ import annotations

from collections import namedtuple
from datetime import UTC, datetime, timedelta
from typing import Any

from beat.models import MisfirePolicy, OverlapPolicy
from beat.schedule.timing import Cron
from beat.store.leader.due_rows import _due_from_row, _due_query


def test_each_field_comes_from_the_column_of_its_name() -> None:
    names = [column.name for column in _due_query(1).selected_columns]
    at = datetime(2030, 1, 1, tzinfo=UTC)
    values: dict[str, Any] = {
        "id": 7,
        "name": "nightly",
        "task": "tasks.report",
        "trigger_kind": "cron",
        "cron": "0 3 * * *",
        "cron_both_days": False,
        "every_seconds": None,
        "anchor_at": None,
        "run_at": None,
        "timezone": "Europe/Paris",
        "args": "[1, 2]",
        "kwargs": '{"k": "v"}',
        "options": '{"queue": "reports"}',
        "misfire_policy": MisfirePolicy.SKIP.value,
        "max_attempts": 5,
        "next_fire_at": at,
        "overlap_policy": OverlapPolicy.SKIP.value,
        "jitter_seconds": 2.5,
        "end_at": at + timedelta(days=9),
        "max_runs": 40,
        "runs_count": 3,
        "infinite_times": None,
    }
    assert sorted(names) == sorted(values), "a column was added or removed: read it too"
    Row = namedtuple("Row", names)  # type: ignore[misc]
    row = Row(*(values[name] for name in names))

    due = _due_from_row(row, {})  # type: ignore[arg-type]

    assert (due.id, due.name, due.task) == (7, "nightly", "tasks.report")
    assert due.trigger == Cron(expression="0 3 * * *")
    assert due.zone.key == "Europe/Paris"
    assert (due.args, due.kwargs, due.options) == ([1, 2], {"k": "v"}, {"queue": "reports"})
    assert due.misfire_policy is MisfirePolicy.SKIP
    assert due.overlap_policy is OverlapPolicy.SKIP
    assert (due.max_attempts, due.next_fire_at, due.jitter_seconds) == (5, at, 2.5)
    assert (due.end_at, due.max_runs, due.runs_count) == (at + timedelta(days=9), 40, 3)


def test_rows_of_one_trigger_share_it_and_other_triggers_do_not() -> None:
    names = [column.name for column in _due_query(1).selected_columns]
    Row = namedtuple("Row", names)  # type: ignore[misc]
    at = datetime(2030, 1, 1, tzinfo=UTC)

    def row(schedule_id: int, cron: str) -> Any:
        values = dict.fromkeys(names)
        values |= {
            "id": schedule_id,
            "name": f"s{schedule_id}",
            "task": "t",
            "trigger_kind": "cron",
            "cron": cron,
            "cron_both_days": False,
            "timezone": "UTC",
            "args": "[]",
            "kwargs": "{}",
            "options": "{}",
            "misfire_policy": MisfirePolicy.FIRE_ONCE.value,
            "max_attempts": 1,
            "next_fire_at": at,
            "overlap_policy": OverlapPolicy.ALLOW.value,
            "jitter_seconds": 0.0,
            "runs_count": 0,
        }
        return Row(**values)

    triggers: dict[tuple[Any, ...], Any] = {}
    first, second, other = (
        _due_from_row(row(1, "*/5 * * * *"), triggers),
        _due_from_row(row(2, "*/5 * * * *"), triggers),
        _due_from_row(row(3, "0 * * * *"), triggers),
    )
    assert first.trigger is second.trigger
    assert other.trigger == Cron(expression="0 * * * *")
    assert len(triggers) == 2
