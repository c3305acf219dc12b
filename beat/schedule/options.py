"""The publish options a schedule may carry, and what each may hold.

Options go into Celery's ``send_task`` as they are, and ``options.headers`` into the
message's headers, over Celery's own: a header named ``task`` ran another task than
the schedule's, one named ``eta`` delayed a run past the broker's visibility timeout.
So a schedule may carry only these options, of these types:

* ``queue``, ``exchange``, ``routing_key``: a name, 1 to 255 characters (an AMQP
  short string), without control characters;
* ``priority``: a whole number from 0 to 255;
* ``expires``: seconds after the fire time (more than 0, at most ``MAX_DURATION``),
  or an ISO 8601 time with its UTC offset;
* ``headers``: at most ``MAX_HEADERS`` names of letters, digits, ``_ - .`` (starting
  with a letter) that nobody else reads (see ``reserved_header``), each with a JSON
  scalar (a string, a number, true, false or null), ``MAX_HEADERS_BYTES`` in all.

:func:`check_publish_options` is applied where schedules are written (the API, so the
CLI and code schedules too) and again where stored rows are claimed and published:
a row written with psql is quarantined alone, and the others go on.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from celery.app.task import Context

from beat.errors import InvalidSchedule
from beat.limits import MAX_DURATION

#: The options a schedule may carry (never eta/countdown: beat does not publish with a
#: delay, since one longer than the broker's visibility timeout runs the task twice).
ALLOWED_OPTIONS: Final = frozenset(
    {"queue", "routing_key", "exchange", "priority", "expires", "headers"}
)
ROUTING_OPTIONS: Final = ("queue", "exchange", "routing_key")
#: AMQP's short strings (queue, exchange and routing key names) hold 255 bytes.
MAX_ROUTING_NAME: Final = 255
MAX_PRIORITY: Final = 255
MAX_HEADERS: Final = 32
MAX_HEADERS_BYTES: Final = 4096
#: Header values are JSON scalars; integers stay within AMQP's signed 64 bits.
_INT64: Final = 2**63
_HEADER_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")

#: Header names Celery writes or reads: those of message protocol 2
#: (``celery.app.amqp.AMQP.as_task_v2``), of the message properties, and every
#: attribute of a task's request (a worker builds ``self.request`` from the headers).
_CELERY_HEADERS: Final = frozenset(
    {
        # protocol 2 headers
        "lang", "task", "id", "shadow", "eta", "expires", "group", "group_index", "retries",
        "timelimit", "root_id", "parent_id", "argsrepr", "kwargsrepr", "origin",
        "ignore_result", "replaced_task_nesting", "stamped_headers", "stamps",
        # what else Celery removes from custom headers, or a worker reads from them
        "compression", "groups", "chord", "chain", "callbacks", "errbacks", "args", "kwargs",
        # message properties (kombu, AMQP)
        "correlation_id", "reply_to", "content_type", "content_encoding", "delivery_mode",
        "delivery_info", "delivery_tag", "priority", "expiration", "message_id", "timestamp",
        "type", "user_id", "app_id", "body_encoding", "properties", "headers",
    }
)  # fmt: skip
RESERVED_HEADERS: Final = frozenset(
    name.lower()
    for name in _CELERY_HEADERS | {key for key in vars(Context) if not key.startswith("_")}
)
#: Prefixes of names others read: this scheduler's own headers, and the broker's (RabbitMQ
#: reads x-match, x-delay, x-death...).
RESERVED_PREFIXES: Final = ("habeat_", "x-", "x_")


def check_publish_options(options: object) -> dict[str, Any]:
    """``options`` as a plain dict if a schedule may carry them; InvalidSchedule naming
    the first problem otherwise."""
    if not isinstance(options, Mapping):
        raise InvalidSchedule(
            f"options must be a JSON object, got {type(options).__name__}: {options!r:.80}"
        )
    unknown = sorted(set(options) - ALLOWED_OPTIONS, key=str)
    if unknown:
        raise InvalidSchedule(
            f"unsupported publish option(s) {', '.join(map(str, unknown)):.200}: allowed are"
            f" {', '.join(sorted(ALLOWED_OPTIONS))} (never eta/countdown)"
        )
    for key in ROUTING_OPTIONS:
        if key in options:
            _check_routing_name(key, options[key])
    if "priority" in options:
        _check_priority(options["priority"])
    if "expires" in options:
        _check_expires(options["expires"])
    if "headers" in options:
        check_headers(options["headers"])
    return dict(options)


def _check_routing_name(key: str, value: object) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ROUTING_NAME:
        raise InvalidSchedule(
            f"options.{key} must be a name of 1 to {MAX_ROUTING_NAME} characters, got {value!r:.80}"
        )
    if not value.isprintable():
        raise InvalidSchedule(f"options.{key} {value!r:.80} has control characters")


def _check_priority(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PRIORITY:
        raise InvalidSchedule(
            f"options.priority must be a whole number from 0 to {MAX_PRIORITY}, got {value!r:.80}"
        )


def _check_expires(value: object) -> None:
    longest = MAX_DURATION.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        if 0 < value <= longest:  # NaN is not
            return
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if moment.utcoffset() is None:
                raise InvalidSchedule(
                    f"options.expires {value!r:.80} has no UTC offset: add one, e.g. +00:00"
                )
            _check_in_utc_range(moment, value)
            return
    raise InvalidSchedule(
        f"options.expires must be seconds after the fire time (more than 0, at most"
        f" {longest:.0f}, {MAX_DURATION.days} days) or an ISO 8601 time with a UTC offset,"
        f" got {value!r:.80}"
    )


def _check_in_utc_range(moment: datetime, given: str) -> None:
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise InvalidSchedule(
            f"options.expires {given!r:.80} lies outside the years 1 to 9999 once in UTC"
        ) from None


def check_headers(headers: object) -> None:
    """Headers a schedule may add to its messages (see the module docstring)."""
    if not isinstance(headers, Mapping):
        raise InvalidSchedule(
            f"options.headers must be a JSON object, got {type(headers).__name__}: {headers!r:.80}"
        )
    if len(headers) > MAX_HEADERS:
        raise InvalidSchedule(f"options.headers has {len(headers)} headers: at most {MAX_HEADERS}")
    for name, value in headers.items():
        _check_header_name(name)
        _check_header_value(name, value)
    size = len(json.dumps(headers, separators=(",", ":")).encode())
    if size > MAX_HEADERS_BYTES:
        raise InvalidSchedule(
            f"options.headers take {size} bytes as JSON, over {MAX_HEADERS_BYTES} bytes:"
            " pass a reference (an ID) instead of the data"
        )


def _check_header_name(name: object) -> None:
    if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
        raise InvalidSchedule(
            f"options.headers name {name!r:.80} must be 1 to 64 letters, digits, _ - or .,"
            " starting with a letter"
        )
    if reserved_header(name):
        raise InvalidSchedule(
            f"options.headers name {name!r} is read by Celery, the broker or this scheduler"
            f" (no {', '.join(RESERVED_PREFIXES)}..., nor Celery's own names): rename it"
        )


def reserved_header(name: str) -> bool:
    """Whether a header of this name would change how a run is routed, delivered or
    run: Celery's, the broker's and this scheduler's names (case does not matter)."""
    lowered = name.lower()
    return lowered in RESERVED_HEADERS or lowered.startswith(RESERVED_PREFIXES)


def _check_header_value(name: str, value: object) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int) and -_INT64 <= value < _INT64:
        return
    if isinstance(value, float) and math.isfinite(value):
        return
    if isinstance(value, str) and _plain_text(value):
        return
    raise InvalidSchedule(
        f"options.headers {name!r} must be a string, number, true, false or null"
        f" (a finite number, text without NUL), got {value!r:.80}"
    )


def _plain_text(value: str) -> bool:
    """Text PostgreSQL stores and any broker carries: UTF-8, without NUL."""
    if "\x00" in value:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True
