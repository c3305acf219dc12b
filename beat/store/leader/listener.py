"""The LISTEN connection that wakes the beat loop on a schedule change or a hand-over."""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg

from beat.errors import StoreUnavailable
from beat.store.db import masked_url, open_idle_connection, psycopg_conninfo
from beat.store.leader.term import LEADER_RELEASED_CHANNEL
from beat.store.tables import SCHEDULES_CHANNEL

#: TCP keepalives of the LISTEN connection (seconds): a dead link is noticed within
#: about a minute. Unlike the beacon's, nothing is decided on its loss.
LISTEN_KEEPALIVE_IDLE, LISTEN_KEEPALIVE_INTERVAL, LISTEN_KEEPALIVE_COUNT = 30, 10, 3


class ScheduleChangeListener:
    """A dedicated autocommit connection that LISTENs for schedule changes and hand-overs.

    ``wait`` returns early when a schedule was changed outside a claim or a
    leader released its lease; the beat loop waits here instead of sleeping.
    """

    CHANNELS = (SCHEDULES_CHANNEL, LEADER_RELEASED_CHANNEL)

    def __init__(self, url: str, *, setting: str = "habeat_database_url") -> None:
        self._conninfo = psycopg_conninfo(url)
        self._masked = masked_url(url)
        self._setting = setting
        self._conn: psycopg.Connection[Any] | None = None

    def listen(self) -> None:
        """LISTEN from now on, if not already: a notification sent from here until the
        next ``wait`` wakes it. The loop listens before it reads what is due, so that
        a change committed after that read is never slept through."""
        self._connection()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a notification; True if one came (since
        ``listen`` or the last ``wait``)."""
        conn = self._connection()
        try:
            woken = any(True for _ in conn.notifies(timeout=max(timeout, 0.0), stop_after=1))
            if woken:  # drain the rest, one wake-up is enough
                for _ in conn.notifies(timeout=0.0):
                    pass
            return woken
        except psycopg.Error as exc:
            self.close()
            raise StoreUnavailable(
                f"lost the LISTEN connection to PostgreSQL at {self._masked}: {exc}"
            ) from exc

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = self._listening_connection()
        return self._conn

    def _listening_connection(self) -> psycopg.Connection[Any]:
        """A new connection, kept only once it LISTENs on every channel."""
        # Keepalives: after a partition whose resets were lost, a half-open socket would
        # wait in silence for hours; these close it within a minute or so, and the next
        # pass opens another (a wake-up missed meanwhile costs only max_wait: the loop
        # does not rely on it). Waiting for notifications is idle: the server's idle
        # timeouts are off for it.
        conn = open_idle_connection(
            self._conninfo,
            self._masked,
            self._setting,
            keepalives=(LISTEN_KEEPALIVE_IDLE, LISTEN_KEEPALIVE_INTERVAL, LISTEN_KEEPALIVE_COUNT),
        )
        try:
            for channel in self.CHANNELS:
                conn.execute(f"LISTEN {channel}")
        except psycopg.Error as exc:
            conn.close()
            raise StoreUnavailable(f"PostgreSQL at {self._masked}: {exc}") from exc
        return conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None
