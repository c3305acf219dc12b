"""Every role's store on one engine: for operators' tools, benchmarks and tests.

The scheduler's own code uses the store of each role:
:class:`beat.store.schedules.ScheduleStore` (the schedules table),
:class:`beat.store.leader.LeaderStore` (what the leader writes, fenced by its
epoch) and :class:`beat.store.runs.RunStore` (what workers write).
"""

from __future__ import annotations

from sqlalchemy import Engine

from beat.store.api_tokens import ApiTokens
from beat.store.channels import ChannelStatements
from beat.store.db import create_store_engine
from beat.store.leader import LeaderStore
from beat.store.schedules import ScheduleStore


class Store(ScheduleStore, LeaderStore, ChannelStatements, ApiTokens):
    """The schedules, the leader's tables, the notification channels and the API's
    tokens, on one engine."""

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
