"""What changes schedules and their runs, the commands part of
:class:`beat.ops.schedules.Schedules`: create, update, pause, resume, delete, sync the
schedules defined in code, trigger, backfill and prune.

Every relative time (``in_seconds``, a new interval, a resumed schedule's next fire
time, the end of a backfill window) counts from the database's now, which the store
hands to the ``build`` functions here, never from this machine's clock."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from beat.errors import InvalidSchedule, UnknownTask
from beat.models import ChangeEntry, Schedule, ScheduleDefinition
from beat.ops.schedules_base import SchedulesBase
from beat.records import RunRecord
from beat.schedule import timing
from beat.schedule.define import (
    arguments_problem,
    check_channel_names,
    check_count,
    check_note,
    check_task_name,
    define,
    first_fire_at,
    steps_problem,
)
from beat.schedule.workflow import WORKFLOW_TASK, canvas_of, needs_result_backend
from beat.store.code_sync import SyncReport, next_fire_after_retiming
from beat.store.leader import PruneReport

#: Most runs one backfill creates: they are built, inserted and returned in one go
#: (86,401 runs of a one-second schedule took 363 MB in the CLI).
MAX_BACKFILL_RUNS = 10_000
#: Backfill starts this long after the retention horizon: a run claimed ahead (up to
#: habeat_claim_ahead, at most 30 s) counts its age from before its fire time.
BACKFILL_HORIZON_MARGIN = timedelta(minutes=1)


class ScheduleCommands(SchedulesBase):
    """Create and steer schedules, and make runs besides their timing."""

    def create(
        self, name: str, task: str = "", *, allow_unregistered: bool = False, **fields: Any
    ) -> Schedule:
        """Validate and store a new schedule; see :func:`define` for the fields. With
        ``workflow=`` (a Celery canvas) the schedule fires the canvas and ``task`` is left
        out (``beat.schedule.workflow``)."""
        build = self._creation(name, task, allow_unregistered, fields)
        return self.store.insert_schedule(build, change=self.change)

    def create_once(
        self,
        idempotency_key: str,
        name: str,
        task: str = "",
        *,
        allow_unregistered: bool = False,
        **fields: Any,
    ) -> tuple[Schedule, bool]:
        """:meth:`create`, once per ``idempotency_key`` (a retried request): the schedule,
        and whether this call made it. The same key with other fields is refused
        (IdempotencyKeyReused)."""
        check_idempotency_key(idempotency_key)
        build = self._creation(name, task, allow_unregistered, fields)
        request = json.dumps([name, task, fields], sort_keys=True, default=str)
        digest = hashlib.sha256(request.encode()).hexdigest()
        return self.store.insert_schedule_once(idempotency_key, digest, build, change=self.change)

    def _creation(
        self, name: str, task: str, allow_unregistered: bool, fields: dict[str, Any]
    ) -> Callable[[datetime], tuple[ScheduleDefinition, datetime | None]]:
        """The checked fields of a new schedule, as the store's ``build``."""
        fields = {**self.defaults, **fields}
        fields.setdefault("default_tz", self.default_tz)
        # Bad input is refused before the task lookup; the past is the database's, below.
        checked = define(name, task, **(fields | {"allow_past": True}))
        task = checked.task
        self.check_channels(checked.channels)
        if not allow_unregistered:
            self.check_task_registered(task)
            self.check_arguments(checked)

        def build(now: datetime) -> tuple[ScheduleDefinition, datetime | None]:
            definition = define(name, task, now=now, **fields)
            return definition, first_fire_at(definition, now)

        return build

    def update(
        self,
        name: str,
        *,
        allow_unregistered: bool = False,
        if_version: str | None = None,
        **changes: Any,
    ) -> Schedule:
        """Change some fields of a schedule; a changed timing recomputes the next fire time.
        With ``if_version`` (``Schedule.tag``), VersionConflict unless it is still that
        version: two people editing at once cannot overwrite each other."""
        if changes.get("channels") is not None:
            self.check_channels(check_channel_names(changes["channels"]))
        if "task" in changes:
            check_task_name(changes["task"])  # before it is looked up
            if not allow_unregistered:
                self.check_task_registered(changes["task"])
        check_call = not allow_unregistered and bool(
            {"task", "args", "kwargs", "workflow"} & set(changes)
        )
        if check_call:
            self._import_tasks()

        def build(current: Schedule, now: datetime) -> tuple[ScheduleDefinition, datetime | None]:
            definition = _redefine(current.definition, changes, now)
            if check_call:
                self.check_arguments(definition)
            return definition, next_fire_when_redefined(current, definition, now)

        return self.store.replace_schedule(name, build, change=self.change, if_version=if_version)

    def pause(
        self, name: str, *, note: str | None = None, if_version: str | None = None
    ) -> Schedule:
        """Stop firing; fire times while paused are not made up on resume. ``note``
        says why: the schedule shows it while paused, and the audit log keeps it."""
        if note is not None:
            note = check_note(note)
        return self.store.replace_schedule(
            name,
            lambda current, _now: (
                replace(current.definition, enabled=False),
                current.next_fire_at,
            ),
            change=replace(self.change, note=note),
            disabled_reason=note,
            if_version=if_version,
        )

    def resume(self, name: str, *, if_version: str | None = None) -> Schedule:
        """Fire again from the next fire time after now."""

        def build(current: Schedule, now: datetime) -> tuple[ScheduleDefinition, datetime | None]:
            definition = replace(current.definition, enabled=True)
            if current.definition.enabled:
                return definition, current.next_fire_at
            return definition, _resumed_next_fire(current, now)

        return self.store.replace_schedule(name, build, change=self.change, if_version=if_version)

    def delete(self, name: str, *, if_version: str | None = None) -> None:
        """Delete a schedule made at runtime; one defined in code is refused (the next
        sync would bring it back)."""
        self.store.delete_schedule(name, change=self.change, if_version=if_version)

    def sync_code(self, definitions: Sequence[tuple[ScheduleDefinition, str]]) -> SyncReport:
        """Make the schedules defined in code (``beat.schedule.code.collect``: each
        with the hash of its definition) those of the database, as beat does when it
        starts: see :meth:`beat.store.schedules.ScheduleStore.sync_code_schedules`."""
        change = replace(self.change, entry=ChangeEntry.CODE)
        return self.store.sync_code_schedules(definitions, first_fire_at, change=change)

    def _import_tasks(self) -> None:
        if self.app is not None:
            self.app.loader.import_default_modules()

    def check_task_registered(self, task: str) -> None:
        if self.app is None or task == WORKFLOW_TASK:  # a workflow's steps: check_arguments
            return
        self._import_tasks()
        if task not in self.app.tasks:
            raise UnknownTask(
                f"task {task!r:.200} is not registered with the Celery app '{self.app.main}':"
                " check the name, or allow it explicitly (--allow-unregistered)"
                " if only the workers import it"
            )

    def check_channels(self, names: Sequence[str] | None) -> None:
        """Refuse a route to a channel that does not exist (a typo would send the
        schedule's incidents elsewhere)."""
        if not names:
            return
        known = {channel.name for channel in self.store.list_channels()}
        unknown = next((name for name in names if name not in known), None)
        if unknown is not None:
            have = ", ".join(sorted(known)[:10]) or "none yet"
            raise InvalidSchedule(
                f"no channel {unknown!r}: add it first (celery -A app schedules channels add"
                f" {unknown} --webhook URL), or name one of the channels ({have})"
            )

    def check_arguments(self, definition: ScheduleDefinition) -> None:
        """Refuse args and kwargs that the task, if this app knows it, cannot be called
        with: every run would fail the same way."""
        if self.app is not None and definition.task == WORKFLOW_TASK:
            self._import_tasks()
            backend = _backend_problem(self.app, definition)
            if backend is not None:
                raise InvalidSchedule(backend)
            problem = steps_problem(self.app.tasks, definition)
            if problem is not None:
                raise InvalidSchedule(
                    f"{problem}: fix the step, or --allow-unregistered if only the workers"
                    " know its task"
                )
            return
        else:
            registered = None if self.app is None else self.app.tasks.get(definition.task)
            problem = arguments_problem(registered, definition)
        if problem is not None:
            raise InvalidSchedule(
                f"{problem}: give matching --args/--kwargs, or --allow-unregistered if the"
                " workers run another version of the task"
            )

    # -- runs ---------------------------------------------------------------------

    def backfill(
        self, name: str, *, start: datetime, end: datetime, limit: int = 100
    ) -> Sequence[RunRecord]:
        """Create the runs of schedule ``name`` for its fire times in ``start`` .. ``end``
        (oldest first, at most ``limit``, itself at most ``MAX_BACKFILL_RUNS``: like the
        misfire policy fire_all). Fire times that already have a run are left alone.
        Returns the runs created.

        The window must have passed (``end`` not after the database's now: fire times
        to come run on schedule) and lie within the history retention (older runs may
        be deleted, so which fire times ran is no longer known)."""
        if start.utcoffset() is None or end.utcoffset() is None or end < start:
            raise InvalidSchedule("backfill needs aware start and end times, end not before start")
        check_count(limit, "backfill limit", maximum=MAX_BACKFILL_RUNS)
        schedule = self.get(name)

        def fire_times(now: datetime) -> list[datetime]:
            self._check_backfill_window(start, end, now)
            return _fire_times_between(schedule, start, end, limit)

        return self.store.backfill(name, fire_times, change=self.change)

    def _check_backfill_window(self, start: datetime, end: datetime, now: datetime) -> None:
        if end > now:
            raise InvalidSchedule(
                f"backfill end (--to) {end.isoformat()} is after the database's now"
                f" {now.isoformat()}: end the window at now or earlier"
                " (fire times to come run on schedule)"
            )
        if self.history_retention is None:
            return
        horizon = now - self.history_retention + BACKFILL_HORIZON_MARGIN
        if start < horizon:
            raise InvalidSchedule(
                f"backfill start (--from) {start.isoformat()} is before {horizon.isoformat()}:"
                f" the runs of older fire times may have been deleted (history retention"
                f" {self.history_retention.total_seconds() / 86400:g} days), so which ran is"
                " unknown; start the window later, or keep more history"
                " (habeat_history_retention_days) before it is needed"
            )

    def prune(self, older_than: timedelta, *, batch: int = 1000) -> PruneReport:
        """Delete finished runs older than ``older_than``, ``batch`` rows per transaction."""
        return self.store.prune(older_than, batch=batch)

    def trigger(self, name: str) -> str:
        """Run schedule ``name`` once, now, besides its timing (paused or not); the run ID.

        The run is queued in PostgreSQL and the leader publishes it at its next tick
        (woken at once), with the run ID as the Celery task ID. ``next_fire_at`` is
        not touched. Raises :class:`ScheduleNotFound` for an unknown name.
        """
        return str(self.trigger_run(name).id)

    def trigger_run(self, name: str, *, run_id: uuid.UUID | None = None) -> RunRecord:
        """:meth:`trigger`, returning the run as queued rather than its ID. With
        ``run_id`` it is idempotent: the same ID again returns the run already queued
        (a form posted twice runs once)."""
        return self.store.trigger(name, run_id=run_id, change=self.change)


def _fire_times_between(
    schedule: Schedule, start: datetime, end: datetime, limit: int
) -> list[datetime]:
    """The fire times of ``schedule`` in ``start`` .. ``end``; refused beyond ``limit``."""
    trigger = schedule.definition.trigger
    zone = timing.parse_zone(schedule.definition.timezone)
    first = timing.next_fire_after(trigger, zone, start - timedelta(microseconds=1))
    if first is None or first > end:
        return []
    times = [first, *timing.fire_times(trigger, zone, after=first, until=end, limit=limit)]
    if len(times) > limit:
        raise InvalidSchedule(
            f"{start.isoformat()} .. {end.isoformat()} holds more than {limit} fire times"
            f" of {schedule.definition.name}: backfill a shorter window"
        )
    return times


#: The longest idempotency key taken (Stripe's and the IETF draft's keys are shorter).
MAX_IDEMPOTENCY_KEY = 255


def check_idempotency_key(key: str) -> None:
    if not key or len(key) > MAX_IDEMPOTENCY_KEY or not key.isascii() or not key.isprintable():
        raise InvalidSchedule(
            f"an idempotency key is 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters:"
            " a UUID is a good one"
        )


def trigger_run_id(name: str, idempotency_key: str) -> uuid.UUID:
    """The run ID a trigger of schedule ``name`` with ``idempotency_key`` gets: the same
    for a retried request, so the store's trigger makes one run."""
    check_idempotency_key(idempotency_key)
    return uuid.uuid5(TRIGGER_KEYS, f"{name}\x00{idempotency_key}")


#: The namespace of the run IDs derived from idempotency keys.
TRIGGER_KEYS = uuid.UUID("6c1f6e2a-5a0b-4c56-9a3f-1d2f3a4b5c6d")


def next_fire_when_redefined(
    current: Schedule, definition: ScheduleDefinition, now: datetime
) -> datetime | None:
    """The next fire time of ``current`` once ``definition`` replaces its own: the same
    unless the timing changed."""
    timing_changed = (definition.trigger, definition.timezone) != (
        current.definition.trigger,
        current.definition.timezone,
    )
    if not timing_changed:
        return current.next_fire_at
    recomputed = first_fire_at(definition, now)
    if isinstance(definition.trigger, timing.Every):
        # A new interval counts from the change (or its start_at), as a new
        # schedule's does: nothing of the old timing is due under it.
        return recomputed
    return next_fire_after_retiming(current.next_fire_at, recomputed, definition, now)


def _backend_problem(app: Any, definition: ScheduleDefinition) -> str | None:
    """Why the app cannot send the workflow of ``definition``: it has a chord, and the app
    no result backend to count the chord's header in."""
    if not needs_result_backend(canvas_of(definition.kwargs)):
        return None
    if app.conf.result_backend:
        return None
    return (
        "this workflow has a chord, which needs a result backend: set the app's"
        " result_backend (CELERY_RESULT_BACKEND=redis://...)"
    )


def _redefine(
    current: ScheduleDefinition, changes: Mapping[str, Any], now: datetime
) -> ScheduleDefinition:
    """The definition with ``changes`` applied, validated as a whole by :func:`define`
    (relative times count from the database's ``now``)."""
    fields: dict[str, Any] = {
        "args": current.args,
        "kwargs": current.kwargs,
        "options": current.options,
        "enabled": current.enabled,
        "misfire_policy": current.misfire_policy,
        "max_attempts": current.max_attempts,
        "origin": current.origin,
        "overlap_policy": current.overlap_policy,
        "jitter": current.jitter_seconds,
        "end_at": current.end_at,
        "max_runs": current.max_runs,
        "alert_after_failures": current.alert_after_failures,
        "pause_after_failures": current.pause_after_failures,
        "failure_states": current.failure_states,
        "max_runtime": current.max_runtime_seconds,
        "revoke_after_max_runtime": current.revoke_after_max_runtime,
        "late_after": current.late_after_seconds,
        "missed_after": current.missed_after_seconds,
        "channels": current.channels,
    }
    timing_keys = {"cron", "every", "at", "in_seconds", "start_at"}
    if not timing_keys & set(changes):
        fields |= _trigger_fields(current)
    elif _window_start_stays(current, changes, now):
        fields["start_at"] = current.start_at
    if "workflow" in changes or (current.task == WORKFLOW_TASK and "task" in changes):
        # A canvas given anew replaces the stored one; a task given anew replaces the canvas.
        fields["args"], fields["kwargs"] = (), None
    fields |= dict(changes)
    if "at" not in changes:
        fields["allow_past"] = True  # a one-off's own time is not checked again
    task = WORKFLOW_TASK if "workflow" in changes else fields.pop("task", current.task)
    fields.pop("task", None)
    # The zone stays unless changed; only a zone given anew is checked against the timing.
    return define(current.name, task, default_tz=current.timezone, now=now, **fields)


def _window_start_stays(
    current: ScheduleDefinition, changes: Mapping[str, Any], now: datetime
) -> bool:
    """Whether a new timing keeps the window's start_at: always when it is not given
    anew, except for an interval once the window has started (start_at is also where
    an interval counts from, and a changed one counts from the change)."""
    if "start_at" in changes or current.start_at is None:
        return False
    return "every" not in changes or current.start_at > now


def _trigger_fields(current: ScheduleDefinition) -> dict[str, Any]:
    trigger = current.trigger
    if isinstance(trigger, timing.Cron):
        # The trigger itself, so a change of anything else keeps its day rule.
        return {"cron": trigger, "start_at": current.start_at}
    if isinstance(trigger, timing.Every):
        return {"every": trigger.seconds, "start_at": trigger.anchor}
    return {"at": trigger.at}


def _resumed_next_fire(current: Schedule, now: datetime) -> datetime | None:
    if current.next_fire_at is None:
        return None  # a finished one-off stays finished
    trigger = current.definition.trigger
    if isinstance(trigger, timing.Once):
        return current.next_fire_at  # a paused one-off still fires once
    return timing.next_fire_after(trigger, timing.parse_zone(current.definition.timezone), now)
