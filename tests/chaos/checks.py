"""The verdict of a chaos run, from PostgreSQL alone.

The expected fire times come from the project's own schedule math
(``beat.schedule.timing.fire_times``) applied to each schedule's trigger, from its first
fire time to the end of the checked window. A schedule a deploy redefined has
one expectation per definition, each in force from the deploy's sync to the
next. Faults are shorter than the misfire grace, so ``beat.claim.policies`` plans
every fire time as a run; a ``skipped`` row is a violation, except for a fire
time a deploy's downtime missed, which may be recorded skipped with its reason.

Then, per fire time: exactly one run; per run: a terminal state, none
published, received or started before its fire time, and one effect (a row in
``e2e_effects``) if it succeeded, none otherwise. Runs of plain tasks (no
idempotent base) may end ``lost`` only when the plan killed the worker that
held them; runs of schedules with ``expires`` may end ``expired`` (with a
reason), and none starts after its expiry, nor ends ``expired`` before it. A
retry never starts before the countdown it asked for (``chaos_attempts``). The
harness's ad hoc chains must run every link exactly once and complete. A row
written with psql that the API would refuse (``BadRow``) must be quarantined with
its reason, and no run of it made.

A workflow schedule's run (task ``habeat.workflow``) has no effect of its own: its
steps do, each a run of its own (``workflow_run_id``, ``step``) on the idempotent
base. Every workflow run must end ``succeeded`` with each planned step of its canvas
(``beat.schedule.workflow.plan``) succeeded and its effect there exactly once; no step
may have two effects, or one without having succeeded; no workflow run or step may be
left unfinished (``_check_workflow_run``).

Every time is the database's: the columns the product writes with ``now()``,
the effects' and attempts' ``at`` (written by PostgreSQL too), the fire times
computed from them. No check reads a process's clock, so a worker or beat whose
wall clock is off is judged by what it did, not by what it believed.

The worker without the package (its name begins with ``FOREIGN_PREFIX``) records
nothing in ``beat_runs``: a plain run it executed stays ``queued``. Its effects
carry its name, so every execution counts wherever it happened: a run it executed
is done if it has exactly one effect, and a second execution anywhere is caught.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import text

from beat.errors import InvalidSchedule
from beat.models import RunState
from beat.schedule.timing import Trigger, fire_times
from beat.schedule.workflow import canvas_of, plan
from beat.store.all_roles import Store
from beat.store.plain_runs import (
    CANCELLED_ON_CONNECTION_LOSS,
    PLAIN_RUN_TERMINATED,
    TAKEN_UNRECORDED,
)
from beat.store.runs import run_id_for

NON_TERMINAL = frozenset({RunState.PENDING, RunState.QUEUED, RunState.RUNNING, RunState.RETRYING})
#: More fire times than any run produces: fire_times() needs a bound.
FIRE_TIME_LIMIT = 1_000_000
#: Lateness is reported for these schedules (one fire time a second: the finest grain).
SECOND_KIND = "every 1 s"
#: And for these: thousands of crons that fire together, every minute.
CROWD_KIND = "crowd 1 min"
ONE_MICROSECOND = timedelta(microseconds=1)
#: A message sent this long before a Redis restart may still have been waiting in it
#: (the long jobs keep workers busy: a chain's link waited 22 s in a queue under faults).
WAITING_BEFORE_RESTART = timedelta(seconds=30)
#: Fire times this close before a deploy may be claimed after it, with the new kwargs.
DEPLOY_CLAIM_SLACK = timedelta(seconds=5)
#: Worker names of the worker without the package begin with this.
FOREIGN_PREFIX = "nopkg"


@dataclass(frozen=True, kw_only=True, slots=True)
class Expectation:
    """A schedule of the workload and what its fire times must produce."""

    name: str
    kind: str
    trigger: Trigger
    zone: ZoneInfo
    first_fire: datetime
    #: The definition stops being in force here (exclusive): a deploy replaced it.
    replaced_at: datetime | None = None
    #: Runs of a plain Celery task (no idempotent base).
    plain: bool = False
    #: The schedule's ``options.expires``, seconds.
    expires: float | None = None
    #: Fire times in these windows (a deploy's downtime) may be recorded ``skipped``.
    skippable: tuple[tuple[datetime, datetime], ...] = ()
    #: The kwargs its runs must carry (set for the code schedule a deploy changes).
    kwargs: dict[str, Any] | None = None
    #: The queue its runs go to, if not the default one.
    queue: str | None = None
    #: A workflow schedule: its runs are judged by their steps (``_check_workflow_run``).
    workflow: bool = False

    def fire_times(self, until: datetime) -> list[datetime]:
        """Every fire time from the first up to ``until`` (inclusive) while this
        definition was in force."""
        if self.replaced_at is not None:
            until = min(until, self.replaced_at - ONE_MICROSECOND)
        return fire_times(
            self.trigger,
            self.zone,
            after=self.first_fire - ONE_MICROSECOND,
            until=until,
            limit=FIRE_TIME_LIMIT,
        )

    def may_skip(self, fire_at: datetime) -> bool:
        return any(start <= fire_at <= end for start, end in self.skippable)

    def definition_certain(self, fire_at: datetime, claimed_at: datetime | None) -> bool:
        """False near a deploy: a fire time claimed only after the new definition was
        synced (late, or missed while beats were down) may run with either one. A
        fire time that stayed due through a deploy (no leader claimed it before, e.g.
        every beat was killed) is claimed with the definition in force at the claim."""
        for start, synced in self.skippable:
            if start - DEPLOY_CLAIM_SLACK <= fire_at <= synced:
                return False
            if claimed_at is not None and fire_at <= synced <= claimed_at:
                return False
        return True


@dataclass(frozen=True, kw_only=True, slots=True)
class BadRow:
    """A schedule written with psql that the API would refuse."""

    name: str
    #: What the reason of its quarantine must say.
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerKill:
    killed_at: datetime
    worker: str
    #: Runs the worker held a lease on when it was killed.
    held: tuple[uuid.UUID, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerPause:
    worker: str
    stopped_at: datetime
    resumed_at: datetime
    #: Runs it held when it was stopped (received or running).
    held: tuple[uuid.UUID, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaderPause:
    epoch: int
    stopped_at: datetime
    resumed_at: datetime
    #: A newer epoch was recorded while the leader was stopped (the fencing case).
    taken_over: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class DeletedMessage:
    """A message the broker-loss fault deleted."""

    task_id: str
    deleted_at: datetime
    #: ``queue`` (waiting for a worker) or ``unacked`` (taken by a worker, not acknowledged).
    where: str
    #: The run's state when it was deleted; None: the task had no run row yet (ad hoc).
    state: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class SentChain:
    """An ad hoc chain the harness sent: its links' task IDs, in order."""

    chain_id: str
    task_ids: tuple[str, ...]
    #: The send raised (broker down): the chain may or may not exist.
    send_failed: bool
    sent_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class RedisOutage:
    """The lease's Redis down past the leader row's hold (the broker up)."""

    down: datetime
    up: datetime
    #: Seconds of the leader row's hold.
    hold: float
    #: The epochs PostgreSQL's leader row named while Redis was down.
    epochs: tuple[int, ...]


@dataclass(kw_only=True)
class RunCounts:
    """Figures of the new kinds of work, for the summary."""

    plain: int = 0
    plain_succeeded: int = 0
    #: Plain runs that ended lost because the plan killed the worker running them.
    plain_interrupted: list[str] = field(default_factory=list)
    retried_runs: int = 0
    retries: int = 0
    expired: int = 0
    chains_sent: int = 0
    chains_completed: int = 0
    chain_links: int = 0
    #: Chains cut where the broker lost a link's message before any worker took it (no
    #: row: beyond reach): deleted by the message-loss fault, or lost in a Redis restart.
    chains_cut_by_message_loss: int = 0
    chains_cut_by_redis_restart: int = 0
    messages_deleted: int = 0
    #: Seconds from a deleted message to its run's next publication, per recovered run.
    message_loss_recoveries: list[float] = field(default_factory=list)
    deploy_skipped: int = 0
    #: Runs claimed ahead of fire times after the checked window, cancelled by the end
    #: phase's pause before their time (none of them may have run).
    cancelled_by_the_end: int = 0
    #: Plain runs the worker without the package executed (once: they stay ``queued``).
    plain_by_foreign: int = 0
    #: Plain runs on a queue the worker without the package consumes too, whose message
    #: (or whose retry's) the broker lost before a worker recorded it: nothing can tell
    #: that no worker took it, so the run waits for the broker's visibility timeout
    #: (they stay ``queued`` or ``retrying``).
    waiting_for_visibility: list[str] = field(default_factory=list)
    #: Plain runs on such a queue whose message came back from the broker with no worker
    #: having recorded it: that consumer may have run it, so it ends ``lost``
    #: (``TAKEN_UNRECORDED``), never run again.
    lost_to_unrecorded_consumers: list[str] = field(default_factory=list)
    #: Plain runs executed twice, at least once by the worker without the package
    #: (which cannot refuse a second message of a run): see ``_check_plain_run``.
    twice_with_foreign: list[str] = field(default_factory=list)
    #: Attempts recorded, and retries whose countdown was checked.
    retries_checked: int = 0
    #: Runs of the workflow schedules, and those that succeeded.
    workflow_runs: int = 0
    workflows_succeeded: int = 0
    #: Their steps: planned (by their canvases), recorded (rows), succeeded, and those
    #: whose body started more than once (an attempt interrupted, then run again).
    workflow_steps_planned: int = 0
    workflow_steps: int = 0
    workflow_steps_succeeded: int = 0
    workflow_steps_restarted: int = 0
    #: Violations of the workflows (each in ``Verdict.lost``, ``duplicated`` or ``stuck``
    #: too): workflow runs that did not succeed with every step, steps whose effect
    #: happened more than once (or without their success), runs or steps left unfinished.
    workflows_lost: list[str] = field(default_factory=list)
    workflow_steps_twice: list[str] = field(default_factory=list)
    workflows_stuck: list[str] = field(default_factory=list)
    #: Workflow runs the end phase's pause cancelled before their fire time, whose steps
    #: ran all the same (each in ``Verdict.duplicated`` too, as for any such run).
    workflows_run_though_cancelled: list[str] = field(default_factory=list)


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
    #: Of the crowd's fire times (``CROWD_KIND``).
    crowd_max_lateness: float = 0.0
    crowd_p99_lateness: float = 0.0
    reclaim_times: list[float] = field(default_factory=list)
    restarted_runs: int = 0
    duplicate_deliveries: int = 0
    #: Runs written by a paused leader after it was replaced (counted in ``duplicated`` too).
    stale_writes: int = 0
    #: Runs published, received or started before their fire time.
    early: list[str] = field(default_factory=list)
    #: Runs started after their fire time + ``expires``.
    late: list[str] = field(default_factory=list)
    #: Redis outages through which scheduling stopped for longer than the row's hold.
    stalled: list[str] = field(default_factory=list)
    #: The longest time without a claim within each Redis outage, in seconds.
    outage_gaps: list[float] = field(default_factory=list)
    counts: RunCounts = field(default_factory=RunCounts)

    @property
    def violations(self) -> list[str]:
        return [
            *(f"lost: {item}" for item in self.lost),
            *(f"duplicated: {item}" for item in self.duplicated),
            *(f"stuck: {item}" for item in self.stuck),
            *(f"unexpected: {item}" for item in self.unexpected),
            *(f"early: {item}" for item in self.early),
            *(f"expired but ran: {item}" for item in self.late),
            *(f"stalled: {item}" for item in self.stalled),
        ]

    @property
    def executed_twice(self) -> int:
        return len(self.duplicated)


@dataclass(frozen=True, kw_only=True, slots=True)
class Observations:
    """What the harness saw during the run, besides PostgreSQL."""

    kills: Sequence[WorkerKill] = ()
    pauses: Sequence[LeaderPause] = ()
    chains: Sequence[SentChain] = ()
    deleted: Sequence[DeletedMessage] = ()
    #: (down, up) of each Redis restart: it loses every message waiting in the broker.
    redis_restarts: Sequence[tuple[datetime, datetime]] = ()
    redis_outages: Sequence[RedisOutage] = ()
    #: Processes that exited by themselves (workers at a Redis restart: a kombu fault).
    self_exits: Sequence[str] = ()
    worker_pauses: Sequence[WorkerPause] = ()
    #: Queues a worker without the package consumes.
    foreign_queues: frozenset[str] = frozenset()


def judge(
    store: Store,
    expectations: Sequence[Expectation],
    *,
    window_end: datetime,
    seen: Observations,
    bad_rows: Sequence[BadRow] = (),
) -> Verdict:
    """Check every guarantee for fire times up to ``window_end``; measure gaps and reclaims."""
    # Runs of other schedules (the project's demo jobs, synced from code at beat
    # start and paused by the harness) are not part of the workload, nor are the
    # runs the workload's code schedule had before the workload began.
    began: dict[str, datetime] = {}
    for expectation in expectations:
        began[expectation.name] = min(
            expectation.first_fire, began.get(expectation.name, window_end)
        )
    all_rows = _run_rows(store)
    rows = [
        row
        for row in all_rows
        if row.schedule_name in began and row.fire_at >= began[row.schedule_name]
    ]
    effects = _effects(store)
    attempts = _attempts(store)
    steps = steps_by_workflow(all_rows)
    verdict = Verdict()
    _check_fire_times(verdict, rows, expectations, window_end)
    chain_rows = _check_chains(verdict, all_rows, effects, seen)
    # Workers that died: a plain run they held may end lost.
    killed = {kill.worker for kill in seen.kills} | set(seen.self_exits)
    _check_runs(
        verdict, rows, effects, expectations, killed, window_end,
        seen=seen, foreign_runs=_executed_by_foreign(store),
        steps=steps, starts=Counter(attempt.task_id for attempt in attempts),
    )  # fmt: skip
    # The steps of the workflow runs judged (not those of runs before the workload).
    judged = {row.id for row in rows}
    step_rows = [step for run_id in judged for step in steps.get(run_id, ())]
    _check_effects_have_runs(verdict, all_rows, effects)
    _check_never_early(verdict, [*rows, *chain_rows, *step_rows])
    _check_retry_countdowns(verdict, attempts)
    _check_fencing(verdict, rows, seen.pauses)
    verdict.max_claim_gap, verdict.max_claim_gap_from = _max_claim_gap(
        rows, expectations, window_end
    )
    _check_scheduling_through_outages(verdict, rows, seen.redis_outages)
    verdict.max_lateness, verdict.p99_lateness = _lateness(rows, expectations, window_end)
    verdict.crowd_max_lateness, verdict.crowd_p99_lateness = _lateness(
        rows, expectations, window_end, kind=CROWD_KIND
    )
    _check_bad_rows(verdict, store, bad_rows, all_rows)
    verdict.reclaim_times = _reclaim_times([*rows, *step_rows], seen.kills)
    verdict.restarted_runs = sum(1 for row in [*rows, *step_rows] if row.attempt - row.retries > 1)
    verdict.duplicate_deliveries = sum(row.duplicate_deliveries for row in [*rows, *step_rows])
    _count_message_loss(verdict.counts, all_rows, seen.deleted)
    return verdict


def _check_bad_rows(
    verdict: Verdict, store: Store, bad_rows: Sequence[BadRow], all_rows: list[Any]
) -> None:
    """Each bad row is quarantined (disabled) with its reason, and never fired."""
    if not bad_rows:
        return
    with store.engine.connect() as conn:
        stored = {
            row.name: row
            for row in conn.execute(
                text(
                    "SELECT name, enabled, quarantined_at, disabled_reason FROM beat_schedules"
                    " WHERE name = ANY(:names)"
                ),
                {"names": [bad.name for bad in bad_rows]},
            )
        }
    fired = Counter(row.schedule_name for row in all_rows)
    verdict.unexpected += bad_row_violations(bad_rows, stored, fired)


def bad_row_violations(
    bad_rows: Sequence[BadRow], stored: Mapping[str, Any], fired: Mapping[str, int]
) -> list[str]:
    """What went wrong with each bad row: ``stored`` has its row (``enabled``,
    ``quarantined_at``, ``disabled_reason``), ``fired`` its count of runs."""
    found = []
    for bad in bad_rows:
        row = stored.get(bad.name)
        if row is None or row.quarantined_at is None or row.enabled:
            found.append(f"bad row {bad.name} was not quarantined")
        elif bad.reason not in (row.disabled_reason or ""):
            found.append(
                f"bad row {bad.name} was quarantined for {row.disabled_reason!r:.300},"
                f" not for {bad.reason!r}"
            )
        if fired.get(bad.name):
            found.append(f"bad row {bad.name} made {fired[bad.name]} runs")
    return found


def _run_rows(store: Store) -> list[Any]:
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT id, schedule_name, fire_at, state, reason, error, epoch, attempt,"
                    " retries, duplicate_deliveries, claimed_at, published_at, received_at,"
                    " started_at, finished_at, worker, plain, not_before, retry_due_at, kwargs,"
                    " lease_owner, lease_expires_at, task, workflow_run_id, step"
                    " FROM beat_runs ORDER BY schedule_name, fire_at"
                )
            )
        )


def steps_by_workflow(rows: Iterable[Any]) -> dict[uuid.UUID, list[Any]]:
    """The step rows of each workflow run, by the workflow run's ID."""
    steps: dict[uuid.UUID, list[Any]] = defaultdict(list)
    for row in rows:
        if row.workflow_run_id is not None:
            steps[row.workflow_run_id].append(row)
    return dict(steps)


def _effects(store: Store) -> Counter[str]:
    """Effects by run ID (a caller-chosen task ID is mapped to its run ID, as the guard does)."""
    effects: Counter[str] = Counter()
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT task_id, count(*) FROM e2e_effects GROUP BY task_id"))
        for task_id, count in rows:
            effects[str(run_id_for(task_id))] += count
    return effects


def _executed_by_foreign(store: Store) -> frozenset[str]:
    """Run IDs with an effect written by the worker without the package."""
    with store.engine.connect() as conn:
        task_ids = conn.execute(
            text("SELECT DISTINCT task_id FROM e2e_effects WHERE worker LIKE :prefix"),
            {"prefix": f"{FOREIGN_PREFIX}%"},
        ).scalars()
        return frozenset(str(run_id_for(task_id)) for task_id in task_ids)


def _attempts(store: Store) -> list[Any]:
    with store.engine.connect() as conn:
        return list(
            conn.execute(text("SELECT task_id, retries, countdown, worker, at FROM chaos_attempts"))
        )


def _check_retry_countdowns(verdict: Verdict, attempts: Sequence[Any]) -> None:
    """No retry starts before the countdown its previous attempt asked for: the first
    attempt of each retry count after the first attempt before it (which recorded
    itself before asking, so this is a bound) is at least that far after it, by the
    database's clock. A retry count recorded before any attempt of the count below it
    belongs to another copy of the run (one the worker without the package ran, whose
    first attempt could not record itself), not to the retry that attempt asked for."""
    by_level: dict[str, dict[int, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for attempt in sorted(attempts, key=lambda a: a.at):
        by_level[attempt.task_id][attempt.retries].append(attempt)
    for task_id, levels in by_level.items():
        for retries, [attempt, *_] in list(levels.items()):
            following = next((a for a in levels.get(retries + 1, []) if a.at >= attempt.at), None)
            if following is None or attempt.countdown is None:
                continue
            verdict.counts.retries_checked += 1
            due = attempt.at + timedelta(seconds=attempt.countdown)
            if following.at < due:
                verdict.early.append(
                    f"task {task_id}: retry {retries + 1} started on {following.worker}"
                    f" {(due - following.at).total_seconds():.3f} s before its countdown"
                    f" ({attempt.countdown:g} s, asked by {attempt.worker})"
                )


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
            _check_recorded_state(verdict, expectation, fire_at, found[0], where)
            _check_definition_in_force(verdict, expectation, fire_at, found[0], where)
    for (name, fire_at), extra in by_fire.items():
        if fire_at is not None and fire_at <= window_end:
            verdict.unexpected.append(f"{name}: {len(extra)} runs at {fire_at}, no fire time")


def _check_recorded_state(
    verdict: Verdict, expectation: Expectation, fire_at: datetime, row: Any, where: str
) -> None:
    """A fire time that did not run must say why, and only where the rules allow it."""
    if row.state == RunState.SKIPPED:
        if not expectation.may_skip(fire_at):
            verdict.unexpected.append(f"{where}: skipped ({row.reason})")
        elif not row.reason:
            verdict.unexpected.append(f"{where}: skipped by a deploy without a reason")
        else:
            verdict.counts.deploy_skipped += 1
    elif row.state == RunState.EXPIRED:
        if expectation.expires is None:
            verdict.unexpected.append(f"{where}: expired, but its schedule has no expires")
        elif not (row.reason or row.error):
            verdict.unexpected.append(f"{where}: expired without a reason")


def _check_definition_in_force(
    verdict: Verdict, expectation: Expectation, fire_at: datetime, row: Any, where: str
) -> None:
    """A run carries the kwargs of the definition in force at its fire time."""
    if expectation.kwargs is None or row.state == RunState.SKIPPED:
        return
    certain = expectation.definition_certain(fire_at, row.claimed_at)
    if certain and row.kwargs != expectation.kwargs:
        verdict.unexpected.append(
            f"{where}: ran with kwargs {row.kwargs}, the definition in force has"
            f" {expectation.kwargs}"
        )


def _check_runs(
    verdict: Verdict,
    rows: list[Any],
    effects: Counter[str],
    expectations: Sequence[Expectation],
    killed: set[str],
    window_end: datetime,
    *,
    seen: Observations | None = None,
    foreign_runs: frozenset[str] = frozenset(),
    steps: Mapping[uuid.UUID, Sequence[Any]] | None = None,
    starts: Mapping[str, int] | None = None,
) -> None:
    """Each run's outcome (``steps``: the step rows of each workflow run by its ID;
    ``starts``: the bodies started of each task ID, ``chaos_attempts``)."""
    seen = seen or Observations()
    steps = steps or {}
    expires = {e.name: e.expires for e in expectations if e.expires is not None}
    plain = {e.name for e in expectations if e.plain}
    workflows = {e.name for e in expectations if e.workflow}
    shared = {
        e.name for e in expectations if e.queue is not None and e.queue in seen.foreign_queues
    }
    paused = {run for pause in seen.worker_pauses for run in pause.held}
    for row in rows:
        verdict.states[row.state] += 1
        where = f"run {row.id} ({row.schedule_name} at {row.fire_at:%H:%M:%S.%f})"
        count = effects.get(str(row.id), 0)
        if _cancelled_by_the_end(row, window_end):
            verdict.counts.cancelled_by_the_end += 1
            # A workflow's effects are its steps': none may have run either.
            count += sum(effects.get(str(step.id), 0) for step in steps.get(row.id, ()))
            if count == 1 and str(row.id) in foreign_runs:
                # The worker without the package ran it before the pause, and recorded
                # nothing: the pause found it waiting. Once is right.
                verdict.counts.plain_by_foreign += 1
            elif count and row.schedule_name in workflows:
                _workflow_violation(
                    verdict.duplicated,
                    verdict.counts.workflows_run_though_cancelled,
                    f"{where} (workflow): cancelled by a pause, yet its steps had {count} effects",
                )
            elif count:
                verdict.duplicated.append(f"{where}: cancelled by a pause, yet it had an effect")
            continue
        if row.schedule_name in plain:
            _check_plain_run(
                verdict, row, count, where, killed,
                paused=row.id in paused,
                by_foreign=str(row.id) in foreign_runs,
                shared=row.schedule_name in shared,
                message_lost=row.schedule_name in shared and _message_lost(row, seen),
            )  # fmt: skip
        elif row.schedule_name in workflows:
            _check_workflow_run(verdict, row, steps.get(row.id, ()), effects, where, starts=starts)
        else:
            _check_run_outcome(verdict, row, count, where)
        if row.retries > 0:
            verdict.counts.retried_runs += 1
            verdict.counts.retries += row.retries
        if row.state == RunState.EXPIRED:
            verdict.counts.expired += 1
        expiry = expires.get(row.schedule_name)
        if expiry is not None:
            _check_not_started_after_expiry(verdict, row, expiry, where)
            _check_not_expired_early(verdict, row, expiry, where)


def _message_lost(row: Any, seen: Observations) -> bool:
    """The broker lost the run's message before a worker recorded it: deleted by the
    message-loss fault, or waiting in Redis when it restarted. For a run ``retrying``,
    its retry's message: sent when the attempt that asked for it ran, and waiting (in
    the queue, or held for its countdown by a worker that records nothing) until it
    was due."""
    task_id = str(row.id)
    if row.state == RunState.RETRYING and row.retry_due_at is not None:
        sent = row.started_at or row.received_at
        return any(message.task_id == task_id for message in seen.deleted) or any(
            sent is not None and sent - WAITING_BEFORE_RESTART <= down <= row.retry_due_at
            for down, _ in seen.redis_restarts
        )
    if row.received_at is not None:
        return False
    if any(message.task_id == task_id for message in seen.deleted):
        return True
    return _near_a_redis_restart(row.published_at, seen.redis_restarts)


def _cancelled_by_the_end(row: Any, window_end: datetime) -> bool:
    """A run claimed ahead of a fire time after the checked window, which the end
    phase's pause (made after the window's end) cancelled before its time."""
    return (
        row.state == RunState.CANCELLED
        and row.fire_at is not None
        and row.fire_at > window_end
        and "paused before its fire time" in (row.reason or "")
    )


def _check_run_outcome(verdict: Verdict, row: Any, count: int, where: str) -> None:
    """A run of the idempotent base: finished, and one effect exactly if it succeeded."""
    if row.state in NON_TERMINAL:
        verdict.stuck.append(f"{where} is still {row.state} (attempt {row.attempt}){_held(row)}")
    elif row.state == RunState.SUCCEEDED and count == 0:
        verdict.lost.append(f"{where} succeeded without its effect")
    elif row.state in {RunState.LOST, RunState.FAILED, RunState.CANCELLED}:
        verdict.lost.append(f"{where} ended {row.state}: {row.error or row.reason}")
    if count > 1:
        verdict.duplicated.append(f"{where}: its effect happened {count} times")
    elif count == 1 and row.state != RunState.SUCCEEDED:
        verdict.duplicated.append(f"{where}: an effect committed though it is {row.state}")


def _check_workflow_run(
    verdict: Verdict,
    row: Any,
    steps: Sequence[Any],
    effects: Mapping[str, int],
    where: str,
    *,
    starts: Mapping[str, int] | None = None,
) -> None:
    """A workflow run: finished, and ``succeeded`` with every planned step of its canvas
    succeeded and its effect there exactly once; no step with its effect twice (or with
    one though it did not succeed); no step left unfinished.

    Its steps are runs of the idempotent base, recorded as their messages were sent: a
    step's body may start again after an interruption (a worker killed mid-step, counted
    in ``workflow_steps_restarted``), but its effect commits with its success, once."""
    counts = verdict.counts
    counts.workflow_runs += 1
    try:
        planned = [step.path for step in plan(canvas_of(row.kwargs or {})).steps]
    except InvalidSchedule as exc:
        planned = []
        verdict.unexpected.append(f"{where}: its kwargs hold no workflow ({exc})")
    counts.workflow_steps_planned += len(planned)
    counts.workflow_steps += len(steps)
    by_path = {step.step: step for step in steps}
    for step in steps:
        _check_workflow_step(
            verdict,
            step,
            effects.get(str(step.id), 0),
            f"run {step.id} (step {step.step} of workflow {where.removeprefix('run ')})",
            planned,
            (starts or {}).get(str(step.id), 0),
        )
    if row.state in NON_TERMINAL:
        _workflow_violation(
            verdict.stuck,
            counts.workflows_stuck,
            f"{where} (workflow) is still {row.state}{_held(row)};"
            f" steps: {_step_states(planned, by_path, effects)}",
        )
    elif row.state != RunState.SUCCEEDED:
        _workflow_violation(
            verdict.lost,
            counts.workflows_lost,
            f"{where} (workflow) ended {row.state}: {row.error or row.reason};"
            f" steps: {_step_states(planned, by_path, effects)}",
        )
    elif missing := [
        path
        for path in planned
        if (step := by_path.get(path)) is None
        or step.state != RunState.SUCCEEDED
        or effects.get(str(step.id), 0) == 0
    ]:
        _workflow_violation(
            verdict.lost,
            counts.workflows_lost,
            f"{where} (workflow) succeeded, but not every step did:"
            f" {_step_states(missing, by_path, effects)}",
        )
    elif all(effects.get(str(by_path[path].id), 0) == 1 for path in planned):
        counts.workflows_succeeded += 1  # (a step's effect twice is a violation of its own)


def _check_workflow_step(
    verdict: Verdict, step: Any, count: int, where: str, planned: Sequence[str], started: int
) -> None:
    counts = verdict.counts
    if step.state == RunState.SUCCEEDED:
        counts.workflow_steps_succeeded += 1
    if started > 1:
        counts.workflow_steps_restarted += 1
    if step.step not in planned:
        verdict.unexpected.append(f"{where}: its canvas has no step {step.step}")
    if step.state in NON_TERMINAL:
        _workflow_violation(
            verdict.stuck,
            counts.workflows_stuck,
            f"{where} is still {step.state} (attempt {step.attempt}){_held(step)}",
        )
    if count > 1:
        _workflow_violation(
            verdict.duplicated,
            counts.workflow_steps_twice,
            f"{where}: its effect happened {count} times",
        )
    elif count == 1 and step.state != RunState.SUCCEEDED:
        _workflow_violation(
            verdict.duplicated,
            counts.workflow_steps_twice,
            f"{where}: an effect committed though it is {step.state}",
        )


def _workflow_violation(kind: list[str], workflows: list[str], message: str) -> None:
    """A workflow's violation: in the verdict's list of its kind and in the workflows' own."""
    kind.append(message)
    workflows.append(message)


def _step_states(
    paths: Sequence[str], by_path: Mapping[str, Any], effects: Mapping[str, int]
) -> str:
    """``0 succeeded (1 effect), 1 running (attempt 2), 2 no run``: what each step is."""
    parts = []
    for path in paths:
        step = by_path.get(path)
        if step is None:
            parts.append(f"{path} no run")
            continue
        count = effects.get(str(step.id), 0)
        error = f": {step.error or step.reason}" if step.error or step.reason else ""
        parts.append(
            f"{path} {step.state} (attempt {step.attempt}, {count} effects, task {step.id}){error}"
        )
    return ", ".join(parts) or "none planned"


def _held(row: Any) -> str:
    """Who holds a stuck run, if anyone: a live holder renewing its lease keeps the run
    from every recovery, one whose lease ran out should have lost it to the reaper."""
    owner = getattr(row, "lease_owner", None)
    if owner is None:
        return ""
    expires = getattr(row, "lease_expires_at", None)
    until = "" if expires is None else f" until {expires:%H:%M:%S}"
    return f", its lease held by {owner}{until}"


def _cut_off(error: str | None) -> bool:
    """Whether a plain run was ended ``lost`` because Celery itself cut its body off: the
    worker cancelled it on losing its broker connection (a Redis restart), or terminated
    it. Its worker lives on, but the body was interrupted as by a death."""
    return error in {CANCELLED_ON_CONNECTION_LOSS, PLAIN_RUN_TERMINATED}


def _check_plain_run(
    verdict: Verdict,
    row: Any,
    count: int,
    where: str,
    killed: set[str],
    *,
    paused: bool = False,
    by_foreign: bool = False,
    shared: bool = False,
    message_lost: bool = False,
) -> None:
    """A plain task's run: at most one effect, exactly one if it succeeded; ``lost`` only
    if the worker that held it died (killed by the plan, or exited by itself at a Redis
    restart), was paused past its lease while holding it, or had its body cut off by
    Celery (``_cut_off``): its effect may then exist or not. A run the worker without
    the package executed stays waiting (nothing records it) with its one effect; one
    whose message the broker lost on that worker's queue waits for the visibility
    timeout (``RunCounts.waiting_for_visibility``)."""
    verdict.counts.plain += 1
    worker = (row.worker or "").split("@")[0]
    # States a run keeps when nothing records its end (a retry it asked for counts).
    waiting = {RunState.PENDING, RunState.QUEUED, RunState.RETRYING}
    if row.received_at is not None and not row.plain:
        verdict.unexpected.append(f"{where}: a worker took it, but it is not recorded plain")
    done_by_foreign = row.state in waiting and by_foreign
    if done_by_foreign:
        verdict.counts.plain_by_foreign += 1
    elif row.state in {RunState.QUEUED, RunState.RETRYING} and count == 0 and message_lost:
        verdict.counts.waiting_for_visibility.append(where)
    elif row.state in NON_TERMINAL:
        verdict.stuck.append(
            f"{where} (plain) is still {row.state} (attempt {row.attempt}){_held(row)}"
        )
    elif row.state == RunState.SUCCEEDED:
        verdict.counts.plain_succeeded += 1
        if count == 0:
            verdict.lost.append(f"{where} (plain) succeeded without its effect")
    elif row.state == RunState.LOST and (worker in killed or paused or _cut_off(row.error)):
        verdict.counts.plain_interrupted.append(f"{where} on {worker}: {row.error or row.reason}")
    elif row.state == RunState.LOST and shared and row.error == TAKEN_UNRECORDED:
        verdict.counts.lost_to_unrecorded_consumers.append(where)
    elif row.state != RunState.EXPIRED:
        held_by = f" (its worker {worker or '-'} did not die)"
        verdict.lost.append(
            f"{where} (plain) ended {row.state}{held_by}: {row.error or row.reason}"
        )
    if count == 2 and by_foreign:
        # The worker without the package ran a copy: it has no guard, so a second
        # message of the run (the outbox sent again by a leader that took over before
        # the first one was recorded as sent, or kombu handing out a delivery again)
        # runs there, or runs where nothing recorded the first: the mixed fleet's
        # documented second execution.
        verdict.counts.twice_with_foreign.append(where)
    elif count > 1:
        verdict.duplicated.append(f"{where} (plain): its effect happened {count} times")
    elif (
        count == 1 and row.state not in {RunState.SUCCEEDED, RunState.LOST} and not done_by_foreign
    ):
        verdict.duplicated.append(f"{where} (plain): an effect committed though it is {row.state}")


def _check_not_started_after_expiry(verdict: Verdict, row: Any, expires: float, where: str) -> None:
    deadline = row.fire_at + timedelta(seconds=expires)
    # An expired run may have started before its expiry (an attempt its worker's death
    # interrupted, whose copy then expired): its effect is checked with its outcome.
    if row.started_at is not None and row.started_at > deadline:
        late = (row.started_at - deadline).total_seconds()
        verdict.late.append(f"{where} started {late:.3f} s after its expiry ({expires:g} s)")


def _check_not_expired_early(verdict: Verdict, row: Any, expires: float, where: str) -> None:
    """A run ends ``expired`` only once its expiry has passed by the database's clock (a
    worker whose clock is ahead must not discard it earlier)."""
    deadline = row.fire_at + timedelta(seconds=expires)
    if row.state == RunState.EXPIRED and row.finished_at is not None and row.finished_at < deadline:
        early = (deadline - row.finished_at).total_seconds()
        verdict.lost.append(
            f"{where} ended expired {early:.3f} s before its expiry ({expires:g} s):"
            f" {row.reason or row.error}"
        )


def _check_effects_have_runs(verdict: Verdict, rows: list[Any], effects: Counter[str]) -> None:
    run_ids = {str(row.id) for row in rows}
    for run_id in set(effects) - run_ids:
        verdict.duplicated.append(f"an effect of task {run_id}, which has no run")


def _check_never_early(verdict: Verdict, rows: list[Any]) -> None:
    """No run is handed to the broker or started before it is due (its fire time, or
    the time it was put off to: its jitter, its retry's due time), nor taken before its
    fire time. A worker takes a retry's message before it is due and holds it for its
    countdown; the run keeps that receipt if the retry then runs on the worker without
    the package (which records nothing)."""
    for row in rows:
        due = row.not_before or row.fire_at
        if due is None:  # an ad hoc task: due when sent
            continue
        dues = {"published_at": due, "received_at": row.fire_at or due, "started_at": due}
        for column, column_due in dues.items():
            moment = getattr(row, column)
            if moment is not None and moment < column_due:
                early = (column_due - moment).total_seconds()
                verdict.early.append(
                    f"run {row.id} ({row.schedule_name} at {row.fire_at:%H:%M:%S.%f}):"
                    f" {column} {early:.3f} s before it was due"
                )


def _check_chains(
    verdict: Verdict,
    rows: list[Any],
    effects: Counter[str],
    seen: Observations,
) -> list[Any]:
    """Every link of every chain sent ran exactly once and every chain completed.

    A chain may stop only at a link whose message no worker had seen when the
    broker lost it (deleted by the message-loss fault, or sent shortly before a
    Redis restart): an ad hoc task has no run row until a worker takes it, so
    nothing can know it existed (the README says to send such work as a one-off
    schedule). Those are counted apart. Returns the chains' run rows."""
    by_id = {str(row.id): row for row in rows}
    unseen_deleted = {message.task_id for message in seen.deleted if message.state is None}
    counts = verdict.counts
    chain_rows: list[Any] = []
    for chain in seen.chains:
        counts.chains_sent += 0 if chain.send_failed else 1
        links = [(task_id, by_id.get(str(run_id_for(task_id)))) for task_id in chain.task_ids]
        chain_rows.extend(row for _, row in links if row is not None)
        _check_chain_effects(verdict, chain, links, effects)
        if all(row is not None and row.state == RunState.SUCCEEDED for _, row in links):
            counts.chains_completed += 1
            counts.chain_links += len(links)
            continue
        if chain.send_failed:
            continue  # the broker was down: it may never have been sent
        position = next(
            index for index, (_, row) in enumerate(links) if row is None or row.state != "succeeded"
        )
        task_id, row = links[position]
        if row is None and task_id in unseen_deleted:
            counts.chains_cut_by_message_loss += 1
            continue
        # A later link is sent by the worker that finished the link before it.
        previous = links[position - 1][1] if position else None
        sent_at = chain.sent_at if previous is None else previous.finished_at
        if row is None and _near_a_redis_restart(sent_at, seen.redis_restarts):
            counts.chains_cut_by_redis_restart += 1
            continue
        state = "no run" if row is None else f"{row.state} ({row.error or row.reason})"
        target = verdict.stuck if row is not None and row.state in NON_TERMINAL else verdict.lost
        target.append(
            f"chain {chain.chain_id} (sent {chain.sent_at:%H:%M:%S.%f}) incomplete: link"
            f" {position + 1} of {len(links)}, {task_id}, sent at {sent_at:%H:%M:%S.%f},"
            f" has {state}"
        )
    return chain_rows


def _near_a_redis_restart(
    sent_at: datetime | None, restarts: Sequence[tuple[datetime, datetime]]
) -> bool:
    """Sent while Redis was down, or shortly before it went down (still waiting)."""
    return sent_at is not None and any(
        down - WAITING_BEFORE_RESTART <= sent_at <= up for down, up in restarts
    )


def _check_chain_effects(
    verdict: Verdict, chain: SentChain, links: list[tuple[str, Any]], effects: Counter[str]
) -> None:
    for task_id, row in links:
        count = 0 if row is None else effects.get(str(row.id), 0)
        if row is None:
            count = effects.get(str(run_id_for(task_id)), 0)
        if count > 1:
            verdict.duplicated.append(
                f"chain {chain.chain_id}: link {task_id} had its effect {count} times"
            )
        elif count == 1 and (row is None or row.state != RunState.SUCCEEDED):
            state = "no run" if row is None else row.state
            verdict.duplicated.append(
                f"chain {chain.chain_id}: link {task_id} has an effect though it is {state}"
            )


def _count_message_loss(
    counts: RunCounts, rows: list[Any], deleted: Sequence[DeletedMessage]
) -> None:
    """Recoveries of runs whose waiting message the fault deleted: seconds from the
    deletion until the run was published again (or, failing a record of that, started)."""
    counts.messages_deleted = len(deleted)
    by_id = {str(row.id): row for row in rows}
    waiting = {RunState.QUEUED, RunState.RETRYING}
    recovered: dict[str, float] = {}
    for message in deleted:
        row = by_id.get(str(run_id_for(message.task_id)))
        if row is None or message.where != "queue" or message.state not in waiting:
            continue
        after = [
            moment
            for moment in (row.published_at, row.started_at)
            if moment is not None and moment > message.deleted_at
        ]
        if after:
            delay = (after[0] - message.deleted_at).total_seconds()
            recovered[str(row.id)] = max(delay, recovered.get(str(row.id), 0.0))
    counts.message_loss_recoveries = sorted(recovered.values())


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


def _check_scheduling_through_outages(
    verdict: Verdict, rows: list[Any], outages: Sequence[RedisOutage]
) -> None:
    """While the lease's Redis is down, a beat leads on PostgreSQL's row: no time
    within the outage goes without a claim for longer than the row's hold (the most a
    term that lost Redis keeps the row before another beat may take it)."""
    for outage in outages:
        claims = {r.claimed_at for r in rows if outage.down <= r.claimed_at <= outage.up}
        moments = sorted({outage.down, outage.up, *claims})
        gap, began = max(((b - a).total_seconds(), a) for a, b in pairwise(moments))
        verdict.outage_gaps.append(gap)
        if gap > outage.hold:
            verdict.stalled.append(
                f"no claim for {gap:.1f} s from {began:%H:%M:%S.%f} while Redis was down"
                f" {(outage.up - outage.down).total_seconds():.1f} s (hold {outage.hold:g} s)"
            )


def _lateness(
    rows: list[Any],
    expectations: Sequence[Expectation],
    window_end: datetime,
    *,
    kind: str = SECOND_KIND,
) -> tuple[float, float]:
    """Max and 99th percentile of (publish time - fire time) of the fire times of the
    schedules of ``kind``, the 1-second ones by default (the README's LATENESS: until
    the run was handed to the broker).

    A republish (outbox, reaper) rewrites ``published_at``; but a schedule's fire
    times are published in order, so a fire time was first published no later than
    any later one's recorded ``published_at``: the minimum over it and the later
    ones is its first publish time (exact unless it was republished, then a bound)."""
    seconds = {e.name for e in expectations if e.kind == kind}
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
