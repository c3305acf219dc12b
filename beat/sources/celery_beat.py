"""celery beat's own schedule: the app's ``beat_schedule`` (what to run) with the
shelve file its ``PersistentScheduler`` keeps (``celerybeat-schedule``: when each
entry last ran, and how often). The schedules stay schedules in code: each gets the
hash beat's sync of the code computes, so the first sync finds it unchanged and
keeps its history. An entry the file does not know counts from now, as celery beat
counts a new entry from its start.

The file holds pickled Celery objects: read it only from a celery beat of yours.
"""

from __future__ import annotations

import dbm
import pickle
import shelve
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from beat.errors import SourceError
from beat.models import ScheduleDefinition
from beat.schedule.code import beat_schedule_entries
from beat.sources.records import Found, ReadContext, Refusal
from beat.sources.translate import Row, schedule_of

KIND = "celery-beat"


class CeleryBeat:
    """The app's ``beat_schedule``, with the last runs in ``schedule_file``."""

    kind = KIND

    def __init__(self, schedule_file: str) -> None:
        self.schedule_file = schedule_file

    def describe(self) -> str:
        return f"the app's beat_schedule with the last runs in {self.schedule_file}"

    def read(self, context: ReadContext) -> list[Found]:
        stored = self._stored_entries(context.app)
        entries = beat_schedule_entries(
            context.app, default_tz=context.default_tz, defaults=context.defaults
        )
        if not entries:
            raise SourceError(
                f"the app '{context.app.main}' has no beat_schedule: import with -A the app"
                " celery beat ran with"
            )
        return [
            Refusal(source_name=name, source_id=name, reason=str(entry))
            if isinstance(entry, Exception)
            else schedule_of(_row(name, entry[0], stored.get(name), context), context)
            for name, entry in sorted(entries.items())
        ]

    def _stored_entries(self, app: Any) -> Mapping[str, Any]:
        try:
            with shelve.open(self.schedule_file, flag="r") as store:
                entries = dict(store.get("entries", {}))
                written_tz, written_utc = store.get("tz"), store.get("utc_enabled")
        # dbm.error: every dbm module's error, and OSError (a file that is not there).
        except (*dbm.error, pickle.UnpicklingError, EOFError, AttributeError) as exc:
            raise SourceError(
                f"cannot read celery beat's schedule file {self.schedule_file!r} ({exc}):"
                " give the file celery beat wrote (its --schedule, celerybeat-schedule by"
                " default), with celery beat stopped"
            ) from None
        if (written_tz, written_utc) != (app.conf.timezone, app.conf.enable_utc):
            raise SourceError(
                f"{self.schedule_file!r} was written with timezone={written_tz!r},"
                f" enable_utc={written_utc!r} but the app has timezone={app.conf.timezone!r},"
                f" enable_utc={app.conf.enable_utc!r}: celery beat would discard its last"
                " runs; import with the settings celery beat ran with"
            )
        return entries


def _row(name: str, definition: ScheduleDefinition, stored: Any, context: ReadContext) -> Row:
    """The entry's history in the file: celery beat writes a new entry with the time it
    started as its last run, and counts from it; it ran only if it has a run count."""
    counted_from = _aware(getattr(stored, "last_run_at", None))
    runs = int(getattr(stored, "total_run_count", 0) or 0)
    return Row(
        source=KIND,
        source_id=name,
        name=name,
        task=definition.task,
        timing={},  # the code's (ReadContext.code)
        enabled=definition.enabled,
        # An entry the file does not hold counts from celery beat's start: from now.
        last_run=counted_from or context.now,
        last_fire_at=counted_from if runs else None,
        runs_count=runs,
    )


def _aware(moment: datetime | None) -> datetime | None:
    """Celery reads a naive last run as UTC (``maybe_make_aware``)."""
    if moment is None or moment.utcoffset() is not None:
        return moment
    return moment.replace(tzinfo=UTC)
