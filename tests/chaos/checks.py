"""The verdict of a chaos run, from PostgreSQL alone.

The expected fire times come from the project's own schedule math
(``beat.timing.fire_times``) applied to each schedule's trigger, from its first
fire time to the end of the checked window. Faults are shorter than the
misfire grace, so ``beat.policies`` plans every one of them as a run; a
``skipped`` row in the window is therefore a violation, not an excuse.

Then, per fire time: exactly one run; per run: a terminal state, and one
effect (a row in ``e2e_effects`` written through ``self.db``) if it succeeded,
none otherwise.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import text

from beat.store import Store
from beat.tables import RunState
from beat.timing import Trigger, fire_times

NON_TERMINAL = frozenset({RunState.PENDING, RunState.QUEUED, RunState.RUNNING, RunState.RETRYING})
#: More fire times than any run produces: fire_times() needs a bound.
FIRE_TIME_LIMIT = 1_000_000
#: Lateness is reported for these schedules (one fire time a second: the finest grain).
SECOND_KIND = "every 1 s"
ONE_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, kw_only=True, slots=True)
class Expectation:
    """A schedule of the workload and what its fire times must produce."""

    name: str
    kind: str
    trigger: Trigger
    zone: ZoneInfo
    first_fire: datetime

    def fire_times(self, until: datetime) -> list[datetime]:
        """Every fire time from the first up to ``until`` (inclusive)."""
        return fire_times(
            self.trigger,
            self.zone,
            after=self.first_fire - ONE_MICROSECOND,
            until=until,
            limit=FIRE_TIME_LIMIT,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerKill:
    killed_at: datetime
    worker: str
    #: Runs the worker held a lease on when it was killed.
    held: tuple[uuid.UUID, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaderPause:
    epoch: int
    stopped_at: datetime
    resumed_at: datetime
    #: A newer epoch was recorded while the leader was stopped (the fencing case).
    taken_over: bool


@dataclass(kw_only=True)
class Verdict:
    expected: int = 0
    seen: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    states: Counter[str] = field(default_factory=Counter)
    max_claim_gap: float = 0.0
    max_claim_gap_from: datetime | None = None
    max_lateness: float = 0.0
    p99_lateness: float = 0.0
    reclaim_times: list[float] = field(default_factory=list)
    restarted_runs: int = 0
    duplicate_deliveries: int = 0
    #: Runs written by a paused leader after it was replaced (counted in ``duplicated`` too).
    stale_writes: int = 0

    @property
    def violations(self) -> list[str]:
        return [
            *(f"lost: {item}" for item in self.lost),
            *(f"duplicated: {item}" for item in self.duplicated),
            *(f"stuck: {item}" for item in self.stuck),
            *(f"unexpected: {item}" for item in self.unexpected),
        ]


def judge(
    store: Store,
    expectations: Sequence[Expectation],
    *,
    window_end: datetime,
    kills: Iterable[WorkerKill],
    pauses: Iterable[LeaderPause],
) -> Verdict:
    """Check every guarantee for fire times up to ``window_end``; measure gaps and reclaims."""
    # Runs of other schedules (the project's demo jobs, synced from code at beat
    # start and paused by the harness) are not part of the workload.
    known = {expectation.name for expectation in expectations}
    rows = [row for row in _run_rows(store) if row.schedule_name in known]
    effects = _effects(store)
    verdict = Verdict()
    _check_fire_times(verdict, rows, expectations, window_end)
    _check_runs(verdict, rows, effects)
    _check_fencing(verdict, rows, pauses)
    verdict.max_claim_gap, verdict.max_claim_gap_from = _max_claim_gap(
        rows, expectations, window_end
    )
    verdict.max_lateness, verdict.p99_lateness = _lateness(rows, expectations, window_end)
    verdict.reclaim_times = _reclaim_times(rows, kills)
    verdict.restarted_runs = sum(1 for row in rows if row.attempt > 1)
    verdict.duplicate_deliveries = sum(row.duplicate_deliveries for row in rows)
    return verdict


def _run_rows(store: Store) -> list[Any]:
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT id, schedule_name, fire_at, state, reason, error, epoch, attempt,"
                    " duplicate_deliveries, claimed_at, published_at, finished_at, worker"
                    " FROM beat_runs ORDER BY schedule_name, fire_at"
                )
            )
        )


def _effects(store: Store) -> Counter[str]:
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT task_id, count(*) FROM e2e_effects GROUP BY task_id"))
        return Counter({row[0]: row[1] for row in rows})


def _check_fire_times(
    verdict: Verdict, rows: list[Any], expectations: Sequence[Expectation], window_end: datetime
) -> None:
    by_fire: dict[tuple[str, datetime], list[Any]] = defaultdict(list)
    for row in rows:
        by_fire[(row.schedule_name, row.fire_at)].append(row)
    for expectation in expectations:
        expected = expectation.fire_times(window_end)
        verdict.expected += len(expected)
        for fire_at in expected:
            found = by_fire.pop((expectation.name, fire_at), [])
            where = f"{expectation.name} at {fire_at:%H:%M:%S.%f}"
            if not found:
                verdict.lost.append(f"{where}: no run")
                continue
            verdict.seen += 1
            if len(found) > 1:
                verdict.duplicated.append(f"{where}: {len(found)} runs")
            if found[0].state == RunState.SKIPPED:
                verdict.unexpected.append(f"{where}: skipped ({found[0].reason})")
    for (name, fire_at), extra in by_fire.items():
        if fire_at is not None and fire_at <= window_end:
            verdict.unexpected.append(f"{name}: {len(extra)} runs at {fire_at}, no fire time")


def _check_runs(verdict: Verdict, rows: list[Any], effects: Counter[str]) -> None:
    run_ids = set()
    for row in rows:
        run_id = str(row.id)
        run_ids.add(run_id)
        verdict.states[row.state] += 1
        where = f"run {run_id} ({row.schedule_name} at {row.fire_at:%H:%M:%S.%f})"
        count = effects.get(run_id, 0)
        if row.state in NON_TERMINAL:
            verdict.stuck.append(f"{where} is still {row.state} (attempt {row.attempt})")
        elif row.state == RunState.SUCCEEDED and count == 0:
            verdict.lost.append(f"{where} succeeded without its effect")
        elif row.state in {RunState.LOST, RunState.FAILED, RunState.CANCELLED}:
            verdict.lost.append(f"{where} ended {row.state}: {row.error or row.reason}")
        if count > 1:
            verdict.duplicated.append(f"{where}: its effect happened {count} times")
        elif count == 1 and row.state != RunState.SUCCEEDED:
            verdict.duplicated.append(f"{where}: an effect committed though it is {row.state}")
    for task_id in set(effects) - run_ids:
        verdict.duplicated.append(f"an effect of task {task_id}, which is no run")


def _check_fencing(verdict: Verdict, rows: list[Any], pauses: Iterable[LeaderPause]) -> None:
    """A leader stopped past its lease and replaced must not write a run once it wakes.

    ``claimed_at`` is the start of the writing transaction (a claim or the
    reaper, both fenced): one that started before the stop is legitimate."""
    for pause in pauses:
        if not pause.taken_over:
            continue
        late = [
            row for row in rows if row.epoch == pause.epoch and row.claimed_at > pause.stopped_at
        ]
        verdict.stale_writes += len(late)
        for row in late:
            verdict.duplicated.append(
                f"run {row.id} written with epoch {pause.epoch} at {row.claimed_at:%H:%M:%S.%f},"
                f" after that leader was stopped and replaced"
            )


def _max_claim_gap(
    rows: list[Any], expectations: Sequence[Expectation], window_end: datetime
) -> tuple[float, datetime]:
    """Longest time in the window with no run written by any leader (claims and the
    reaper's republishes): with 1-second schedules a healthy leader writes every second.
    Returns the gap in seconds and when it began (to match it with the fault log)."""
    start = min(expectation.first_fire for expectation in expectations)
    claims: set[datetime] = {r.claimed_at for r in rows if start <= r.claimed_at <= window_end}
    moments = sorted({start, window_end, *claims})
    return max(((b - a).total_seconds(), a) for a, b in pairwise(moments))


def _lateness(
    rows: list[Any], expectations: Sequence[Expectation], window_end: datetime
) -> tuple[float, float]:
    """Max and 99th percentile of (publish time - fire time) of the 1-second fire times
    (the README's LATENESS: until the run was handed to the broker).

    A republish (outbox, reaper) rewrites ``published_at``; but a schedule's fire
    times are published in order, so a fire time was first published no later than
    any later one's recorded ``published_at``: the minimum over it and the later
    ones is its first publish time (exact unless it was republished, then a bound)."""
    seconds = {e.name for e in expectations if e.kind == SECOND_KIND}
    by_schedule: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        if row.schedule_name in seconds and row.fire_at <= window_end and row.published_at:
            by_schedule[row.schedule_name].append(row)
    lateness: list[float] = []
    for schedule_rows in by_schedule.values():
        earliest_later = datetime.max.replace(tzinfo=window_end.tzinfo)
        for row in sorted(schedule_rows, key=lambda r: r.fire_at, reverse=True):
            earliest_later = min(earliest_later, row.published_at)
            lateness.append((earliest_later - row.fire_at).total_seconds())
    if not lateness:
        return 0.0, 0.0
    lateness.sort()
    return lateness[-1], lateness[int(0.99 * (len(lateness) - 1))]


def _reclaim_times(rows: list[Any], kills: Iterable[WorkerKill]) -> list[float]:
    """Seconds from a worker's SIGKILL to the completion elsewhere of each run it held."""
    by_id = {row.id: row for row in rows}
    times = []
    for kill in kills:
        for run_id in kill.held:
            row = by_id.get(run_id)
            if row is None or row.state != RunState.SUCCEEDED or row.finished_at is None:
                continue
            if row.finished_at > kill.killed_at:  # else it finished just before the kill
                times.append((row.finished_at - kill.killed_at).total_seconds())
    return times
