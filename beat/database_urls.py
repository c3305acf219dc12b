"""The schedule database's URL as this package reads it before any connection: what a
SQLAlchemy URL cannot say safely (a password holding ``@``), and psycopg's
``prepare_threshold``, which the URL's query may carry (``none``: no prepared
statements, as PgBouncer in transaction mode needs) though it is no libpq parameter."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

from beat.errors import ConfigError

#: psycopg's keyword for the execution of a statement that prepares it.
PREPARE_THRESHOLD = "prepare_threshold"


def prepare_threshold(text: str, setting: str = "the database URL") -> int | None:
    """``?prepare_threshold=`` as psycopg takes it: ``none`` (never prepare) or a count
    of executions; ConfigError naming the fix for anything else."""
    value = text.strip().lower()
    if value == "none":
        return None
    if value.isdigit():
        return int(value)
    raise ConfigError(
        f"{setting}: {PREPARE_THRESHOLD}={value[:20]!r}: give a count of executions, or none"
        " (no prepared statements, for PgBouncer in transaction mode)"
    )


def database_url_refusal(url: str, setting: str) -> ConfigError | None:
    """Why ``url`` cannot be used, naming ``setting`` and the fix; None if it can."""
    if _password_read_short(url):
        return ConfigError(
            f"{setting}: its password holds an '@', where SQLAlchemy ends the password (it"
            " would take the rest for the host): write each '@' in the password as %40"
        )
    for given in parse_qs(urlsplit(url).query).get(PREPARE_THRESHOLD, []):
        try:
            prepare_threshold(given, setting)
        except ConfigError as exc:
            return exc
    return None


def _password_read_short(url: str) -> bool:
    """Whether SQLAlchemy, which reads a URL's user information up to its *first* ``@``
    (redis-py reads to the last), would take part of the password for the host: the
    host and port it reads, up to the path or query, hold another ``@``."""
    _, _, rest = url.partition("://")
    _, at, place = rest.partition("@")
    return bool(at) and "@" in re.split(r"[/?]", place, maxsplit=1)[0]
