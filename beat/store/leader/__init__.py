"""What the leader writes, each statement fenced by its epoch. Callers get domain
objects and domain errors (``beat.errors``), never rows or driver exceptions; time is
the database's ``now()``: one clock for all nodes.

:class:`LeaderStore` (``store``) is composed of one part per concern, each a class on
the shared :class:`~beat.store.leader.base.FencedStore` (the engine, the cluster's
leader row and the fence every write takes): the leader row and its epoch (``term``),
the row's hold (``hold``), the sessions crash detection finds gone (``sessions``), the
claim (``claim``, with the due rows it reads in ``due_rows``), the outbox (``outbox``),
the reaper (``reaper``), lost-message recovery and expiry (``lost_messages``), the times
the leader wakes at (``wakeups``), retention (``retention``), the failing monitor's pass
and the incidents (``monitors``), the incidents as operators read them
(``incident_reads``) and what operators read about the cluster (``cluster``). What the
store returns is in ``records``; the LISTEN connection that wakes the loop is
``listener``. The parts import each other, never this package."""

from beat.store.leader.incident_reads import IncidentList
from beat.store.leader.listener import ScheduleChangeListener
from beat.store.leader.lost_messages import MAX_SENDS
from beat.store.leader.monitors import MonitorReport
from beat.store.leader.reaper import MAX_INTERRUPTIONS
from beat.store.leader.records import (
    Claim,
    InQueue,
    LeaderInfo,
    LostRun,
    PruneReport,
    QueueBacklog,
    QueueOf,
    Reclaim,
    Unconfirmed,
    UnrecordedConsumer,
    WorkerPresence,
)
from beat.store.leader.store import LeaderStore

__all__ = [
    "MAX_INTERRUPTIONS",
    "MAX_SENDS",
    "Claim",
    "InQueue",
    "IncidentList",
    "LeaderInfo",
    "LeaderStore",
    "LostRun",
    "MonitorReport",
    "PruneReport",
    "QueueBacklog",
    "QueueOf",
    "Reclaim",
    "ScheduleChangeListener",
    "Unconfirmed",
    "UnrecordedConsumer",
    "WorkerPresence",
]
