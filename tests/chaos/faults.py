"""The fault plan: which fault happens when, drawn in advance from a seeded RNG.

Every random number is drawn here, before the run starts, so a seed always
gives the same sequence of faults, durations and victim picks (the victims
themselves depend on who leads at that moment, which the plan cannot know: it
carries a number in [0, 1) that picks among the candidates of the moment).

Faults happen one at a time, each healed before the next: the checks can then
expect every fire time to run, since no outage outlasts the misfire grace.

Some faults change state rather than cut something off: a broker message loss
deletes messages from the workers' queues and from kombu's ``unacked`` hash (a
Redis that lost keys), a deploy stops every beat, changes a code schedule and
starts them again once a few of its fire times have passed, and
``idle_session_timeout`` makes PostgreSQL end every session idle a few seconds
(no process dies, no server restarts). A Redis outage keeps the lease's Redis down
for longer than the leader row's hold, with PostgreSQL and the broker up: a beat
must lead on the row meanwhile (``beat.lease.database_hold``). A worker pause
stops a worker (SIGSTOP, a VM pause or a long GC) past its receipt lease while it
holds runs, then lets it go on.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass


class FaultKind(enum.StrEnum):
    BEAT_KILL = "beat SIGKILL"
    WORKER_KILL = "worker SIGKILL"
    LEADER_PAUSE = "leader SIGSTOP+SIGCONT"
    REDIS_RESTART = "Redis restart"
    POSTGRES_RESTART = "PostgreSQL restart"
    BEAT_REDIS_CUT = "beat-Redis cut"
    BEAT_REDIS_STALL = "beat-Redis stall"
    BEAT_POSTGRES_CUT = "beat-PostgreSQL cut"
    BEAT_POSTGRES_STALL = "beat-PostgreSQL stall"
    BROKER_MESSAGE_LOSS = "broker message loss"
    DEPLOY = "deploy"
    WORKER_PAUSE = "worker SIGSTOP+SIGCONT"
    IDLE_SESSION_TIMEOUT = "PostgreSQL idle_session_timeout"
    # The faults of a server only some topologies have (``tests.chaos.topologies``).
    RABBITMQ_RESTART = "RabbitMQ restart"
    SENTINEL_FAILOVER = "Redis primary SIGKILL, Sentinel failover"
    PGBOUNCER_RESTART = "PgBouncer restart"
    REDIS_OUTAGE = "lease's Redis down past the leader's hold"


#: The kinds of the topology every process of which reaches one PostgreSQL and one Redis
#: directly; the others add or leave out kinds (``tests.chaos.topologies``).
DIRECT_KINDS = tuple(
    kind
    for kind in FaultKind
    if kind
    not in {
        FaultKind.RABBITMQ_RESTART,
        FaultKind.SENTINEL_FAILOVER,
        FaultKind.PGBOUNCER_RESTART,
        # Where Redis is the broker too, nothing can be sent while it is down.
        FaultKind.REDIS_OUTAGE,
    }
)


#: Relative frequency of each kind once every kind has happened once: process
#: deaths are the everyday fault, server restarts the rare one.
WEIGHTS = {
    FaultKind.BEAT_KILL: 3,
    FaultKind.WORKER_KILL: 4,
    FaultKind.LEADER_PAUSE: 2,
    FaultKind.REDIS_RESTART: 1,
    FaultKind.POSTGRES_RESTART: 1,
    FaultKind.BEAT_REDIS_CUT: 1,
    FaultKind.BEAT_REDIS_STALL: 1,
    FaultKind.BEAT_POSTGRES_CUT: 1,
    FaultKind.BEAT_POSTGRES_STALL: 1,
    FaultKind.BROKER_MESSAGE_LOSS: 1,
    FaultKind.DEPLOY: 1,
    FaultKind.WORKER_PAUSE: 2,
    FaultKind.IDLE_SESSION_TIMEOUT: 1,
    FaultKind.RABBITMQ_RESTART: 1,
    FaultKind.SENTINEL_FAILOVER: 2,
    FaultKind.PGBOUNCER_RESTART: 1,
    FaultKind.REDIS_OUTAGE: 1,
}
#: Seconds of calm between two faults (the cluster may still be recovering).
GAP = (1.0, 4.0)
#: Probability that a fault picks the interesting victim (see ``Fault.aimed``).
AIM_BIAS = 0.6
#: Seconds every beat stays down in a deploy: past a few fire times of the
#: deployed schedule (every 2 to 4 s), well within the misfire grace.
DEPLOY_DOWNTIME = (8.0, 14.0)
#: The ``idle_session_timeout`` the fault sets, and the seconds it stays set: long
#: enough that sessions left idle (a beacon, a pooled connection) are ended.
IDLE_SESSION_TIMEOUT = "6s"
IDLE_TIMEOUT_WINDOW = (10.0, 14.5)
#: The leader row's hold of the chaos fleet's settings: its longest step (a lock TTL,
#: ``max_wait`` and ``claim_ahead``) and a lock TTL more (``beat.scheduler``).
FLEET_HOLD = 3.0 + 1.0 + 10.0 + 3.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Fault:
    #: Seconds after injection starts.
    at: float
    kind: FaultKind
    #: How long the fault lasts: a pause, a cut or stall, a server down, or the
    #: delay before a killed process is started again.
    duration: float
    #: Picks the victim among the candidates when the fault happens, in [0, 1).
    pick: float
    #: Aim at the interesting victim: the leading beat, a worker in the middle of a run
    #: (a paused one: holding a run it received and has not started), or for a server
    #: restart, a moment when a prefork and a threads worker each run a run.
    aimed: bool


def durations(
    lock_ttl: float, lease_timeout: float, *, hold: float = FLEET_HOLD
) -> dict[FaultKind, tuple[float, float]]:
    """Range of each kind's duration, in seconds.

    A pause outlasts the lock TTL by at least 2.5 s (a standby's poll and its
    takeover), so a standby replaces the leader while it is stopped (the fencing
    case); cuts and stalls last about one TTL either side,
    so some leaders ride them out and some lose the lease. A message loss stops
    the workers for well under their lease (so messages wait in the queue to be
    lost, and no lease expires); a deploy keeps every beat down for a few fire
    times of the deployed schedule (see ``DEPLOY_DOWNTIME``). A worker pause
    outlasts the worker's lease by 2 to 6 s: the leader acts on the expired lease
    while the worker still holds its runs. A Redis outage outlasts the leader row's
    ``hold`` and a lock TTL more by 3 to 8 s: whoever led on Redis has lost the row by
    then, so scheduling goes on only if a beat leads on the row.
    """
    return {
        FaultKind.BEAT_KILL: (0.2, 2.0),
        FaultKind.WORKER_KILL: (0.2, 2.0),
        FaultKind.LEADER_PAUSE: (lock_ttl + 2.5, lock_ttl + 5.0),
        FaultKind.REDIS_RESTART: (0.5, 3.0),
        FaultKind.POSTGRES_RESTART: (0.5, 3.0),
        FaultKind.BEAT_REDIS_CUT: (lock_ttl * 0.5, lock_ttl * 2),
        FaultKind.BEAT_REDIS_STALL: (lock_ttl * 0.5, lock_ttl * 2),
        FaultKind.BEAT_POSTGRES_CUT: (lock_ttl * 0.5, lock_ttl * 2),
        FaultKind.BEAT_POSTGRES_STALL: (lock_ttl * 0.5, lock_ttl * 2),
        FaultKind.BROKER_MESSAGE_LOSS: (1.0, lease_timeout * 0.6),
        FaultKind.DEPLOY: DEPLOY_DOWNTIME,
        FaultKind.WORKER_PAUSE: (lease_timeout + 2.0, lease_timeout + 6.0),
        FaultKind.IDLE_SESSION_TIMEOUT: IDLE_TIMEOUT_WINDOW,
        # Seconds the node stays stopped (its stop and start take seconds more).
        FaultKind.RABBITMQ_RESTART: (0.5, 3.0),
        # Seconds the killed primary stays down after the sentinels promoted its replica.
        FaultKind.SENTINEL_FAILOVER: (0.5, 3.0),
        FaultKind.PGBOUNCER_RESTART: (0.5, 3.0),
        FaultKind.REDIS_OUTAGE: (hold + lock_ttl + 3.0, hold + lock_ttl + 8.0),
    }


def make_plan(
    seed: int,
    duration: float,
    *,
    lock_ttl: float,
    lease_timeout: float,
    hold: float = FLEET_HOLD,
    kinds: Sequence[FaultKind] = DIRECT_KINDS,
) -> list[Fault]:
    """Faults of ``kinds`` for ``duration`` seconds of injection; every kind happens at
    least once (first, in a seeded order), so a short run may run a little past
    ``duration``."""
    rng = random.Random(seed)
    first_of_each = list(kinds)
    rng.shuffle(first_of_each)
    ranges = durations(lock_ttl, lease_timeout, hold=hold)
    weights = [WEIGHTS[kind] for kind in kinds]
    plan: list[Fault] = []
    at = rng.uniform(*GAP)
    while at < duration or first_of_each:
        kind = first_of_each.pop(0) if first_of_each else rng.choices(list(kinds), weights)[0]
        fault = Fault(
            at=round(at, 3),
            kind=kind,
            duration=round(rng.uniform(*ranges[kind]), 3),
            pick=rng.random(),
            aimed=rng.random() < AIM_BIAS,
        )
        plan.append(fault)
        at += fault.duration + rng.uniform(*GAP)
    return plan
