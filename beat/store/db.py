"""Connections to the schedule database: the engine, transactions, and the
translation of driver errors into domain errors that say what to do."""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import re
import socket
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from urllib.parse import unquote_plus

import psycopg
from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    event,
    func,
    select,
    text,
)
from sqlalchemy.engine import URL, ExceptionContext, make_url
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    InvalidRequestError,
    OperationalError,
)

from beat.database_urls import PREPARE_THRESHOLD, prepare_threshold
from beat.errors import StoreUnavailable
from beat.schedule.payload import json_loads
from beat.sockets import readable, same_endpoint

logger = logging.getLogger(__name__)

#: What PostgreSQL says when a pooler moved a connection with prepared statements.
PREPARED_ON_ANOTHER_BACKEND = (
    psycopg.errors.InvalidSqlStatementName,
    psycopg.errors.DuplicatePreparedStatement,
)


class Detected(enum.Enum):
    """No threshold in the URL: the connection's own check decides."""

    DETECTED = "detected"


DETECTED = Detected.DETECTED
#: What to do about it.
PREPARED_STATEMENTS_FIX = (
    "take prepare_threshold out of the database URL (without it, a connection through a"
    " pooler prepares nothing)"
)
#: The processes that said so already (once is enough: every connection would).
_told_of_prepared_statements: set[int] = set()


def masked_url(url: str) -> str:
    """The URL with every secret hidden, for messages, logs and pages (never raises).

    It is read as a driver that is most generous to secrets would: the user information
    runs to the *last* ``@`` (redis-py reads ``redis://:pa@ss@host`` as the password
    ``pa@ss``; a person's unencoded password may hold ``/``, ``?`` or ``#`` too), and
    any parameter whose name speaks of a password, secret or token (``password``,
    ``sslpassword``, redis-py's ``ssl_password``, however percent-encoded) is hidden,
    in a query or a libpq ``key=value`` string alike. The user name stays when it is
    plain; what is not is hidden with the password, as is all before an ``@`` in text
    that is not a URL.
    """
    head, separator, rest = url.partition("://")
    if not separator:
        head, rest = "", url
    userinfo, at, place = rest.rpartition("@")
    if not at:
        shown = ""
    elif separator:
        shown = f"{_masked_userinfo(userinfo)}@"
    else:  # not a URL: who knows what comes before an @
        shown = "***@"
    return f"{head}{separator}{shown}{_masked_parameters(place)}"


#: A user name shown as it is; any other (one holding ``@``, ``/``, ``=``...) may be a
#: secret in the wrong place.
_PLAIN_USER = re.compile(r"[\w.~%+-]*")
#: ``key=value`` in a query (``&``/``;``) or a libpq string (spaces; values may be quoted).
_PARAMETER = re.compile(
    r"(?P<key>[^=&;?#\s]+)(?P<equals>\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'|[^&;#\s]*)"
)
#: A parameter named as a secret, its value (unquoted) running to the next separator:
#: a space written unencoded in it must not show the rest.
_SECRET_PARAMETER = re.compile(
    r"(?P<key>[^=&;?#\s]*(?:pass|pwd|secret|token)[^=&;?#\s]*)\s*=\s*(?:'(?:[^'\\]|\\.)*'|[^&;#']*)",
    re.IGNORECASE,
)
#: Names of parameters that carry a secret.
_SECRET_NAME = re.compile(r"pass|pwd|secret|token", re.IGNORECASE)


def _masked_userinfo(userinfo: str) -> str:
    user, colon, _password = userinfo.partition(":")
    shown = user if _PLAIN_USER.fullmatch(user) else "***"
    return f"{shown}:***" if colon else shown


def _masked_parameter(found: re.Match[str]) -> str:
    key = found["key"]
    return f"{key}=***" if _SECRET_NAME.search(unquote_plus(key)) else found[0]


def _masked_parameters(text: str) -> str:
    return _SECRET_PARAMETER.sub(r"\g<key>=***", _PARAMETER.sub(_masked_parameter, text))


def psycopg_conninfo(url: str) -> str:
    """A SQLAlchemy URL as psycopg's connection string, for connections held outside the
    pool (LISTEN, the crash-detection beacon); they never prepare statements."""
    without, _ = split_prepare_threshold(url)
    return without.set(drivername="postgresql").render_as_string(hide_password=False)


def split_prepare_threshold(url: str) -> tuple[URL, int | Detected | None]:
    """``url`` without psycopg's ``prepare_threshold``, and the threshold the URL gives
    (a count, or None for ``none``: no prepared statements), or ``DETECTED``: each new
    connection then prepares only if it reaches the server itself
    (``prepare_only_on_a_direct_connection``). It is no libpq parameter
    (``beat.database_urls`` reads it)."""
    parsed = make_url(url)
    given = parsed.query.get(PREPARE_THRESHOLD)
    if given is None:
        return parsed, DETECTED
    threshold = prepare_threshold(given[-1] if isinstance(given, tuple) else given)
    return parsed.difference_update_query([PREPARE_THRESHOLD]), threshold


#: This session as the server sees it, and where the server listens.
_WHO_AM_I = (
    "SELECT host(client_addr), client_port, inet_server_port(),"
    " current_setting('unix_socket_directories'), current_setting('port')"
    " FROM pg_stat_activity WHERE pid = pg_backend_pid()"
)
#: psycopg's threshold on a connection straight to the server (its own default).
DIRECT_PREPARE_THRESHOLD = 5


def own_session(conn: psycopg.Connection[Any]) -> bool:
    """Is the session the server lists for ``conn`` the connection itself, no pooler or
    proxy between them (whose next transaction could run on another backend)? Over
    TCP: its client address and port are our socket's, its server port our peer's.
    Over a unix socket: we reached one of the server's own socket files."""
    seen = conn.execute(_WHO_AM_I).fetchone()
    if seen is None:
        return False
    client_host, client_port, server_port, socket_directories, port = seen
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        if sock.family == socket.AF_UNIX:
            reached = sock.getpeername()
            return client_host is None and any(
                os.path.join(directory.strip(), f".s.PGSQL.{port}") == reached
                for directory in socket_directories.split(",")
            )
        local, peer = sock.getsockname(), sock.getpeername()
    if client_host is None or client_port is None:
        return False
    return same_endpoint(f"[{client_host}]:{client_port}", local[0], local[1]) and (
        server_port == peer[1]
    )


def prepare_only_on_a_direct_connection(dbapi_connection: Any, record: Any) -> None:
    """A new pooled connection prepares repeated statements (psycopg's default) only if
    the server sees it as its own session. Behind a pooler in transaction mode, a
    prepared statement's name (``_pg3_0``...) may be missing on the next backend, or be
    another client's statement, which PostgreSQL would run with our parameters. A
    check that cannot be made counts as a pooler: off is always safe, only slower."""
    try:
        direct = own_session(dbapi_connection)
        dbapi_connection.rollback()  # the check's transaction, before SQLAlchemy's first
    except (psycopg.Error, OSError):
        direct = False
    dbapi_connection.prepare_threshold = DIRECT_PREPARE_THRESHOLD if direct else None


def create_store_engine(
    url: str, *, pool_size: int = 5, connect_timeout: int = 5, ping: bool = True
) -> Engine:
    """An engine on ``url``; no connection is made until first use.

    A connection taken from the pool is checked first: with ``ping``, by a round trip
    (SQLAlchemy's pre-ping); without, by its socket alone (``discard_if_closed``), for a
    caller whose every use is one statement, which a ping would double."""
    without, threshold = split_prepare_threshold(url)
    engine = create_engine(
        without,
        pool_size=pool_size,
        pool_pre_ping=ping,
        connect_args={
            "connect_timeout": connect_timeout,
            "application_name": "habeat",
            PREPARE_THRESHOLD: None if threshold is DETECTED else threshold,
        },
        json_deserializer=json_loads,
    )
    if threshold is DETECTED:
        event.listen(engine, "connect", prepare_only_on_a_direct_connection)
    if not ping:
        event.listen(engine, "checkout", discard_if_closed)
    event.listen(engine, "handle_error", read_only_is_a_lost_connection)
    return engine


def read_only_is_a_lost_connection(context: ExceptionContext) -> None:
    """A server that refuses a write because it is read-only (a primary demoted after a
    failover, a standby a multi-host URL reached) is no primary any more: its connection
    is dropped from the pool as a lost one is, and the error is one (StoreUnavailable),
    not a crash. The next connection finds the primary, as a URL with
    ``target_session_attrs=read-write`` asks; meanwhile the leases decide, as after a
    restart.

    So is a connection whose prepared statements the server does not know, or knows
    already: a pooler in transaction mode (PgBouncer) handed it another backend, and
    the URL turned prepared statements on (``split_prepare_threshold``). The error then
    names the fix, once per process."""
    error = context.original_exception
    if isinstance(error, psycopg.errors.ReadOnlySqlTransaction):
        context.is_disconnect = True
    elif isinstance(error, PREPARED_ON_ANOTHER_BACKEND):
        context.is_disconnect = True
        if os.getpid() not in _told_of_prepared_statements:  # a forked child tells too
            _told_of_prepared_statements.add(os.getpid())
            logger.error(
                "PostgreSQL does not know this connection's prepared statement (%s): a"
                " pooler in transaction mode (PgBouncer) between us? %s",
                first_line(error),
                PREPARED_STATEMENTS_FIX,
            )


def discard_if_closed(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """A pooled connection whose socket has something to read is not used: idle in the
    pool, a healthy one has nothing to say, so what is there is its server closing it
    (a restart, a terminated backend, an idle timeout: PostgreSQL writes why, then closes
    the socket). SQLAlchemy then opens another in its place. What a ping would catch
    beyond this, a server gone without a word (a partition), it would wait for as the
    statement itself does; and neither proves the connection still works a moment
    later, so every write already meets a lost connection as an error."""
    if dbapi_connection.closed or dbapi_connection.broken or readable(dbapi_connection.fileno()):
        raise DisconnectionError("the server closed this pooled connection")


class StoreConnection:
    """An engine plus the translation of driver errors into domain errors."""

    def __init__(self, engine: Engine, *, setting: str = "habeat_database_url") -> None:
        self.engine = engine
        #: The setting that names this database, for hints (``BeatConfig.database_setting``).
        self.setting = setting

    @property
    def url(self) -> str:
        """The database's URL, secrets hidden (``masked_url``)."""
        return masked_url(self.engine.url.render_as_string(hide_password=False))

    def dispose(self) -> None:
        self.engine.dispose()

    def ping(self) -> datetime:
        """The database's time: proof that PostgreSQL answers."""
        with self._transaction() as conn:
            now: datetime = conn.execute(select(func.now())).scalar_one()
        return now

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Connection]:
        with self._translated_errors(), self.engine.begin() as conn:
            yield conn

    @contextlib.contextmanager
    def _each_statement_commits(self) -> Iterator[Connection]:
        """A connection on which every statement commits by itself (autocommit).

        For a write that is one statement (a worker's transitions of a run: each is one
        conditional UPDATE or upsert, atomic on its own) a transaction around it adds
        two round trips, BEGIN and COMMIT, and nothing else: where such a write is
        followed by a second statement (the read that explains a refusal, an expiry
        tried instead), the first changed nothing, so there is nothing to commit or
        undo together."""
        with (
            self._translated_errors(),
            self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn,
        ):
            yield conn

    @contextlib.contextmanager
    def _translated_errors(self) -> Iterator[None]:
        try:
            yield
        except InvalidRequestError as exc:
            if type(exc) is not InvalidRequestError or str(exc) != _EVERY_CHECKOUT_CLOSED:
                raise
            # ``discard_if_closed`` refused every connection the pool opened in its place:
            # a pooler that takes a login and closes it (PgBouncer with its server down).
            raise StoreUnavailable(
                f"PostgreSQL at {self.url} closed every new connection at once"
                " (a pooler whose server is down?): check that the server runs,"
                f" and {self.setting}"
            ) from exc
        except OperationalError as exc:
            raise StoreUnavailable(unreachable(self.url, exc.orig, self.setting)) from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                hint = (
                    f": a pooler in transaction mode? {PREPARED_STATEMENTS_FIX}, {self.setting}"
                    if isinstance(exc.orig, PREPARED_ON_ANOTHER_BACKEND)
                    else ""
                )
                raise StoreUnavailable(
                    f"lost the connection to PostgreSQL at {self.url}"
                    f" ({first_line(exc.orig)}){hint}"
                ) from exc
            raise


#: What SQLAlchemy's pool raises once every connection opened at a checkout was refused
#: (three in a row) by its checkout check (``discard_if_closed``).
_EVERY_CHECKOUT_CLOSED = "This connection is closed"


def plan_without_jit(conn: Connection) -> None:
    """PostgreSQL's JIT off for the rest of the transaction. A read over many runs (the
    run statistics) has a plan cost past ``jit_above_cost``, and compiling it through
    LLVM took longer than running it: at 10,000,000 runs, 1.6 s of compiling for a
    statistics query that runs in 0.3 s without it."""
    conn.execute(text("SET LOCAL jit = off"))


#: ``work_mem`` of a read that sorts a few hundred thousand values (the exact
#: percentiles of one schedule's statistics): PostgreSQL's default of 4 MB sent the
#: sort of 215,000 lateness values to disk (10 MB); per sort, for the one statement.
LARGE_SORT_MEMORY = "32MB"


def sort_in_memory(conn: Connection) -> None:
    """``work_mem`` at ``LARGE_SORT_MEMORY`` for the rest of the transaction."""
    conn.execute(text(f"SET LOCAL work_mem = '{LARGE_SORT_MEMORY}'"))


def is_unique_violation(exc: IntegrityError, constraint: str) -> bool:
    diag = getattr(exc.orig, "diag", None)
    return getattr(diag, "constraint_name", None) == constraint


#: What PostgreSQL says when the server answered but the login was refused.
_AUTHENTICATION_FAILED = re.compile(
    r"password authentication failed|no password supplied|role \"[^\"]*\" does not exist"
    r"|no pg_hba\.conf entry"
)


def unreachable(url: str, exc: BaseException | None, setting: str) -> str:
    """Why PostgreSQL at ``url`` (masked) cannot be used, and the fix: wrong credentials
    are not fixed by starting a server."""
    reason = first_line(exc)
    if isinstance(exc, psycopg.OperationalError) and _AUTHENTICATION_FAILED.search(str(exc)):
        return (
            f"PostgreSQL at {url} refused the login ({reason}):"
            f" authentication failed, check the user and password in {setting}"
        )
    return (
        f"PostgreSQL at {url} is unreachable ({reason}):"
        f" start it (`docker compose up -d postgres`) or check {setting}"
    )


def first_line(exc: BaseException | None) -> str:
    """The first line of an error's message (driver errors run over several lines)."""
    message = str(exc).strip() if exc is not None else ""
    return message.splitlines()[0] if message else type(exc).__name__


#: SQL: the identity of the PostgreSQL server answering: its start time, and the
#: statistics reset that a restored or promoted copy changes (``beat.lease.beacon``).
SERVER_INCARNATION = (
    "pg_postmaster_start_time()::text || ' ' || coalesce("
    "(SELECT stats_reset::text FROM pg_stat_bgwriter), '')"
)

#: Timeouts that would end an idle session; set to 0 where the server has them.
NO_IDLE_TIMEOUTS = (
    "SELECT set_config(name, '0', false) FROM pg_settings"
    " WHERE name IN ('idle_session_timeout', 'idle_in_transaction_session_timeout')"
)


def open_idle_connection(
    conninfo: str, masked: str, setting: str, *, keepalives: tuple[int, int, int]
) -> psycopg.Connection[Any]:
    """An autocommit connection held outside the pool to wait idle (LISTEN, the beacon):
    TCP keepalives of (idle, interval, count) seconds, the server's idle timeouts off
    for it. Raises StoreUnavailable, naming ``setting``, when it cannot be had."""
    idle, interval, count = keepalives
    try:
        conn = psycopg.connect(
            conninfo,
            autocommit=True,
            connect_timeout=5,
            keepalives=1,
            keepalives_idle=idle,
            keepalives_interval=interval,
            keepalives_count=count,
            # A few cheap statements: preparing them gains nothing, and behind a pooler
            # in transaction mode a prepared statement is missing on the next backend.
            prepare_threshold=None,
        )
    except psycopg.Error as exc:
        raise StoreUnavailable(unreachable(masked, exc, setting)) from exc
    try:
        conn.execute(NO_IDLE_TIMEOUTS)
    except psycopg.Error as exc:
        conn.close()
        raise StoreUnavailable(f"PostgreSQL at {masked}: {exc}") from exc
    return conn
