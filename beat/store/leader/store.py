"""The leader's store, composed of its parts: one class, so the leader and the tools
hold one object on one engine, each part on its own concern."""

from __future__ import annotations

from beat.store.db import create_store_engine
from beat.store.leader.claim import ClaimStatements
from beat.store.leader.cluster import ClusterReads
from beat.store.leader.hold import HoldStatements
from beat.store.leader.incident_reads import IncidentReads
from beat.store.leader.lost_messages import LostMessageStatements
from beat.store.leader.monitors import MonitorStatements
from beat.store.leader.notifications import NotificationStatements
from beat.store.leader.outbox import OutboxStatements
from beat.store.leader.reaper import ReaperStatements
from beat.store.leader.retention import RetentionStatements
from beat.store.leader.run_monitors import RunMonitorStatements
from beat.store.leader.sessions import SessionStatements
from beat.store.leader.stall import StallStatements
from beat.store.leader.term import TermStatements
from beat.store.leader.wakeups import WakeupStatements


class LeaderStore(
    TermStatements,
    HoldStatements,
    SessionStatements,
    ClaimStatements,
    OutboxStatements,
    ReaperStatements,
    LostMessageStatements,
    WakeupStatements,
    RetentionStatements,
    MonitorStatements,
    RunMonitorStatements,
    IncidentReads,
    NotificationStatements,
    StallStatements,
    ClusterReads,
):
    """PostgreSQL access for the leader of cluster ``leader_name``: every write fenced."""

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        leader_name: str = "habeat",
        pool_size: int = 5,
        setting: str = "habeat_database_url",
    ) -> LeaderStore:
        """A store on ``url``; no connection is made until first use."""
        engine = create_store_engine(url, pool_size=pool_size)
        return cls(engine, leader_name=leader_name, setting=setting)
