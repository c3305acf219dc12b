"""RedBeat's entries, read from Redis as RedBeat keeps them: each entry a hash
``<prefix><name>`` with a ``definition`` and a ``meta`` (last run, total run count),
all of them in the sorted set ``<prefix>:schedule``. The JSON is read here (types
``datetime``, ``interval``, ``crontab``, ``rrule``), so the importing process needs no
RedBeat. A crontab is read in the app's zone, as RedBeat's beat reads it; an entry
that never ran is due at once, as RedBeat has it; an ``rrule`` is refused.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import redis
from celery.schedules import crontab
from celery.schedules import schedule as interval_schedule

from beat.errors import SourceError
from beat.schedule.code import app_zone
from beat.schedule.timing import parse_zone
from beat.sources.records import Found, ReadContext, Refusal
from beat.sources.translate import Refused, Row, celery_timing, schedule_of
from beat.store.db import masked_url

KIND = "redbeat"
DEFAULT_KEY_PREFIX = "redbeat"


class RedBeat:
    """The entries RedBeat keeps under ``key_prefix`` (RedBeat's ``redbeat_key_prefix``)."""

    kind = KIND

    def __init__(self, redis_url: str, key_prefix: str = DEFAULT_KEY_PREFIX) -> None:
        self.redis_url = redis_url
        # RedBeat's own default is "redbeat:"; people write it with or without the colon.
        self.key_prefix = key_prefix if key_prefix.endswith(":") else f"{key_prefix}:"

    def describe(self) -> str:
        return f"RedBeat entries {self.key_prefix}* at {masked_url(self.redis_url)}"

    def read(self, context: ReadContext) -> list[Found]:
        try:
            client = redis.Redis.from_url(self.redis_url, socket_timeout=10)
        except ValueError as exc:
            raise SourceError(
                f"--redis-url {masked_url(self.redis_url)!r} is not a Redis URL ({exc}):"
                " give one such as redis://host:6379/0"
            ) from None
        try:
            return self._read(client, context)
        except redis.RedisError as exc:
            raise SourceError(
                f"cannot read the {self.describe()} ({exc}): check --redis-url, and that"
                " Redis is up"
            ) from None
        finally:
            client.close()

    def _read(self, client: redis.Redis, context: ReadContext) -> list[Found]:
        members: list[bytes] = client.zrange(f"{self.key_prefix}:schedule", 0, -1)  # type: ignore[assignment]
        keys = sorted(member.decode() for member in members)
        if not keys and not client.exists(f"{self.key_prefix}:schedule"):
            raise SourceError(
                f"no RedBeat schedule at {self.key_prefix}:schedule on"
                f" {masked_url(self.redis_url)}: check --redis-url (its database number too)"
                " and --key-prefix (RedBeat's redbeat_key_prefix)"
            )
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hmget(key, "definition", "meta")
            stored = pipe.execute()
        zone = app_zone(context.app, context.default_tz) if context.app else context.default_tz
        return [
            self._found(key, definition, meta, zone, context)
            for key, (definition, meta) in zip(keys, stored, strict=True)
            if definition is not None  # removed since the sorted set was read
        ]

    def _found(
        self, key: str, definition: bytes, meta: bytes | None, zone: str, context: ReadContext
    ) -> Found:
        name = key.removeprefix(self.key_prefix)
        try:
            row = _row(key, name, _decoded(definition), _decoded(meta) if meta else {}, zone)
        except Refused as exc:
            return Refusal(source_name=name, source_id=key, reason=str(exc))
        return schedule_of(row, context)


def _row(key: str, name: str, definition: dict[str, Any], meta: dict[str, Any], zone: str) -> Row:
    schedule = definition.get("schedule")
    # RedBeat saves a new entry with the time it was saved as its last run, and counts
    # from it; once its beat ran the entry, the meta holds a run count too.
    last_run = meta.get("last_run_at")
    ran = "total_run_count" in meta
    return Row(
        source=KIND,
        source_id=key,
        name=str(definition.get("name") or name),
        task=definition.get("task") or "",
        timing=celery_timing(schedule, False),
        # A crontab follows the zone of the app, as in RedBeat; an interval has none.
        tz=zone if isinstance(schedule, crontab) else None,
        args=definition.get("args") or [],
        kwargs=definition.get("kwargs") or {},
        options=definition.get("options") or {},
        enabled=bool(definition.get("enabled", True)),
        last_run=last_run,
        last_fire_at=last_run if ran else None,
        runs_count=int(meta.get("total_run_count") or 0),
    )


def _decoded(raw: bytes) -> dict[str, Any]:
    try:
        document = json.loads(raw, object_hook=_object)
    except Refused:
        raise
    except (ValueError, TypeError, KeyError) as exc:
        raise Refused(f"its RedBeat JSON cannot be read ({exc}): save the entry again") from None
    if not isinstance(document, dict):
        raise Refused("its RedBeat JSON is not an object: save the entry again")
    return document


def _object(document: dict[str, Any]) -> Any:
    """RedBeat's encoding of Celery's schedules and of aware datetimes (RedBeat's
    ``RedBeatJSONEncoder``)."""
    kind = document.get("__type__")
    if kind == "datetime":
        return _datetime(document)
    if kind == "interval":
        return interval_schedule(
            run_every=document["every"], relative=bool(document.get("relative"))
        )
    if kind == "crontab":
        fields = {key: value for key, value in document.items() if key != "__type__"}
        try:
            return crontab(**fields)
        except (ValueError, TypeError) as exc:
            raise Refused(f"its crontab {fields} does not parse ({exc}): correct it") from None
    if kind == "rrule":
        raise Refused(
            "its rrule schedule is not supported (beat fires crontabs, intervals and"
            " one-offs): recreate it as a crontab or an interval, or leave it out"
            " (--skip-invalid)"
        )
    return document


def _datetime(document: dict[str, Any]) -> datetime:
    zone = document.get("timezone", "UTC")
    # A zone with a name is stored by its name, any other as its UTC offset in seconds.
    tzinfo: Any = (
        parse_zone(zone)
        if isinstance(zone, str)
        else timezone(timedelta(seconds=zone))
        if zone
        else UTC
    )
    fields = {key: document[key] for key in ("year", "month", "day", "hour", "minute", "second")}
    return datetime(**fields, microsecond=document.get("microsecond", 0), tzinfo=tzinfo)
