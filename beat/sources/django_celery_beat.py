"""django-celery-beat's tables, read with plain SQL: the importing process needs no
Django. Each ``PeriodicTask`` keeps the meaning django-celery-beat's
``DatabaseScheduler`` gives it:

* an ``IntervalSchedule`` counts ``every`` ``period`` from the last run; a
  ``CrontabSchedule`` is Celery's ``crontab`` (a day must match both day fields) read
  in the row's own ``timezone``; a ``ClockedSchedule`` fires once; a ``SolarSchedule``
  is refused (this scheduler computes no sunrise);
* ``one_off`` runs once (``max_runs`` 1), and a one-off that ran never fires again;
* ``start_time``: nothing fires before it, and what is overdue by then fires at it;
  ``expires``: nothing fires from it on (and a message sent expires at it, as
  django-celery-beat sets it), ``expire_seconds``: a message expires that long after;
* ``queue``, ``exchange``, ``routing_key``, ``priority``, ``headers`` (with the
  ``periodic_task_name`` header it adds), ``args``/``kwargs`` (JSON),
  ``enabled``, ``last_run_at``, ``total_run_count`` and ``description``.

A row that was never run counts from when it was last changed (``date_changed``),
as django-celery-beat does; with a ``start_time``, from 30 years before it (so it
fires at ``start_time``).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from celery.schedules import crontab
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.pool import NullPool

from beat.errors import SourceError
from beat.sources.records import Found, ReadContext, Refusal
from beat.sources.translate import Refused, Row, celery_timing, schedule_of
from beat.store.db import first_line, masked_url

KIND = "django-celery-beat"

#: The columns read, by table (the prefix ``django_celery_beat_`` left out): those of
#: django-celery-beat 2.x, whose migration 0012 added the last of them.
READ_COLUMNS: dict[str, tuple[str, ...]] = {
    "periodictask": (
        "id", "name", "task", "interval_id", "crontab_id", "solar_id", "clocked_id", "args",
        "kwargs", "queue", "exchange", "routing_key", "headers", "priority", "expires",
        "expire_seconds", "one_off", "start_time", "enabled", "last_run_at",
        "total_run_count", "date_changed", "description",
    ),
    "intervalschedule": ("id", "every", "period"),
    "crontabschedule": (
        "id", "minute", "hour", "day_of_week", "day_of_month", "month_of_year", "timezone",
    ),
    "clockedschedule": ("id", "clocked_time"),
    "solarschedule": ("id", "event", "latitude", "longitude"),
}  # fmt: skip

_QUERY = text(
    """
    SELECT t.id, t.name, t.task, t.args, t.kwargs, t.queue, t.exchange, t.routing_key,
           t.headers, t.priority, t.expires, t.expire_seconds, t.one_off, t.start_time,
           t.enabled, t.last_run_at, t.total_run_count, t.date_changed, t.description,
           t.interval_id, i.every, i.period,
           t.crontab_id, c.minute, c.hour, c.day_of_week, c.day_of_month, c.month_of_year,
           c.timezone, t.clocked_id, k.clocked_time, t.solar_id, s.event
    FROM django_celery_beat_periodictask t
    LEFT JOIN django_celery_beat_intervalschedule i ON i.id = t.interval_id
    LEFT JOIN django_celery_beat_crontabschedule c ON c.id = t.crontab_id
    LEFT JOIN django_celery_beat_clockedschedule k ON k.id = t.clocked_id
    LEFT JOIN django_celery_beat_solarschedule s ON s.id = t.solar_id
    ORDER BY t.name
    """
)

#: How far back django-celery-beat puts a never-run task's last run when it has a
#: start_time (``ModelEntry.__init__``): it is overdue at its start_time.
_BEFORE_START = timedelta(days=365 * 30)

_PERIODS = ("days", "hours", "minutes", "seconds", "microseconds")


class DjangoCeleryBeat:
    """The ``PeriodicTask`` rows of a django-celery-beat database."""

    kind = KIND

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url

    def describe(self) -> str:
        return f"django-celery-beat tables at {masked_url(self.database_url)}"

    def read(self, context: ReadContext) -> list[Found]:
        engine = self._engine()
        try:
            with engine.connect() as conn:
                self._check_columns(engine)
                records = conn.execute(_QUERY).all()
        except DBAPIError as exc:
            raise SourceError(
                f"cannot read the {self.describe()} ({first_line(exc.orig)}): check"
                " --database-url, and that the database is up"
            ) from None
        finally:
            engine.dispose()
        return [_found(record._mapping, context) for record in records]

    def _engine(self) -> Engine:
        try:
            url = make_url(self.database_url)
            if url.drivername in ("postgres", "postgresql"):
                url = url.set(drivername="postgresql+psycopg")  # the driver installed here
            return create_engine(url, poolclass=NullPool)
        except (ArgumentError, NoSuchModuleError, ValueError) as exc:
            raise SourceError(
                f"--database-url {masked_url(self.database_url)!r} is not a database URL"
                f" ({exc}): give one such as postgresql://user@host/dbname"
            ) from None

    def _check_columns(self, engine: Engine) -> None:
        """SourceError naming the first table or column missing: tables of another
        django-celery-beat version are read wrong or not at all."""
        inspector = inspect(engine)
        for table, columns in READ_COLUMNS.items():
            name = f"django_celery_beat_{table}"
            if not inspector.has_table(name):
                raise SourceError(
                    f"the database at {masked_url(self.database_url)} has no table {name}:"
                    " point --database-url at the Django project's database, migrated by"
                    " django-celery-beat (python manage.py migrate django_celery_beat)"
                )
            found = {column["name"] for column in inspector.get_columns(name)}
            missing = [column for column in columns if column not in found]
            if missing:
                raise SourceError(
                    f"{name} has no column {missing[0]}: these django-celery-beat tables are"
                    " of an older schema version; upgrade them first (pip install -U"
                    " django-celery-beat, then python manage.py migrate django_celery_beat)"
                )


def _found(record: Any, context: ReadContext) -> Found:
    try:
        row = _row(record)
    except Refused as exc:
        return Refusal(source_name=record["name"], source_id=str(record["id"]), reason=str(exc))
    return schedule_of(row, context)


def _row(record: Any) -> Row:
    one_off = bool(record["one_off"]) or record["clocked_id"] is not None
    ran = record["total_run_count"] > 0 or record["last_run_at"] is not None
    # django-celery-beat disables a one-off at its next check after it ran.
    finished = one_off and ran and (record["total_run_count"] > 0 or not record["enabled"])
    start = record["start_time"]
    expires = record["expires"]
    return Row(
        source=KIND,
        source_id=str(record["id"]),
        name=record["name"],
        task=record["task"],
        timing=_timing(record),
        tz=record["timezone"] if record["crontab_id"] is not None else None,
        args=_json(record["args"], "args", "[]"),
        kwargs=_json(record["kwargs"], "kwargs", "{}"),
        options=_options(record),
        enabled=bool(record["enabled"]) and not finished,
        start_at=start,
        # It stops at `now >= expires`: a fire time at expires itself does not run.
        end_at=None if expires is None else expires - timedelta(microseconds=1),
        max_runs=1 if one_off and record["clocked_id"] is None else None,
        last_run=_counted_from(record),
        last_fire_at=record["last_run_at"],
        runs_count=record["total_run_count"],
        finished=finished,
        not_before=start,
        description=record["description"] or None,
    )


def _counted_from(record: Any) -> datetime:
    if record["last_run_at"] is not None:
        return record["last_run_at"]  # type: ignore[no-any-return]
    changed: datetime = record["date_changed"]
    return changed - _BEFORE_START if record["start_time"] is not None else changed


def _timing(record: Any) -> dict[str, Any]:
    if record["interval_id"] is not None:
        return {"every": _interval_seconds(record["every"], record["period"])}
    if record["crontab_id"] is not None:
        return celery_timing(_crontab(record))
    if record["clocked_id"] is not None:
        return {"at": record["clocked_time"]}
    if record["solar_id"] is not None:
        raise Refused(
            f"its SolarSchedule ({record['event']}) is not supported (beat computes no sunrise"
            " or sunset times): give it a CrontabSchedule at a fixed local time, or leave it"
            " out (--skip-invalid)"
        )
    raise Refused("it has no schedule (interval, crontab, clocked or solar): give it one")


def _interval_seconds(every: int, period: str) -> float:
    if period not in _PERIODS:
        raise Refused(
            f"its IntervalSchedule has the unknown period {period!r}: use one of"
            f" {', '.join(_PERIODS)}"
        )
    return timedelta(**{period: every}).total_seconds()


def _crontab(record: Any) -> Any:
    fields = {
        name: record[name]
        for name in ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")
    }
    try:
        return crontab(**fields)
    except (ValueError, TypeError) as exc:
        written = " ".join(str(record[name]) for name in fields)
        raise Refused(
            f"its crontab '{written}' (minute hour day_of_week day_of_month month_of_year)"
            f" does not parse ({exc}): correct it in the Django admin"
        ) from None


def _json(value: str | None, what: str, empty: str) -> Any:
    try:
        return json.loads(value or empty)
    except ValueError as exc:
        raise Refused(
            f"its {what} are not JSON ({exc}): correct them in the Django admin"
        ) from None


def _options(record: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        name: record[name]
        for name in ("queue", "exchange", "routing_key", "priority")
        if record[name] not in (None, "")
    }
    headers = _json(record["headers"], "headers", "{}")
    if not isinstance(headers, dict):
        raise Refused("its headers are not a JSON object: correct them in the Django admin")
    # django-celery-beat adds it to every message; tasks may read it from their request.
    options["headers"] = {**headers, "periodic_task_name": record["name"]}
    if record["expires"] is not None:
        options["expires"] = record["expires"].isoformat()
    elif record["expire_seconds"] is not None:
        options["expires"] = record["expire_seconds"]
    return options
