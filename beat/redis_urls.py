"""Redis URLs as this package reads them, before any connection: ``redis://``,
``rediss://`` (TLS) and ``unix://`` as redis-py reads them, or Redis Sentinel as kombu
spells it, with the name of the primary the sentinels watch::

    sentinel://:password@10.0.0.1:26379;sentinel://:password@10.0.0.2:26379/0?master_name=beat

And which of them the lease takes when no URL of its own is set: the broker's, when
the broker is Redis or Redis Sentinel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from beat.errors import ConfigError

SENTINEL_SCHEME = "sentinel"


@dataclass(frozen=True, kw_only=True, slots=True)
class SentinelSpec:
    """What a ``sentinel://`` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    password: str | None = None
    username: str | None = None
    #: The query's other parameters, in order (``ssl_cert_reqs``...).
    options: tuple[tuple[str, str], ...] = ()


def is_sentinel(url: str) -> bool:
    return url.split(":", 1)[0].lower() == SENTINEL_SCHEME


def parse_sentinel_url(url: str, setting: str = "habeat_redis_url") -> SentinelSpec:
    """The sentinels (each ``sentinel://host:port``, separated by ``;``), the primary's
    name (``?master_name=``), its database and password; ConfigError naming the fix."""
    parts = [part for part in url.split(";") if part.strip()]
    sentinels: list[tuple[str, int]] = []
    query: dict[str, list[str]] = {}
    db, password, username = 0, None, None
    for part in parts:
        split = urlsplit(part.strip())
        if split.scheme.lower() != SENTINEL_SCHEME or not split.hostname:
            shown = part.strip().rpartition("@")[2][:80]  # never a password
            raise ConfigError(
                f"{setting}: {shown!r} is not sentinel://host:port: list each"
                " sentinel as sentinel://host:port, separated by ';'"
            )
        sentinels.append((split.hostname, split.port or 26379))
        query.update(parse_qs(split.query))
        if split.path.strip("/"):
            db = _database(split.path.strip("/"), setting)
        if split.password is not None:
            password = unquote(split.password)
            username = unquote(split.username) if split.username else None
    master_name = (query.get("master_name") or [""])[0]
    if not master_name:
        raise ConfigError(
            f"{setting}: a sentinel:// URL needs the primary's name: add"
            " ?master_name=NAME (the name the sentinels monitor)"
        )
    return SentinelSpec(
        sentinels=tuple(sentinels),
        master_name=master_name,
        db=db,
        password=password,
        username=username,
        options=tuple(
            (key, value)
            for key, values in query.items()
            if key != "master_name"
            for value in values
        ),
    )


def lease_url_of_broker(broker: Any, transport_options: Any) -> str | None:
    """The lease's URL when the Celery broker is Redis (``broker_url``, the first of
    its failover URLs), or Redis Sentinel: then all of the sentinels, with the primary's
    name from the URL or, as kombu takes it, from ``broker_transport_options``. None
    when the broker is not Redis."""
    whole = str(broker or "").strip()
    first = whole.split(";")[0].strip()
    if first.startswith(("redis://", "rediss://", "unix://")):
        return first
    if not is_sentinel(first):
        return None
    master_name = dict(transport_options or {}).get("master_name")
    if "master_name=" in whole or not master_name:
        return whole
    separator = "&" if "?" in whole else "?"
    return f"{whole}{separator}master_name={quote(str(master_name))}"


def as_kombu_sentinel_url(url: str, setting: str) -> tuple[str, str]:
    """``url`` (``sentinel://...?master_name=NAME``) as kombu takes it, and the
    primary's name, which kombu reads from ``broker_transport_options`` only.

    kombu reads the URL it is on: the first sentinel's at start, the next one's after
    each connection error (``Connection.switch``), its database, password and query
    included, and it passes the query's parameters to its connection as arguments
    (``ssl_*`` aside), so ``master_name`` there stops a worker with a TypeError at the
    failover. So every sentinel's URL here carries the same user information, database
    and ``ssl_*`` parameters, and nothing else; another parameter is refused, naming
    where it goes."""
    spec = parse_sentinel_url(url, setting)
    refused = [key for key, _ in spec.options if not key.startswith("ssl_")]
    if refused:
        raise ConfigError(
            f"{setting}: kombu cannot take ?{refused[0]}= in a sentinel:// URL (it would"
            " stop a worker when it fails over to the next sentinel): set it in"
            " broker_transport_options"
        )
    userinfo = ""
    if spec.password is not None:
        userinfo = f"{quote(spec.username or '', safe='')}:{quote(spec.password, safe='')}@"
    query = urlencode(spec.options)
    tail = f"/{spec.db}" + (f"?{query}" if query else "")
    urls = [f"sentinel://{userinfo}{_netloc(host, port)}{tail}" for host, port in spec.sentinels]
    return ";".join(urls), spec.master_name


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _database(text: str, setting: str) -> int:
    if not text.isdigit():
        raise ConfigError(
            f"{setting}: the database of a sentinel:// URL is a number, not {text!r:.20}"
        )
    return int(text)
