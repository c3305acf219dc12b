"""Every role's store on one engine: for operators' tools, benchmarks and tests.

The scheduler's own code uses the store of each role:
:class:`beat.schedule_store.ScheduleStore` (the schedules table),
:class:`beat.leader_store.LeaderStore` (what the leader writes, fenced by its
epoch) and :class:`beat.run_store.RunStore` (what workers write).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, Row, select

from beat.db import create_store_engine
from beat.leader_store import LeaderStore
from beat.schedule_store import ScheduleStore
from beat.tables import runs


class Store(ScheduleStore, LeaderStore):
    """The schedules and the leader's tables, on one engine."""

    def __init__(
        self, engine: Engine, *, leader_name: str = "habeat", setting: str = "habeat_database_url"
    ) -> None:
        LeaderStore.__init__(self, engine, leader_name=leader_name, setting=setting)

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        leader_name: str = "habeat",
        pool_size: int = 5,
        setting: str = "habeat_database_url",
    ) -> Store:
        """A store on ``url``; no connection is made until first use."""
        engine = create_store_engine(url, pool_size=pool_size)
        return cls(engine, leader_name=leader_name, setting=setting)

    def runs_of(self, schedule_name: str | None = None, *, limit: int = 100) -> list[Row[Any]]:
        query = select(runs).order_by(runs.c.fire_at.desc().nulls_last(), runs.c.claimed_at.desc())
        if schedule_name is not None:
            query = query.where(runs.c.schedule_name == schedule_name)
        with self._transaction() as conn:
            return list(conn.execute(query.limit(limit)))
