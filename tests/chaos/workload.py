"""The chaos workload: the schedules the harness creates, the code schedule a
deploy changes, and the ad hoc chains it sends while faults happen.

Schedules created at runtime: 1-second intervals (quick job), 1-minute crons
and one-offs every few seconds (slow job, so that worker kills catch runs
mid-job), plain Celery tasks (on the plain queue, which the worker without the
package consumes too), tasks that retry (idempotent ones after 0.5 or 1 s, plain
ones after ``PLAIN_RETRY_COUNTDOWN``), schedules whose runs expire (an idempotent
and a plain task), and long jobs (idempotent and plain, 20 s) for faults to land
in. The code schedule lives in a JSON file that ``tests.chaos.jobs`` reads when a
beat starts; a deploy rewrites it while every beat is down.

Workflow schedules on the idempotent base (``WORKFLOW_SHAPES``: a chain of 3, a group
of 3, a chord of 3 and its body, a chain holding a group before a body, a chain ending
in a group) fire a Celery canvas every few seconds: each step is a run of its own,
recorded as its message is sent, and every step records its effect (``chaos.step``,
``chaos.gather``), so the checks count each step's executions. Their chords count their
header's parts in the result backend (the suite's Redis, under the broker's key prefix).

Among a crowd of thousands of crons that fire together every minute (a burst the
leader claims in batches), rows written with psql around every check of the API
(``BAD_ROWS``: an ``infinity``, a cron that never fires, 10 MB of kwargs, an unknown
zone, args nested deeper than Python's json reads) are due in the same burst: each
must be quarantined with its reason, none may fire, and every good one fires.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from celery import Celery, chain, chord, group, signature
from celery.canvas import Signature
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from beat.errors import HABeatError
from beat.models import Schedule
from beat.ops.schedules import Schedules
from beat.schedule.define import define, first_fire_at
from beat.schedule.document import definition_values
from beat.schedule.timing import next_fire_after, parse_zone
from beat.store.all_roles import Store
from beat.store.tables import schedules as schedules_table
from tests.chaos.checks import (
    CROWD_KIND,
    ONE_MICROSECOND,
    SECOND_KIND,
    BadRow,
    Expectation,
    SentChain,
)
from tests.chaos.plain_jobs import PLAIN_QUEUE, PLAIN_RETRY_COUNTDOWN


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadShape:
    """How much of each kind of work runs (see ``ChaosConfig``)."""

    second_schedules: int = 4
    minute_crons: int = 2
    one_off_every: float = 3.0
    slow_job_seconds: float = 2.0
    #: Plain tasks (no idempotent base) every 2 s, each working this long.
    plain_schedules: int = 2
    plain_job_seconds: float = 1.0
    #: Tasks that fail once or twice, then succeed, every 3 s.
    retrying_schedules: int = 2
    #: Plain tasks that ask for a retry once or twice (after ``PLAIN_RETRY_COUNTDOWN``),
    #: then succeed, every 4 s.
    plain_retrying_schedules: int = 1
    #: A slow job every 2 s whose runs expire this long after their fire time, and a
    #: plain one.
    expiring_schedules: int = 1
    plain_expiring_schedules: int = 1
    expires_seconds: float = 3.0
    #: Long jobs (an idempotent and a plain one) every ``long_job_every`` s: a server
    #: restart, an ``idle_session_timeout`` or a pause lands in the middle of them, where a
    #: living worker's run must not be taken for a dead one's.
    long_schedules: int = 1
    long_job_seconds: float = 20.0
    long_job_every: float = 10.0
    #: Seconds between two ad hoc chains sent by the harness (0: none).
    chain_every: float = 3.0
    #: Crons of a quick job that all fire at every minute, among which ``BAD_ROWS`` are
    #: written with psql, due in the same burst (0: neither).
    crowd_schedules: int = 2000
    #: Seconds between two runs of each workflow schedule (``WORKFLOW_SHAPES``; 0: none),
    #: and how long each step works before it records its effect (a chord's body and the
    #: step after a group do not work: they gather what came before).
    workflow_every: float = 5.0
    workflow_step_seconds: float = 0.4

    def runs_per_second(self) -> float:
        """Fire times this workload makes per second (the runs the summary counts as
        expected; the chains' links come on top), for a target number of runs."""
        per_second = (
            self.second_schedules
            + self.minute_crons / 60
            + 1 / self.one_off_every
            + (self.plain_schedules + self.expiring_schedules + self.plain_expiring_schedules) / 2
            + self.retrying_schedules / 3
            + self.plain_retrying_schedules / 4
            + 2 * self.long_schedules / self.long_job_every
            + 1 / 3  # the code schedule a deploy changes: every 2 to 4 s
            + self.crowd_schedules / 60
            + (len(WORKFLOW_SHAPES) / self.workflow_every if self.workflow_every else 0)
        )
        return per_second


def create_workload(store: Store, shape: WorkloadShape, until: datetime) -> list[Expectation]:
    """Create every runtime schedule of the workload; their expectations."""
    schedules = Schedules(store)
    anchor = store.now() + timedelta(seconds=1)
    expectations = []
    for kind, name, task, fields in _definitions(shape, anchor, until):
        schedule = schedules.create(name, task, allow_unregistered=True, **fields)
        expectations.append(
            expectation_of(
                kind, schedule, plain=kind in PLAIN_KINDS, workflow=kind == WORKFLOW_KIND
            )
        )
    return expectations


def create_crowd(store: Store, shape: WorkloadShape) -> tuple[list[Expectation], list[BadRow]]:
    """The crowd of crons firing every minute (written in one statement, each checked by
    the API's ``define``), and the bad rows written with psql among them, due at the
    crowd's first fire time; the crowd's expectations and the bad rows."""
    if not shape.crowd_schedules:
        return [], []
    now = store.now()
    values = []
    for index in range(shape.crowd_schedules):
        definition = define(
            f"crowd-{index:05d}", "e2e.record", cron="* * * * *", args=[f"k{index}"], now=now
        )
        values.append(
            definition_values(definition) | {"next_fire_at": first_fire_at(definition, now)}
        )
    with store.engine.begin() as conn:
        conn.execute(schedules_table.insert(), values)
    crowd = [s for s in Schedules(store).list() if s.name.startswith("crowd-")]
    burst = min(s.next_fire_at for s in crowd if s.next_fire_at is not None)
    return [expectation_of(CROWD_KIND, s) for s in crowd], write_bad_rows(store, due=burst)


#: Rows written with psql, past every check of the API: name -> (columns, values, what
#: the reason of its quarantine must say).
BAD_ROWS: dict[str, tuple[str, str, str]] = {
    "bad-end-infinity": (
        "trigger_kind, every_seconds, anchor_at, end_at",
        "'every', 1, now(), 'infinity'",
        "end_at = infinity",
    ),
    "bad-cron-february-30": ("trigger_kind, cron", "'cron', '0 0 30 2 *'", "it never fires"),
    "bad-kwargs-10mb": (
        "trigger_kind, cron, kwargs",
        "'cron', '* * * * *', jsonb_build_object('blob', repeat('x', 10000000))",
        "over the 65536-byte limit",
    ),
    "bad-zone-on-mars": (
        "trigger_kind, cron, timezone",
        "'cron', '* * * * *', 'Mars/Olympus_Mons'",
        "unknown time zone",
    ),
    "bad-args-1500-deep": (
        "trigger_kind, cron, args",
        "'cron', '* * * * *', (repeat('[', 1500) || repeat(']', 1500))::jsonb",
        "nested more than 32 levels",
    ),
}


def write_bad_rows(store: Store, *, due: datetime) -> list[BadRow]:
    """Write ``BAD_ROWS`` as psql would, each due at ``due``."""
    with store.engine.begin() as conn:
        for name, (columns, values, _) in BAD_ROWS.items():
            conn.execute(
                text(
                    f"INSERT INTO beat_schedules (name, task, next_fire_at, {columns})"
                    f" VALUES (:name, 'e2e.record', :due, {values})"
                ),
                {"name": name, "due": due},
            )
    return [BadRow(name=name, reason=reason) for name, (_, _, reason) in BAD_ROWS.items()]


PLAIN_KIND = "plain"
PLAIN_KINDS = frozenset({PLAIN_KIND, "plain retrying", "plain expires", "plain long"})
WORKFLOW_KIND = "workflow"


def _step(label: str, seconds: float) -> Signature:
    """A workflow's step: ``chaos.step`` (immutable: it takes no result)."""
    return signature("chaos.step", args=[label, seconds], immutable=True)


def _gather(label: str) -> Signature:
    """A chord's body: ``chaos.gather``, given the header's results."""
    return signature("chaos.gather", args=[label])


#: The workflow schedules: name -> its canvas, given the seconds each step works. Every
#: task is on the idempotent base (``tests.chaos.jobs``); each step's label is unique.
WORKFLOW_SHAPES: dict[str, Callable[[float], Signature]] = {
    "workflow-chain": lambda work: chain(
        _step("wc0", work), _step("wc1", work), _step("wc2", work)
    ),
    "workflow-group": lambda work: group(
        _step("wg0", work), _step("wg1", work), _step("wg2", work)
    ),
    "workflow-chord": lambda work: chord(
        [_step("wh0", work), _step("wh1", work), _step("wh2", work)], _gather("wh-body")
    ),
    # A group followed by a task in a chain: Celery makes the two a chord.
    "workflow-nested": lambda work: chain(
        _step("wn0", work), group(_step("wn1a", work), _step("wn1b", work)), _gather("wn2")
    ),
    # A group ending a chain: its members are sent by the worker that ran the first step.
    "workflow-chain-group": lambda work: chain(
        _step("wt0", work), group(_step("wt1a", work), _step("wt1b", work))
    ),
}


def _definitions(
    shape: WorkloadShape, anchor: datetime, until: datetime
) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """(kind, name, task, fields) of each schedule of the workload."""
    slow = shape.slow_job_seconds
    for index in range(shape.second_schedules):
        every_second = {"every": 1, "start_at": anchor, "args": [f"s{index}"]}
        yield SECOND_KIND, f"every-second-{index}", "e2e.record", every_second
    for index in range(shape.minute_crons):
        every_minute = {"cron": "* * * * *", "args": [f"m{index}", slow]}
        yield "cron 1 min", f"every-minute-{index}", "e2e.slow", every_minute
    on_the_plain_queue = {"queue": PLAIN_QUEUE}
    for index in range(shape.plain_schedules):
        plain = {
            "every": 2,
            "start_at": anchor,
            "args": [f"p{index}", shape.plain_job_seconds],
            "options": on_the_plain_queue,
        }
        yield PLAIN_KIND, f"plain-{index}", "chaos.plain", plain
    for index in range(shape.plain_retrying_schedules):
        plain_retrying = {
            "every": 4,
            "start_at": anchor,
            "args": [f"pr{index}", 1 + index % 2, PLAIN_RETRY_COUNTDOWN],
            "options": on_the_plain_queue,
        }
        yield "plain retrying", f"plain-retrying-{index}", "chaos.plain_retrying", plain_retrying
    for index in range(shape.plain_expiring_schedules):
        # On the default queue: a worker without the package discards an expired
        # message without a trace, and the run would wait for the visibility timeout.
        plain_expiring = {
            "every": 2,
            "start_at": anchor,
            "args": [f"px{index}", shape.plain_job_seconds / 2],
            "options": {"expires": shape.expires_seconds},
        }
        yield "plain expires", f"plain-expiring-{index}", "chaos.plain", plain_expiring
    for index in range(shape.retrying_schedules):
        # Fails once or twice, through autoretry_for or self.retry in turn.
        failures, explicit = 1 + index % 2, index % 2 == 1
        retrying = {"every": 3, "start_at": anchor, "args": [f"r{index}", failures, explicit]}
        yield "retrying", f"retrying-{index}", "chaos.retrying", retrying
    for index in range(shape.expiring_schedules):
        expiring = {
            "every": 2,
            "start_at": anchor,
            "args": [f"x{index}", slow / 2],
            "options": {"expires": shape.expires_seconds},
        }
        yield "expires", f"expiring-{index}", "e2e.slow", expiring
    for index in range(shape.long_schedules):
        every, seconds = shape.long_job_every, shape.long_job_seconds
        long = {"every": every, "start_at": anchor, "args": [f"l{index}", seconds]}
        yield "long", f"long-{index}", "e2e.slow", long
        # On the default queue: the workers with the package run it (they record it).
        plain_long = {"every": every, "start_at": anchor, "args": [f"pl{index}", seconds]}
        yield "plain long", f"plain-long-{index}", "chaos.plain", plain_long
    if shape.workflow_every:
        for name, canvas in WORKFLOW_SHAPES.items():
            workflow = {
                "workflow": canvas(shape.workflow_step_seconds),
                "every": shape.workflow_every,
                "start_at": anchor,
            }
            yield WORKFLOW_KIND, name, "", workflow
    at, index = anchor + timedelta(seconds=shape.one_off_every), 0
    while at < until:
        yield "one-off", f"once-{index:04d}", "e2e.slow", {"at": at, "args": [f"o{index}", slow]}
        at, index = at + timedelta(seconds=shape.one_off_every), index + 1


def expectation_of(
    kind: str,
    schedule: Schedule,
    *,
    plain: bool = False,
    first_fire: datetime | None = None,
    with_kwargs: bool = False,
    workflow: bool = False,
) -> Expectation:
    """What a stored schedule must produce from ``first_fire`` (default: its next fire
    time); with ``with_kwargs``, its runs must carry the schedule's kwargs."""
    first = first_fire or schedule.next_fire_at
    assert first is not None, f"{schedule.name} has no next fire time"
    options = schedule.definition.options
    expires = options.get("expires")
    return Expectation(
        name=schedule.name,
        kind=kind,
        trigger=schedule.definition.trigger,
        zone=parse_zone(schedule.definition.timezone),
        first_fire=first,
        plain=plain,
        expires=None if expires is None else float(expires),
        kwargs=dict(schedule.definition.kwargs) if with_kwargs else None,
        queue=options.get("queue"),
        workflow=workflow,
    )


# -- the code schedule a deploy changes --------------------------------------------------

#: Its timings, in turn, when a deploy changes the timing (seconds or a 6-field cron).
DEPLOY_TIMINGS: tuple[float | str, ...] = (3.0, "*/4 * * * * *", 2.0)
DEPLOYED_KIND = "deployed"


@dataclass(frozen=True, kw_only=True, slots=True)
class Deploy:
    version: int
    stopped_at: datetime
    #: When the first beat started again synced the new definition (its database time).
    synced_at: datetime
    timing_changed: bool


@dataclass(kw_only=True)
class CodeSchedule:
    """The code schedule that deploys change, written where ``tests.chaos.jobs`` reads it."""

    path: Path
    name: str = "deployed-0"
    version: int = 1
    timing: int = 0
    deploys: list[Deploy] = field(default_factory=list)
    #: The definitions in force, oldest first (the last one has no end).
    expectations: list[Expectation] = field(default_factory=list)

    def write(self) -> None:
        entry = {
            "task": "chaos.versioned",
            "schedule": DEPLOY_TIMINGS[self.timing % len(DEPLOY_TIMINGS)],
            "args": ["d"],
            "kwargs": {"version": self.version},
        }
        self.path.write_text(json.dumps({self.name: entry}))

    def change(self, *, timing: bool) -> None:
        """The next version: new kwargs, and the next timing if ``timing``."""
        self.version += 1
        if timing:
            self.timing += 1
        self.write()

    def wait_for_sync(self, store: Store, timeout: float) -> Schedule:
        """The stored schedule once a beat synced the current version."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                schedule = Schedules(store).get(self.name)
                if schedule.definition.kwargs.get("version") == self.version:
                    return schedule
            except HABeatError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no beat synced version {self.version} of {self.name} within {timeout:.0f}s"
                )
            time.sleep(0.2)

    def start_expecting(self, store: Store) -> None:
        """The first definition's expectation, from its first fire time after now on
        (not its ``next_fire_at``: the leader may have claimed the next one ahead)."""
        schedule = self.wait_for_sync(store, timeout=30)
        definition = schedule.definition
        first = next_fire_after(definition.trigger, parse_zone(definition.timezone), store.now())
        self.expectations.append(
            expectation_of(DEPLOYED_KIND, schedule, first_fire=first, with_kwargs=True)
        )

    def deployed(
        self,
        schedule: Schedule,
        *,
        stopped_at: datetime,
        timing_changed: bool,
        next_fire_when_stopped: datetime | None,
    ) -> None:
        """Record a deploy the beats have synced: the old definition was in force until
        the sync; its fire times while every beat was down may be recorded skipped.

        A new timing applies from the sync on, except that the old timing's fire time
        that no beat claimed (the schedule's next fire time when the beats stopped)
        stays due if it passed before the sync: the new timing's fire times then follow
        it, those missed recorded by the misfire policy (``next_fire_after_retiming``).

        That kept fire time may be older than the definition just replaced: deploys in a
        row with no claim between them (every beat stopped again right after a sync)
        leave the next fire time where the first left it. The new timing's fire times
        then follow it in place of those of every definition since, not only the last
        one: a deploy of the kwargs alone in between changes nothing in the product, so
        it must change nothing here (seed 20261205, deployed-0 at 07:11)."""
        synced_at = schedule.updated_at
        missed = (stopped_at, synced_at)
        first = first_fire_at(schedule.definition, synced_at)
        replaced_at = synced_at
        skippable: tuple[tuple[datetime, datetime], ...] = (missed,)
        kept = next_fire_when_stopped
        if (
            timing_changed
            and kept is not None
            and kept <= synced_at
            and (first is None or first > kept)
        ):
            replaced_at = kept + ONE_MICROSECOND  # the old timing ends with its kept fire time
            definition = schedule.definition
            first = next_fire_after(definition.trigger, parse_zone(definition.timezone), kept)
            # Claimed only after this sync, however long ago (the misfire policy decides).
            skippable = (missed, (kept, synced_at))
            self.expectations = [_ended_by(e, replaced_at) for e in self.expectations]
        previous = self.expectations.pop()
        self.expectations.append(
            _replace_expectation(previous, replaced_at=replaced_at, missed=missed)
        )
        assert first is not None, f"{schedule.name} has no fire time after its deploy"
        following = expectation_of(DEPLOYED_KIND, schedule, first_fire=first, with_kwargs=True)
        self.expectations.append(replace(following, skippable=skippable))
        self.deploys.append(
            Deploy(
                version=self.version,
                stopped_at=stopped_at,
                synced_at=synced_at,
                timing_changed=timing_changed,
            )
        )


def _replace_expectation(
    expectation: Expectation, *, replaced_at: datetime, missed: tuple[datetime, datetime]
) -> Expectation:
    return replace(expectation, replaced_at=replaced_at, skippable=(*expectation.skippable, missed))


def _ended_by(expectation: Expectation, replaced_at: datetime) -> Expectation:
    """``expectation``, in force no later than ``replaced_at`` (exclusive)."""
    if expectation.replaced_at is not None and expectation.replaced_at <= replaced_at:
        return expectation
    return replace(expectation, replaced_at=replaced_at)


# -- ad hoc chains ---------------------------------------------------------------------------


def create_tables(store: Store) -> None:
    """The jobs' effects (``e2e_effects``, one row per execution, with the worker that
    ran it if the job names it), the attempts of the retrying jobs (``chaos_attempts``,
    see ``tests.chaos.plain_jobs``) and the harness's record of the chains it sent
    (``chaos_chains``), for the checks."""
    with store.engine.begin() as conn:
        for statement in (
            "CREATE TABLE IF NOT EXISTS e2e_effects"
            " (task_id text NOT NULL, label text, at timestamptz DEFAULT now(), worker text)",
            "CREATE TABLE IF NOT EXISTS chaos_attempts (task_id text NOT NULL,"
            " retries int NOT NULL, countdown float, worker text,"
            " at timestamptz NOT NULL DEFAULT clock_timestamp())",
            "CREATE TABLE IF NOT EXISTS chaos_chains (chain_id text NOT NULL,"
            " position int NOT NULL, task_id text NOT NULL, state text NOT NULL,"
            " sent_at timestamptz DEFAULT now(), PRIMARY KEY (chain_id, position))",
        ):
            conn.execute(text(statement))


def sent_chains(store: Store) -> list[SentChain]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT chain_id, task_id, state, sent_at FROM chaos_chains"
                " ORDER BY chain_id, position"
            )
        ).all()
    links: dict[str, list[str]] = {}
    failed: set[str] = set()
    sent: dict[str, datetime] = {}
    for chain_id, task_id, state, sent_at in rows:
        links.setdefault(chain_id, []).append(task_id)
        sent.setdefault(chain_id, sent_at)
        if state != "sent":
            failed.add(chain_id)
    return [
        SentChain(
            chain_id=chain_id,
            task_ids=tuple(ids),
            send_failed=chain_id in failed,
            sent_at=sent[chain_id],
        )
        for chain_id, ids in links.items()
    ]


class ChainSender:
    """Sends an ad hoc chain on the idempotent base every few seconds, from a thread:
    a slow link then a quick one, every other chain under caller-chosen task IDs that
    are not UUIDs. Each is recorded in ``chaos_chains`` before it is sent."""

    def __init__(
        self, store: Store, app_factory: Callable[[], Celery], every: float, seed: int
    ) -> None:
        self._store = store
        self._app_factory = app_factory
        self._every = every
        self._seed = seed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-chains", daemon=True)
        self.sent = 0

    def start(self) -> None:
        if self._every > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def _loop(self) -> None:
        app = self._app_factory()
        number = 0
        while not self._stop.wait(self._every):
            self._send(app, number)
            number += 1

    def _send(self, app: Celery, number: int) -> None:
        chain_id = f"c{number:05d}"
        if number % 2:
            task_ids = [f"chaos-chain-{self._seed}-{number}-{link}" for link in ("a", "b")]
        else:
            task_ids = [str(uuid.uuid4()) for _ in range(2)]
        try:
            self._record(chain_id, task_ids, "sending")
        except SQLAlchemyError:
            return  # PostgreSQL is down: this chain is never sent
        # Immutable links (``.si``): a link does not take the previous one's result.
        links = chain(
            app.signature("e2e.slow", args=(chain_id, 1.0), immutable=True).set(
                task_id=task_ids[0]
            ),
            app.signature("e2e.record", args=(chain_id,), immutable=True).set(task_id=task_ids[1]),
        )
        try:
            links.apply_async()
            state = "sent"
        except Exception:  # the broker is down (a Redis restart): maybe sent, maybe not
            state = "failed"
        for _ in range(100):  # PostgreSQL may be restarting: the record must say it
            try:
                self._set_state(chain_id, state)
                break
            except SQLAlchemyError:
                time.sleep(0.5)
        self.sent += 1

    def _record(self, chain_id: str, task_ids: list[str], state: str) -> None:
        with self._store.engine.begin() as conn:
            for position, task_id in enumerate(task_ids):
                conn.execute(
                    text(
                        "INSERT INTO chaos_chains (chain_id, position, task_id, state)"
                        " VALUES (:chain_id, :position, :task_id, :state)"
                    ),
                    {
                        "chain_id": chain_id,
                        "position": position,
                        "task_id": task_id,
                        "state": state,
                    },
                )

    def _set_state(self, chain_id: str, state: str) -> None:
        with self._store.engine.begin() as conn:
            conn.execute(
                text("UPDATE chaos_chains SET state = :state WHERE chain_id = :chain_id"),
                {"chain_id": chain_id, "state": state},
            )
