"""Crash detection's reads (``beat.lease.beacon``): the leader, and the running runs,
whose database session is proven gone, for Redis to confirm."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, and_, case, column, literal, literal_column, select, text

from beat.models import RunState
from beat.records import RedisHalf, SessionlessRun
from beat.store.db import SERVER_INCARNATION
from beat.store.leader.base import FencedStore
from beat.store.tables import beacons, leader, runs, workers


class SessionStatements(FencedStore):
    """Who holds a lease or a run with a database session proven gone."""

    def leader_without_session(self) -> tuple[str, RedisHalf] | None:
        """(holder, Redis half of its beacon) of the recorded leader if the database
        session of its beacon is proven gone (``beat.lease.beacon``); None while it is
        listed, when it was opened on another server, when none was recorded, or when
        there is no leader. Whether its process died is for its Redis connection to
        confirm."""
        query = (
            select(leader.c.holder, beacons.c.name, beacons.c.redis_server)
            .join(beacons, beacons.c.name == leader.c.beacon)
            .where(leader.c.name == self.leader_name, session_gone(beacons))
        )
        with self._transaction() as conn:
            row = conn.execute(query).one_or_none()
        if row is None:
            return None
        return row.holder, RedisHalf(name=row.name, server=row.redis_server)

    def runs_without_session(self, *, limit: int) -> list[SessionlessRun]:
        """Running runs whose worker process's database session is proven gone:
        candidates for a crash, for Redis to confirm; each with the beacon of its
        worker's main process if that session is proven gone too."""
        own = beacons.alias("own")
        main = beacons.alias("main")
        query = (
            select(
                runs.c.id,
                own.c.name,
                own.c.redis_server,
                case((session_gone(main), main.c.name)).label("worker"),
                main.c.redis_server.label("worker_server"),
            )
            .select_from(
                runs.join(own, own.c.name == runs.c.beacon)
                .outerjoin(workers, workers.c.name == runs.c.worker)
                .outerjoin(main, main.c.name == workers.c.beacon)
            )
            .where(runs.c.state == RunState.RUNNING.value, session_gone(own))
            .limit(limit)
        )
        with self._transaction() as conn:
            return [
                SessionlessRun(
                    id=row.id,
                    beacon=RedisHalf(name=row.name, server=row.redis_server),
                    worker_beacon=None
                    if row.worker is None
                    else RedisHalf(name=row.worker, server=row.worker_server),
                )
                for row in conn.execute(query)
            ]


def session_gone(beacon: Any) -> ColumnElement[bool]:
    """SQL: the database session of a beacon (a row of ``beat_beacons``) is proven gone:
    it was opened on the server answering now (the same incarnation: not restarted,
    not failed over, no crash of a backend since) and that server no longer lists it
    (``beat.lease.beacon``). A pid listed again by a newer session reads as alive: the
    lease then decides."""
    listed = (
        select(literal(1))
        .select_from(text("pg_stat_activity"))
        .where(column("pid") == beacon.c.session_pid)
    )
    return and_(
        beacon.c.postgres_server == literal_column(f"({SERVER_INCARNATION})"), ~listed.exists()
    )
