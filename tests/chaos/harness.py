"""The chaos harness: a real cluster on private servers, faults from a seeded plan,
then quiescence and the verdict (``tests.chaos.checks``).

    report = run_chaos(ChaosConfig(seed=7, duration=60))
    print(report.summary())

The cluster: 3 ``celery -A app beat`` and 4 ``celery -A app worker`` processes,
a private PostgreSQL and Redis (``tests.chaos.servers``), and between each beat
and each server a proxy (``tests.e2e.proxy.CuttableProxy``) that can cut or
stall that one link. Workers reach the servers directly: worker faults are
kills and pauses, and the server restarts, ``idle_session_timeout`` and broker
message losses hit them too. The workload is in ``tests.chaos.workload``; every
process runs with the broker's default visibility timeout (an hour), as in
production.

The fleet is mixed, as real ones are: the workers alternate the prefork and
threads pools; one beat and one worker run with a wall clock 2 minutes ahead,
one beat and one worker 2 minutes behind (``tests/clock_skew``: the servers
keep the true clock, and every check reads the database's); and one more
worker runs without this package (``tests.chaos.foreign_worker``), on the plain
tasks' queue that the package's workers consume too.

Every process of the package has a result backend (``CELERY_RESULT_BACKEND``), which
the workflow schedules' chords need: a private Redis of its own that no fault restarts
or cuts, as the docs advise (a chord's count is the backend's, and a Redis restarted
without persistence forgets it). The worker without the package has none (it runs no
step of a workflow).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from celery import Celery
from redis import Redis
from sqlalchemy import text

from app.factory import create_app
from beat.errors import HABeatError
from beat.leader.lost_messages import CHECK_INTERVAL, CONFIRM_AFTER, UNTAKEN_AFTER
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.leader import MAX_INTERRUPTIONS
from beat.store.runs import run_id_for
from tests.chaos.broker import delete_messages
from tests.chaos.checks import (
    FOREIGN_PREFIX,
    DeletedMessage,
    LeaderPause,
    Observations,
    RedisOutage,
    RunCounts,
    Verdict,
    WorkerKill,
    WorkerPause,
    judge,
)
from tests.chaos.faults import IDLE_SESSION_TIMEOUT, Fault, FaultKind, make_plan
from tests.chaos.jobs import CODE_SCHEDULES_ENV
from tests.chaos.plain_jobs import PLAIN_QUEUE
from tests.chaos.servers import PrivateRedis, find_binaries, private_servers, workspace
from tests.chaos.topologies import KINDS, Endpoints, Topology, topology_servers
from tests.chaos.workload import (
    WORKFLOW_SHAPES,
    ChainSender,
    CodeSchedule,
    WorkloadShape,
    create_crowd,
    create_tables,
    create_workload,
    sent_chains,
)
from tests.clock_skew import skew_overrides
from tests.conftest import SessionEnv
from tests.e2e.cluster import ROOT, Cluster, Process, wait_until
from tests.e2e.proxy import CuttableProxy

DATABASE = "habeat"
KEY_PREFIX = "chaos"
#: Seconds the processes get to start before the harness gives up.
STARTUP_TIMEOUT = 90.0
#: Threads per threads worker, processes per prefork worker (each one a full process).
WORKER_CONCURRENCY = 4
PREFORK_CONCURRENCY = 2
#: Queues of the package's workers: the default one and the plain tasks' one, which
#: the worker without the package consumes too.
WORKER_QUEUES = f"celery,{PLAIN_QUEUE}"
#: The start-up shims (each directory holds a ``sitecustomize``), put first on PYTHONPATH.
FOREIGN_DIR = Path(__file__).resolve().parent / "foreign"
FOREIGN_APP = "tests.chaos.foreign_worker"
#: Seconds a skewed process's wall clock is off (one ahead, one behind).
CLOCK_SKEW = 120.0
#: Seconds an aimed fault waits for its victim (a worker holding a received run, a
#: prefork and a threads worker each running one) before it takes what there is.
AIM_WAIT = 8.0
#: Task modules of every process: the e2e jobs and the chaos workload's own.
JOB_MODULES = "tests.e2e.jobs,tests.chaos.jobs"
#: Violations of each kind the summary lists.
SHOWN_PER_KIND = 8
#: Seconds the end phase waits for a chain's next link once the previous one finished.
NEXT_LINK_GRACE = 15.0
#: Seconds a beat gets to stop cleanly in a deploy before it is killed.
BEAT_STOP_TIMEOUT = 20.0
#: Seconds the end phase waits after the last execution by the worker without the
#: package: the leader's lost-message recovery would have sent such a run again by then.
FOREIGN_SETTLE = UNTAKEN_AFTER + CHECK_INTERVAL + CONFIRM_AFTER + 5.0


@dataclass(frozen=True, kw_only=True, slots=True)
class ChaosConfig:
    seed: int
    #: Seconds of fault injection (a run covers every fault kind, so it may run a little past).
    duration: float
    beats: int = 3
    #: Workers with the package: prefork and threads in turn.
    workers: int = 4
    #: Seconds the wall clock of the second beat and the third worker is ahead, and of
    #: the third beat and the fourth worker behind (0: every clock true).
    clock_skew: float = CLOCK_SKEW
    #: One more worker, without the package, on the plain tasks' queue.
    foreign_worker: bool = True
    #: Short timeouts so that recovery fits a short run; faults are sized from them.
    #: The broker's visibility timeout stays at its default (an hour): recovering
    #: lost messages is the leader's job, not the broker's.
    lock_ttl: float = 3.0
    lease_timeout: float = 4.0
    max_wait: float = 1.0
    misfire_grace: float = 60.0
    max_attempts: int = 3
    #: A long claim-ahead window: every beat holds runs armed for seconds (ten fire
    #: times of each 1-second schedule) through kills, pauses and deploys.
    claim_ahead: float = 10.0
    workload: WorkloadShape = field(default_factory=WorkloadShape)
    #: Bounds of the end phase: catching up the last fire times, then every run finishing.
    catch_up_timeout: float = 45.0
    quiescence_timeout: float = 90.0
    #: Copy every process's full log (and the servers') here at the end, if set.
    keep_logs: Path | None = None
    #: The servers the fleet runs on (``tests.chaos.topologies``).
    topology: Topology = Topology.DIRECT
    #: Only these fault kinds (of the topology's), for a short run; all of them if empty.
    only: tuple[FaultKind, ...] = ()

    @property
    def leader_hold(self) -> float:
        """Seconds of the leader row's hold (as ``beat.scheduler`` sizes it)."""
        return self.lock_ttl + self.max_wait + self.claim_ahead + self.lock_ttl

    @property
    def kinds(self) -> tuple[FaultKind, ...]:
        """The fault kinds this run injects, in the topology's order."""
        return tuple(kind for kind in KINDS[self.topology] if not self.only or kind in self.only)

    def process_settings(self) -> dict[str, str]:
        """Environment of every process (the e2e cluster adds the e2e jobs module)."""
        return {
            "HABEAT_LOCK_TTL": str(self.lock_ttl),
            "HABEAT_LEASE_TIMEOUT": str(self.lease_timeout),
            "HABEAT_MAX_WAIT": str(self.max_wait),
            "HABEAT_MISFIRE_GRACE": str(self.misfire_grace),
            "HABEAT_MAX_ATTEMPTS": str(self.max_attempts),
            "HABEAT_CLAIM_AHEAD": str(self.claim_ahead),
        }

    def reproduce(self) -> str:
        """The command that replays this run's fault plan."""
        sizes = (
            ""
            if (self.beats, self.workers) == (3, 4)
            else (f" --beats {self.beats} --workers {self.workers}")
        )
        ahead = "" if self.claim_ahead == 10.0 else f" --claim-ahead {self.claim_ahead:g}"
        skew = "" if self.clock_skew == CLOCK_SKEW else f" --clock-skew {self.clock_skew:g}"
        foreign = "" if self.foreign_worker else " --without-foreign-worker"
        topology = "" if self.topology is Topology.DIRECT else f" --topology {self.topology}"
        only = f" --only {','.join(kind.name for kind in self.kinds)}" if self.only else ""
        every = self.workload.workflow_every
        workflows = (
            " --without-workflows"
            if not every
            else ""
            if every == WorkloadShape().workflow_every
            else f" --workflow-every {every:g}"
        )
        return (
            f"scripts/chaos.sh --seed {self.seed} --duration {self.duration:g}"
            f"{sizes}{ahead}{skew}{foreign}{topology}{only}{workflows}"
        )

    def beat_skews(self) -> list[float]:
        """Each beat's clock skew: the second one ahead, the third behind."""
        return [_skew_of(index, self.clock_skew) for index in range(self.beats)]

    def fleet(self) -> list[WorkerSlot]:
        """The worker slots: prefork and threads in turn (the third one, prefork, ahead;
        the fourth, threads, behind), then the worker without the package (threads)."""
        slots = [
            WorkerSlot(
                index=index,
                pool="prefork" if index % 2 == 0 else "threads",
                skew=_skew_of(index - 1, self.clock_skew),
            )
            for index in range(self.workers)
        ]
        if self.foreign_worker:
            slots.append(WorkerSlot(index=self.workers, foreign=True))
        return slots


def _skew_of(index: int, skew: float) -> float:
    """Index 1 ahead by ``skew``, index 2 behind by it, the others true."""
    return {1: skew, 2: -skew}.get(index, 0.0)


@dataclass(kw_only=True)
class InjectionLog:
    injected: Counter[FaultKind] = field(default_factory=Counter)
    #: Faults that found no victim (no leader at that moment), by kind.
    missed: Counter[FaultKind] = field(default_factory=Counter)
    kills: list[WorkerKill] = field(default_factory=list)
    pauses: list[LeaderPause] = field(default_factory=list)
    #: Processes that exited without being killed (restarted by the harness).
    self_exits: list[str] = field(default_factory=list)
    deleted: list[DeletedMessage] = field(default_factory=list)
    #: (down, up) of each Redis restart.
    redis_restarts: list[tuple[datetime, datetime]] = field(default_factory=list)
    #: Each outage of the lease's Redis past the leader row's hold.
    redis_outages: list[RedisOutage] = field(default_factory=list)
    #: Worker kills the plan asked for but the harness left out: every busy worker
    #: held a run that plan kills had already interrupted ``max_attempts - 1`` times.
    kills_spared: int = 0
    worker_pauses: list[WorkerPause] = field(default_factory=list)
    #: Server restarts and the pools of the workers running a run when they began.
    restarts: list[tuple[FaultKind, frozenset[str]]] = field(default_factory=list)
    #: Lines where the worker without the package got a task it does not know (the
    #: harness routed something it cannot run to its queue).
    foreign_refusals: list[str] = field(default_factory=list)
    #: (kind, began, ended) of every fault injected, by the harness's (true) clock.
    timeline: list[tuple[FaultKind, datetime, datetime]] = field(default_factory=list)


@dataclass(kw_only=True)
class ChaosReport:
    config: ChaosConfig
    plan: list[Fault]
    log: InjectionLog
    code_schedule: CodeSchedule
    verdict: Verdict
    injection_seconds: float
    quiescence_seconds: float
    total_seconds: float
    #: The end of every process's log, kept when the run found a violation.
    logs_tail: str = ""
    #: Violations by the fault kinds their run lived through (see ``by_fault``).
    by_fault: dict[str, Counter[str]] = field(default_factory=dict)
    #: Rows written with psql among the crowd (each judged: quarantined, never fired).
    bad_rows: int = 0

    @property
    def violations(self) -> list[str]:
        # A beat must never exit by itself (nothing escapes its tick). A worker may:
        # Celery's consumer sometimes dies in kombu while reconnecting after a Redis
        # restart; a supervisor restarts it, as the harness does. Reported, not judged.
        beat_exits = [name for name in self.log.self_exits if name.startswith("beat")]
        return [
            *self.verdict.violations,
            *(f"{name} exited by itself" for name in beat_exits),
            *(f"harness: {line}" for line in self.log.foreign_refusals),
        ]

    def summary(self) -> str:
        return format_summary(self)


def now_utc() -> datetime:
    return datetime.now(UTC)


def say(message: str) -> None:
    print(f"[chaos {datetime.now(UTC):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


# -- the cluster ------------------------------------------------------------------------


@dataclass(kw_only=True)
class BeatSlot:
    name: str
    redis_proxy: CuttableProxy
    postgres_proxy: CuttableProxy
    process: Process | None = None
    #: Seconds its wall clock is off.
    skew: float = 0.0


@dataclass(kw_only=True)
class WorkerSlot:
    index: int
    generation: int = 0
    process: Process | None = None
    pool: str = "threads"
    #: Seconds its wall clock is off.
    skew: float = 0.0
    #: Runs without this package (``tests.chaos.foreign_worker``).
    foreign: bool = False

    @property
    def name(self) -> str:
        # A new name per incarnation: a run's `worker` column then tells them apart.
        return f"{FOREIGN_PREFIX if self.foreign else 'w'}{self.index}g{self.generation}"


def skewed_env(skew: float) -> dict[str, str]:
    """The environment that puts a process's wall clock ``skew`` seconds off."""
    if not skew:
        return {}
    return skew_overrides(skew, str(ROOT))


class ChaosCluster:
    """Beats behind their proxies and workers, each kept in a slot so a killed
    process is replaced by a new one in the same slot."""

    def __init__(self, cluster: Cluster, endpoints: Endpoints, config: ChaosConfig) -> None:
        self.cluster = cluster
        self.endpoints = endpoints
        self.postgres = endpoints.postgres
        self.redis = endpoints.redis
        self.beats = [
            BeatSlot(
                name=f"beat{index}",
                redis_proxy=CuttableProxy("127.0.0.1", endpoints.redis.port),
                postgres_proxy=CuttableProxy("127.0.0.1", endpoints.postgres_port),
                skew=skew,
            )
            for index, skew in enumerate(config.beat_skews())
        ]
        self.workers = config.fleet()

    def start_beat(self, slot: BeatSlot) -> None:
        redis_url = f"redis://127.0.0.1:{slot.redis_proxy.port}/0"
        slot.process = self.cluster.beat(
            slot.name,
            DATABASE_URL=self.endpoints.database_url(slot.postgres_proxy.port),
            REDIS_URL=self.endpoints.lease_url(redis_url),
            CELERY_BROKER_URL=self.endpoints.broker_url(redis_url),
            HABEAT_IMPORTS=JOB_MODULES,
            **skewed_env(slot.skew),
        )

    def start_worker(self, slot: WorkerSlot) -> None:
        if slot.foreign:
            slot.process = self._start_foreign(slot)
            return
        concurrency = PREFORK_CONCURRENCY if slot.pool == "prefork" else WORKER_CONCURRENCY
        slot.process = self.cluster.start(
            slot.name,
            "worker", "-l", "info", "-P", slot.pool, "-c", str(concurrency),
            "-n", f"{slot.name}@%h", "-Q", WORKER_QUEUES, "--without-gossip", "--without-mingle",
            HABEAT_IMPORTS=JOB_MODULES,
            **skewed_env(slot.skew),
        )  # fmt: skip

    def _start_foreign(self, slot: WorkerSlot) -> Process:
        """The worker without the package: its own app, the plain queue only, in an
        environment where ``import beat`` fails (``tests/chaos/foreign``)."""
        cluster = self.cluster
        log = cluster.workdir / f"{slot.name}.log"
        env = cluster.process_env() | {"PYTHONPATH": f"{FOREIGN_DIR}{os.pathsep}{ROOT}"}
        # Celery reads this variable itself: the worker without the package keeps its own
        # configuration (no result backend), as before the workflows had one.
        env.pop("CELERY_RESULT_BACKEND", None)
        with log.open("ab") as handle:
            popen = subprocess.Popen(
                [
                    sys.executable, "-m", "celery", "-A", FOREIGN_APP, "worker", "-l", "info",
                    "-P", slot.pool, "-c", str(WORKER_CONCURRENCY), "-n", f"{slot.name}@%h",
                    "-Q", PLAIN_QUEUE, "--without-gossip", "--without-mingle",
                ],
                cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
            )  # fmt: skip
        process = Process(name=slot.name, popen=popen, log=log)
        cluster.processes.append(process)
        return process

    def start_all(self) -> None:
        for beat in self.beats:
            self.start_beat(beat)
        for worker in self.workers:
            self.start_worker(worker)

    def stop_beats(self) -> None:
        """Stop every beat as a deploy does (SIGTERM: the leader hands over cleanly);
        one that does not stop within ``BEAT_STOP_TIMEOUT`` is killed."""
        running = [slot.process for slot in self.beats if slot.process and slot.process.alive()]
        for process in running:
            process.signal(signal.SIGTERM)
        deadline = time.monotonic() + BEAT_STOP_TIMEOUT
        for process in running:
            try:
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                say(f"{process.name} did not stop within {BEAT_STOP_TIMEOUT:.0f}s; killing it")
                process.signal(signal.SIGKILL)
                process.popen.wait(timeout=30)

    def leader(self) -> BeatSlot | None:
        """The slot whose live process holds the newest epoch (None if none, or unknown)."""
        term = self.leader_term()
        return None if term is None else term[0]

    def leader_term(self) -> tuple[BeatSlot, int] | None:
        """The leading slot and its epoch, read together from the leader row."""
        try:
            info = self.cluster.store.leader_info()
        except HABeatError:
            return None
        if info is None:
            return None
        pid = int(info.holder.split(":")[1])  # holders are host:pid:suffix
        for slot in self.beats:
            if slot.process is not None and slot.process.pid == pid and slot.process.alive():
                return slot, info.epoch
        return None

    def leader_epoch(self) -> int | None:
        try:
            holder = self.cluster.leader_holder()
        except HABeatError:
            return None
        return None if holder is None else holder[0]

    def restart_exited(self) -> list[str]:
        """Start a new process in every slot whose process exited; their names."""
        exited = []
        for beat in self.beats:
            if beat.process is not None and not beat.process.alive():
                exited.append(beat.name)
                self.start_beat(beat)
        for worker in self.workers:
            if worker.process is not None and not worker.process.alive():
                exited.append(worker.name)
                worker.generation += 1
                self.start_worker(worker)
        return exited

    def app(self) -> Celery:
        """A Celery app on the topology's broker, to send tasks from the harness."""
        redis_url = self.redis.url()
        return create_app(
            self.cluster.env.settings(
                redis_url=self.endpoints.lease_url(redis_url),
                broker_url=self.endpoints.broker_url(redis_url),
            )
        )

    def workers_ready(self) -> bool:
        return all(
            slot.process is not None and " ready." in slot.process.output() for slot in self.workers
        )

    def close(self) -> None:
        """Kill every process (the verdict is in already) and close the proxies."""
        for process in self.cluster.processes:
            if process.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)  # a stopped one cannot die
                    os.kill(process.pid, signal.SIGKILL)
            process.popen.wait(timeout=30)
        for beat in self.beats:
            beat.redis_proxy.close()
            beat.postgres_proxy.close()


# -- the workload ---------------------------------------------------------------------


def pause_code_schedules(store: Store, keep: str) -> None:
    """Pause the schedules beat synced from code (the demo jobs) but ``keep``, the
    workload's own: only the workload should fire (a pause made at runtime survives
    the restarts of beat)."""
    schedules = Schedules(store)
    for schedule in schedules.list():
        if schedule.name != keep:
            schedules.pause(schedule.name)


# -- the faults -------------------------------------------------------------------------


class Injector:
    """Injects the plan's faults one at a time, each healed before the next."""

    def __init__(
        self,
        chaos: ChaosCluster,
        store: Store,
        log: InjectionLog,
        *,
        code_schedule: CodeSchedule,
        config: ChaosConfig,
    ) -> None:
        self.chaos = chaos
        self.store = store
        self.log = log
        self.code_schedule = code_schedule
        self.config = config
        #: Runs held by workers the plan killed, and how many times each was.
        self.interrupted: Counter[uuid.UUID] = Counter()
        self._actions: dict[FaultKind, Callable[[Fault], bool]] = {
            FaultKind.BEAT_KILL: self._kill_beat,
            FaultKind.WORKER_KILL: self._kill_worker,
            FaultKind.LEADER_PAUSE: self._pause_leader,
            FaultKind.REDIS_RESTART: self._restart_redis,
            FaultKind.POSTGRES_RESTART: self._restart_postgres,
            FaultKind.BEAT_REDIS_CUT: lambda f: self._link_fault(f, "redis", "cut"),
            FaultKind.BEAT_REDIS_STALL: lambda f: self._link_fault(f, "redis", "stall"),
            FaultKind.BEAT_POSTGRES_CUT: lambda f: self._link_fault(f, "postgres", "cut"),
            FaultKind.BEAT_POSTGRES_STALL: lambda f: self._link_fault(f, "postgres", "stall"),
            FaultKind.BROKER_MESSAGE_LOSS: self._lose_messages,
            FaultKind.DEPLOY: self._deploy,
            FaultKind.WORKER_PAUSE: self._pause_worker,
            FaultKind.IDLE_SESSION_TIMEOUT: self._idle_session_timeout,
            FaultKind.RABBITMQ_RESTART: self._restart_rabbitmq,
            FaultKind.SENTINEL_FAILOVER: self._fail_over_redis,
            FaultKind.PGBOUNCER_RESTART: self._restart_pgbouncer,
            FaultKind.REDIS_OUTAGE: self._redis_outage,
        }

    def run(self, plan: list[Fault]) -> None:
        started = time.monotonic()
        for fault in plan:
            self.calm(until=started + fault.at)
            began = now_utc()
            if self._actions[fault.kind](fault):
                self.log.injected[fault.kind] += 1
                self.log.timeline.append((fault.kind, began, now_utc()))
            else:
                self.log.missed[fault.kind] += 1

    def calm(self, *, until: float) -> None:
        """Wait until ``until`` (monotonic), replacing processes that exited on their own."""
        while True:
            for name in self.chaos.restart_exited():
                say(f"{name} exited by itself; started it again")
                self.log.self_exits.append(name)
            left = until - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.5))

    def _target_beat(self, fault: Fault) -> BeatSlot:
        leader = self.chaos.leader() if fault.aimed else None
        beats = self.chaos.beats
        return leader or beats[int(fault.pick * len(beats))]

    def _kill_beat(self, fault: Fault) -> bool:
        slot = self._target_beat(fault)
        assert slot.process is not None
        say(f"SIGKILL {slot.name} (pid {slot.process.pid}); restart in {fault.duration:.1f}s")
        slot.process.signal(signal.SIGKILL)
        slot.process.popen.wait(timeout=30)
        time.sleep(fault.duration)
        self.chaos.start_beat(slot)
        return True

    def _package_workers(self) -> list[WorkerSlot]:
        """The workers the plan kills and pauses: not the one without the package (it
        records nothing, so a message it held when killed waits for the broker's
        visibility timeout, an hour: a loss no short run can tell from a bug)."""
        return [slot for slot in self.chaos.workers if not slot.foreign]

    def _kill_worker(self, fault: Fault) -> bool:
        held = self._runs_held_by_workers()
        candidates = killable_workers(
            self._package_workers(),
            held,
            self.interrupted,
            # Attempts interrupted by a worker's death do not use up a run's
            # max_attempts; the product gives up after MAX_INTERRUPTIONS of them.
            max_kills_per_run=MAX_INTERRUPTIONS,
            aimed=fault.aimed,
        )
        if not candidates:
            say("every worker holds a run the plan interrupted MAX_INTERRUPTIONS times; no kill")
            self.log.kills_spared += 1
            return False
        slot = candidates[int(fault.pick * len(candidates))]
        assert slot.process is not None
        runs = held.get(slot.name, ())
        self.interrupted.update(runs)
        say(
            f"SIGKILL worker {slot.name} holding {len(runs)} runs; new one in {fault.duration:.1f}s"
        )
        killed_at = now_utc()
        slot.process.signal(signal.SIGKILL)
        slot.process.popen.wait(timeout=30)
        self.log.kills.append(WorkerKill(killed_at=killed_at, worker=slot.name, held=tuple(runs)))
        time.sleep(fault.duration)
        slot.generation += 1
        self.chaos.start_worker(slot)
        return True

    def _runs_held_by_workers(
        self, *, received_only: bool = False
    ) -> dict[str, tuple[uuid.UUID, ...]]:
        """Runs a worker holds (running, or a retry waiting for its countdown) by worker
        name (the part of the hostname before the '@'); with ``received_only``, the runs
        it received and has not started (prefetched, or a retry held for its countdown)."""
        where = (
            "state IN ('queued', 'running', 'retrying') AND received_at IS NOT NULL"
            " AND started_at IS NULL"
            if received_only
            else "state IN ('running', 'retrying')"
        )
        held: dict[str, list[uuid.UUID]] = {}
        with self.store.engine.connect() as conn:
            for run_id, worker in conn.execute(
                text(f"SELECT id, worker FROM beat_runs WHERE {where} AND worker IS NOT NULL")
            ):
                held.setdefault((worker or "").split("@")[0], []).append(run_id)
        return {name: tuple(runs) for name, runs in held.items()}

    def _busy_pools(self) -> frozenset[str]:
        """The pools of the workers running a run right now (started, not finished)."""
        with self.store.engine.connect() as conn:
            workers = conn.execute(
                text(
                    "SELECT DISTINCT worker FROM beat_runs"
                    " WHERE state = 'running' AND started_at IS NOT NULL"
                )
            ).scalars()
            names = {(worker or "").split("@")[0] for worker in workers}
        return frozenset(slot.pool for slot in self.chaos.workers if slot.name in names)

    def _wait_for(self, found: Callable[[], object], *, aimed: bool) -> None:
        """An aimed fault waits up to ``AIM_WAIT`` for its moment (``found()`` true)."""
        deadline = time.monotonic() + (AIM_WAIT if aimed else 0.0)
        while not found() and time.monotonic() < deadline:
            time.sleep(0.2)

    def _pause_worker(self, fault: Fault) -> bool:
        """SIGSTOP a worker past its receipt lease while it holds runs, then SIGCONT.

        Aimed: one holding a run it received and has not started (a prefetched one,
        or a retry held for its countdown), which the leader sends again once the
        lease expires while the stopped worker still holds its copy."""
        workers = [slot for slot in self._package_workers() if slot.process is not None]
        self._wait_for(lambda: self._runs_held_by_workers(received_only=True), aimed=fault.aimed)
        received = self._runs_held_by_workers(received_only=True)
        running = self._runs_held_by_workers()
        preferred = [slot for slot in workers if received.get(slot.name)] or [
            slot for slot in workers if running.get(slot.name)
        ]
        candidates = preferred or workers
        slot = candidates[int(fault.pick * len(candidates))]
        assert slot.process is not None
        held = (*received.get(slot.name, ()), *running.get(slot.name, ()))
        say(
            f"SIGSTOP worker {slot.name} ({slot.pool}) holding {len(held)} runs"
            f" ({len(received.get(slot.name, ()))} not started) for {fault.duration:.1f}s"
        )
        stopped_at = now_utc()
        slot.process.signal(signal.SIGSTOP)
        time.sleep(fault.duration)
        slot.process.signal(signal.SIGCONT)
        self.log.worker_pauses.append(
            WorkerPause(worker=slot.name, stopped_at=stopped_at, resumed_at=now_utc(), held=held)
        )
        return True

    def _idle_session_timeout(self, fault: Fault) -> bool:
        """Set ``idle_session_timeout`` on the server for the fault's duration, then reset
        it: every session idle that long is ended by the server, no process dies."""
        say(f"PostgreSQL idle_session_timeout = {IDLE_SESSION_TIMEOUT} for {fault.duration:.1f}s")
        self._set_idle_session_timeout(IDLE_SESSION_TIMEOUT)
        try:
            time.sleep(fault.duration)
        finally:
            self._set_idle_session_timeout(None)
        return True

    def _set_idle_session_timeout(self, value: str | None) -> None:
        statement = (
            "ALTER SYSTEM RESET idle_session_timeout"
            if value is None
            else f"ALTER SYSTEM SET idle_session_timeout = '{value}'"
        )
        with psycopg.connect(self.chaos.postgres.admin_dsn, autocommit=True) as conn:
            conn.execute(statement)
            conn.execute("SELECT pg_reload_conf()")

    def _pause_leader(self, fault: Fault) -> bool:
        term = self._wait_for_leader(timeout=10.0)
        if term is None:
            say("no leader to pause within 10s")
            return False
        slot, epoch = term
        assert slot.process is not None
        say(f"SIGSTOP leader {slot.name} (epoch {epoch}) for {fault.duration:.1f}s")
        stopped_at = now_utc()
        slot.process.signal(signal.SIGSTOP)
        deadline = time.monotonic() + fault.duration
        taken_over = False
        while time.monotonic() < deadline:
            taken_over = taken_over or (self.chaos.leader_epoch() or 0) > epoch
            time.sleep(0.1)
        resumed_at = now_utc()
        slot.process.signal(signal.SIGCONT)
        self.log.pauses.append(
            LeaderPause(
                epoch=epoch, stopped_at=stopped_at, resumed_at=resumed_at, taken_over=taken_over
            )
        )
        say(f"SIGCONT {slot.name}; {'replaced' if taken_over else 'NOT replaced'} while stopped")
        return True

    def _wait_for_leader(self, timeout: float) -> tuple[BeatSlot, int] | None:
        """The leader's slot and epoch; a fault may have just left the cluster without one."""
        deadline = time.monotonic() + timeout
        while (term := self.chaos.leader_term()) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        return term

    def _lose_messages(self, fault: Fault) -> bool:
        """Delete a share (30 to 100 %, from the plan) of the waiting and unacked messages.

        Idle workers take a message the instant it is pushed, so a queue is mostly
        empty: the workers are first stopped for the fault's duration (less than a
        lease), as a busy cluster or a GC pause would hold them, and messages pile up."""
        share = 0.3 + 0.7 * fault.pick
        prefix = self.chaos.cluster.env.broker_key_prefix
        workers = [slot.process for slot in self.chaos.workers if slot.process is not None]
        for process in workers:
            process.signal(signal.SIGSTOP)
        client = Redis(port=self.chaos.endpoints.broker_redis_port(), socket_timeout=10)
        try:
            time.sleep(fault.duration)
            deletions = delete_messages(client, prefix, share, seed=f"{fault.at}")
        finally:
            client.close()
            for process in workers:
                process.signal(signal.SIGCONT)
        deleted_at = now_utc()
        states = self._run_states([deletion.task_id for deletion in deletions])
        for deletion in deletions:
            self.log.deleted.append(
                DeletedMessage(
                    task_id=deletion.task_id,
                    deleted_at=deleted_at,
                    where=deletion.where,
                    state=states.get(deletion.task_id),
                )
            )
        where = Counter(deletion.where for deletion in deletions)
        say(
            f"broker lost {where['queue']} waiting and {where['unacked']} unacked messages"
            f" ({share:.0%} of them) while the workers were stopped for {fault.duration:.1f}s"
        )
        return True

    def _run_states(self, task_ids: list[str]) -> dict[str, str]:
        """The state of each task's run; tasks without a run row are left out."""
        by_run = {run_id_for(task_id): task_id for task_id in task_ids}
        if not by_run:
            return {}
        with self.store.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT id, state FROM beat_runs WHERE id = ANY(:ids)"),
                {"ids": list(by_run)},
            )
            return {by_run[run_id]: state for run_id, state in rows}

    def _deploy(self, fault: Fault) -> bool:
        """Stop every beat, change the code schedule (its timing half the time), keep
        the beats down for the fault's duration, start them, wait for the sync."""
        timing = fault.pick < 0.5
        say(
            f"deploy: stopping every beat for {fault.duration:.1f}s; code schedule"
            f" v{self.code_schedule.version + 1}{' with a new timing' if timing else ''}"
        )
        stopped_at = now_utc()  # fire times from here on may be missed
        self.chaos.stop_beats()
        # With no beat running, the next fire time stays as the last claim left it.
        frozen = Schedules(self.store).get(self.code_schedule.name).next_fire_at
        self.code_schedule.change(timing=timing)
        time.sleep(fault.duration)
        for slot in self.chaos.beats:
            self.chaos.start_beat(slot)
        schedule = self.code_schedule.wait_for_sync(self.store, timeout=STARTUP_TIMEOUT)
        self.code_schedule.deployed(
            schedule, stopped_at=stopped_at, timing_changed=timing, next_fire_when_stopped=frozen
        )
        say(f"deploy: v{self.code_schedule.version} synced at {schedule.updated_at:%H:%M:%S.%f}")
        return True

    def _mid_run(self, fault: Fault) -> None:
        """Aimed: wait for a prefork and a threads worker each to be running a run, so
        the restart lands in the middle of runs on both pools; log what was running."""
        both = {"prefork", "threads"}
        self._wait_for(lambda: both <= self._busy_pools(), aimed=fault.aimed)
        pools = self._busy_pools()
        self.log.restarts.append((fault.kind, pools))
        say(f"{fault.kind} with runs running on: {', '.join(sorted(pools)) or 'no worker'}")

    def _restart_redis(self, fault: Fault) -> bool:
        self._mid_run(fault)
        say(f"Redis down for {fault.duration:.1f}s (its queue and lease are lost)")
        down_at = now_utc()
        self.chaos.redis.stop()
        time.sleep(fault.duration)
        self.chaos.redis.start()
        if self.chaos.endpoints.rabbitmq is None:  # the broker's messages went with it
            self.log.redis_restarts.append((down_at, now_utc()))
        return True

    def _redis_outage(self, fault: Fault) -> bool:
        """Stop the lease's Redis (not the broker: RabbitMQ) for longer than the leader
        row's hold; note each epoch that led meanwhile, as PostgreSQL's row names it."""
        self._mid_run(fault)
        say(f"lease's Redis down for {fault.duration:.1f}s, past the leader's hold")
        down_at = now_utc()
        self.chaos.redis.stop()
        epochs: list[int] = []
        deadline = time.monotonic() + fault.duration
        while time.monotonic() < deadline:
            term = self.chaos.leader_term()
            if term is not None and term[1] not in epochs:
                epochs.append(term[1])
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        self.chaos.redis.start()
        hold = self.config.leader_hold
        self.log.redis_outages.append(
            RedisOutage(down=down_at, up=now_utc(), hold=hold, epochs=tuple(epochs))
        )
        say(f"lease's Redis back; epochs that led on PostgreSQL's row meanwhile: {epochs}")
        return True

    def _fail_over_redis(self, fault: Fault) -> bool:
        """SIGKILL the Sentinel primary (the lease's and the broker's): the sentinels
        promote the replica; what it had not replicated yet is lost, as in a restart."""
        sentinels = self.chaos.endpoints.sentinels
        assert sentinels is not None
        self._mid_run(fault)
        say(f"Redis primary SIGKILL; the old one down {fault.duration:.1f}s after the failover")
        down_at = now_utc()
        sentinels.fail_over(down=fault.duration)
        self.log.redis_restarts.append((down_at, now_utc()))
        say(f"Sentinel failover done: primary now on port {sentinels.primary()[1]}")
        return True

    def _restart_rabbitmq(self, fault: Fault) -> bool:
        """Stop RabbitMQ as an operator does and start it again: durable queues and
        persistent messages survive; every connection and unacked delivery does not."""
        rabbitmq = self.chaos.endpoints.rabbitmq
        assert rabbitmq is not None
        self._mid_run(fault)
        began = time.monotonic()
        rabbitmq.stop()
        time.sleep(fault.duration)
        rabbitmq.start()
        say(f"RabbitMQ restarted: down {time.monotonic() - began:.1f}s")
        return True

    def _restart_pgbouncer(self, fault: Fault) -> bool:
        """Stop PgBouncer at once (every client's connection dropped, transactions in
        flight aborted) and start it again on its port."""
        pgbouncer = self.chaos.endpoints.pgbouncer
        assert pgbouncer is not None
        self._mid_run(fault)
        say(f"PgBouncer down for {fault.duration:.1f}s")
        pgbouncer.restart(down=fault.duration)
        return True

    def _restart_postgres(self, fault: Fault) -> bool:
        self._mid_run(fault)
        say(f"PostgreSQL crash (immediate stop), down for {fault.duration:.1f}s")
        self.chaos.postgres.stop("immediate")
        time.sleep(fault.duration)
        self.chaos.postgres.start()
        return True

    def _link_fault(self, fault: Fault, server: str, how: str) -> bool:
        slot = self._target_beat(fault)
        proxy = slot.redis_proxy if server == "redis" else slot.postgres_proxy
        leads = slot is self.chaos.leader()
        say(f"{how} {slot.name}{' (leader)' if leads else ''} <-> {server}: {fault.duration:.1f}s")
        if how == "cut":
            proxy.cut()
            time.sleep(fault.duration)
            proxy.heal()
        else:
            proxy.stall()
            time.sleep(fault.duration)
            proxy.unstall()
        return True


def killable_workers(
    workers: list[WorkerSlot],
    held: Mapping[str, tuple[uuid.UUID, ...]],
    interrupted: Counter[uuid.UUID],
    *,
    max_kills_per_run: int,
    aimed: bool,
) -> list[WorkerSlot]:
    """The workers a worker kill may pick.

    Aimed: a worker in the middle of a run, so the kill needs the reaper. Never
    one holding a run that plan kills already interrupted ``max_kills_per_run``
    times: the product excuses a run whose worker died (it does not use up its
    ``max_attempts``) only that often, so that a task that kills every worker
    which takes it ends ``lost`` instead of looping."""
    spared = [
        slot
        for slot in workers
        if all(interrupted[run] < max_kills_per_run for run in held.get(slot.name, ()))
    ]
    busy = [slot for slot in spared if held.get(slot.name)]
    return busy if aimed and busy else spared


def foreign_refusals(chaos: ChaosCluster) -> list[str]:
    """The worker without the package must only get tasks it knows: any it refused
    would make a run wait for the visibility timeout through the harness's fault."""
    lines = []
    for slot in chaos.workers:
        if slot.foreign and slot.process is not None:
            for log in chaos.cluster.workdir.glob(f"{FOREIGN_PREFIX}{slot.index}g*.log"):
                output = log.read_text(errors="replace")
                lines += [line for line in output.splitlines() if "unregistered task" in line]
    return lines


# -- the end phase ------------------------------------------------------------------------


def quiesce(store: Store, names: list[str], config: ChaosConfig) -> tuple[datetime, float]:
    """Let the cluster catch up, pause every schedule, wait for every run to finish.

    Returns the end of the checked window (every fire time up to it must have
    been claimed) and the seconds the runs took to settle. Both waits are bounded:
    what is not done by then shows up in the verdict."""
    window_end = store.now()
    with contextlib.suppress(AssertionError):
        wait_until(lambda: _due_before(store, window_end) == 0, config.catch_up_timeout, 0.5)
    schedules = Schedules(store)
    for name in names:
        schedules.pause(name)
    started = time.monotonic()
    with contextlib.suppress(AssertionError):
        wait_until(lambda: _settled(store, config), config.quiescence_timeout, 0.5)
    return window_end, time.monotonic() - started


def _settled(store: Store, config: ChaosConfig) -> bool:
    """No run unfinished, no chain waiting for a worker to send its next link, and no
    run the worker without the package executed recently enough to be sent again."""
    return (
        _unfinished(store) == 0
        and _chains_between_links(store) == 0
        and (not config.foreign_worker or _since_last_foreign_execution(store) > FOREIGN_SETTLE)
    )


def _since_last_foreign_execution(store: Store) -> float:
    with store.engine.connect() as conn:
        seconds: float | None = conn.execute(
            text(
                "SELECT extract(epoch FROM now() - max(at)) FROM e2e_effects"
                " WHERE worker LIKE :prefix"
            ),
            {"prefix": f"{FOREIGN_PREFIX}%"},
        ).scalar_one()
    return float("inf") if seconds is None else float(seconds)


def _chains_between_links(store: Store) -> int:
    """Sent chains whose link succeeded less than ``NEXT_LINK_GRACE`` ago while the next
    link has no run yet (its worker is sending it): the end phase waits for them."""
    chains = [chain for chain in sent_chains(store) if not chain.send_failed]
    run_ids = [run_id_for(task_id) for chain in chains for task_id in chain.task_ids]
    with store.engine.connect() as conn:
        now = conn.execute(text("SELECT now()")).scalar_one()
        finished: dict[uuid.UUID, datetime] = dict(
            conn.execute(
                text("SELECT id, finished_at FROM beat_runs WHERE id = ANY(:ids)"),
                {"ids": run_ids},
            ).all()
        )
    waiting = 0
    for chain in chains:
        ids = [run_id_for(task_id) for task_id in chain.task_ids]
        for done, following in itertools.pairwise(ids):
            finished_at = finished.get(done)
            if following not in finished and finished_at is not None:
                waiting += (now - finished_at).total_seconds() < NEXT_LINK_GRACE
    return waiting


def _due_before(store: Store, moment: datetime) -> int:
    with store.engine.connect() as conn:
        count: int = conn.execute(
            text("SELECT count(*) FROM beat_schedules WHERE enabled AND next_fire_at <= :moment"),
            {"moment": moment},
        ).scalar_one()
        return count


def _unfinished(store: Store) -> int:
    """Runs not finished, but those the worker without the package executed: nothing
    records their end (they stay waiting, with their effect)."""
    with store.engine.connect() as conn:
        count: int = conn.execute(
            text(
                "SELECT count(*) FROM beat_runs AS r"
                " WHERE state IN ('pending', 'queued', 'running', 'retrying')"
                " AND NOT (state IN ('pending', 'queued', 'retrying') AND EXISTS"
                " (SELECT FROM e2e_effects WHERE task_id = r.id::text AND worker LIKE :prefix))"
            ),
            {"prefix": f"{FOREIGN_PREFIX}%"},
        ).scalar_one()
        return count


# -- the run ------------------------------------------------------------------------------


def keep_logs(workdir: Path, destination: Path) -> None:
    destination.mkdir(parents=True, exist_ok=True)
    for log in workdir.glob("*.log"):
        shutil.copy(log, destination / log.name)
    say(f"logs kept in {destination}")


#: Tables ``keep_tables`` copies (the rows the verdict was made from).
KEPT_TABLES = ("beat_runs", "e2e_effects", "chaos_attempts", "chaos_chains")


def keep_tables(store: Store, destination: Path) -> None:
    """Copy the runs, effects, attempts and chains as CSV files to ``destination``: the
    rows of a violation's runs (a workflow's steps, say) once the servers are gone."""
    destination.mkdir(parents=True, exist_ok=True)
    try:
        connection = store.engine.raw_connection()
        try:
            cursor = connection.cursor()
            for table in KEPT_TABLES:
                with (
                    (destination / f"{table}.csv").open("wb") as out,
                    cursor.copy(f"COPY {table} TO STDOUT WITH (FORMAT csv, HEADER)") as copy,
                ):
                    for data in copy:
                        out.write(bytes(data))
        finally:
            connection.close()
    except Exception as exc:  # the database is down: the logs are kept all the same
        say(f"could not keep the tables: {exc}")
        return
    say(f"tables kept in {destination} ({', '.join(KEPT_TABLES)})")


@contextlib.contextmanager
def results_server(workdir: Path, config: ChaosConfig) -> Iterator[str | None]:
    """The result backend's URL of a run with workflows (a private Redis of its own,
    which no fault restarts or cuts); None without workflows."""
    if not config.workload.workflow_every:
        yield None
        return
    directory = workdir / "results"
    directory.mkdir()
    server = PrivateRedis(find_binaries().redis_server, directory)
    server.start()
    try:
        yield server.url()
    finally:
        server.stop()


def run_chaos(config: ChaosConfig) -> ChaosReport:
    """One chaos run (see the module docstring); raises MissingBinaries before starting
    anything if PostgreSQL or Redis is not installed."""
    find_binaries()
    plan = make_plan(
        config.seed,
        config.duration,
        lock_ttl=config.lock_ttl,
        lease_timeout=config.lease_timeout,
        hold=config.leader_hold,
        kinds=config.kinds,
    )
    planned_end = plan[-1].at + plan[-1].duration
    say(f"seed {config.seed}, {config.topology}: {len(plan)} faults over {planned_end:.0f}s")
    started = time.monotonic()
    with (
        workspace() as workdir,
        private_servers(workdir) as (postgres, redis),
        topology_servers(config.topology, workdir, postgres, redis, DATABASE) as endpoints,
        results_server(workdir, config) as results,
    ):
        env = SessionEnv(
            database_url=postgres.url(DATABASE), redis_url=redis.url(), key_prefix=KEY_PREFIX
        )
        store = Store.connect(env.database_url, leader_name=KEY_PREFIX)
        try:
            store.migrate()
            create_tables(store)
            code_schedule = CodeSchedule(path=workdir / "code-schedules.json")
            code_schedule.write()
            # The workflows' chords count in a result backend of their own, which the
            # faults leave alone, as the docs advise (a chord's count is the backend's: a
            # Redis restarted without persistence forgets it).
            backend = {"CELERY_RESULT_BACKEND": results} if results else {}
            settings = (
                config.process_settings()
                | endpoints.worker_env()
                | {CODE_SCHEDULES_ENV: str(code_schedule.path)}
                | backend
            )
            cluster = Cluster(env=env, store=store, workdir=workdir, settings=settings)
            chaos = ChaosCluster(cluster, endpoints, config)
            try:
                return _run(chaos, store, config, plan, code_schedule, planned_end, started)
            finally:
                chaos.close()
                if config.keep_logs is not None:
                    keep_logs(workdir, config.keep_logs)
                    keep_tables(store, config.keep_logs)
        finally:
            store.dispose()


def _run(
    chaos: ChaosCluster,
    store: Store,
    config: ChaosConfig,
    plan: list[Fault],
    code_schedule: CodeSchedule,
    planned_end: float,
    started: float,
) -> ChaosReport:
    chaos.start_all()
    wait_until(lambda: chaos.leader() is not None, STARTUP_TIMEOUT, 0.2)
    wait_until(chaos.workers_ready, STARTUP_TIMEOUT, 0.2)
    say(f"cluster up after {time.monotonic() - started:.1f}s; creating the schedules")
    pause_code_schedules(store, keep=code_schedule.name)
    code_schedule.start_expecting(store)
    expectations = create_workload(
        store, config.workload, until=store.now() + timedelta(seconds=planned_end)
    )
    crowd, bad_rows = create_crowd(store, config.workload)
    expectations += crowd
    log = InjectionLog()
    injector = Injector(chaos, store, log, code_schedule=code_schedule, config=config)
    chains = ChainSender(store, chaos.app, config.workload.chain_every, config.seed)
    injection_started = time.monotonic()
    chains.start()
    try:
        injector.run(plan)
    finally:
        chains.stop()
    injector.calm(until=time.monotonic() + 1)  # replace what a last fault left dead
    injection_seconds = time.monotonic() - injection_started
    say(f"faults done after {injection_seconds:.0f}s; waiting for quiescence")
    expectations += code_schedule.expectations
    window_end, quiescence = quiesce(store, sorted({e.name for e in expectations}), config)
    seen = Observations(
        kills=log.kills,
        pauses=log.pauses,
        chains=sent_chains(store),
        deleted=log.deleted,
        redis_restarts=log.redis_restarts,
        redis_outages=log.redis_outages,
        self_exits=log.self_exits,
        worker_pauses=log.worker_pauses,
        foreign_queues=frozenset({PLAIN_QUEUE} if config.foreign_worker else ()),
    )
    verdict = judge(store, expectations, window_end=window_end, seen=seen, bad_rows=bad_rows)
    log.foreign_refusals = foreign_refusals(chaos)
    lives = run_lives(store, verdict.violations)
    report = ChaosReport(
        config=config,
        plan=plan,
        log=log,
        code_schedule=code_schedule,
        verdict=verdict,
        injection_seconds=injection_seconds,
        quiescence_seconds=quiescence,
        total_seconds=time.monotonic() - started,
        by_fault=by_fault(verdict.violations, lives, log.timeline),
        bad_rows=len(bad_rows),
    )
    if report.violations:
        report.logs_tail = chaos.cluster.logs() + lines_naming(chaos, report.violations)
    return report


def lines_naming(chaos: ChaosCluster, violations: list[str]) -> str:
    """Every process's log lines that name a violation's run, last (a failure's output
    keeps the end of the logs): what each process did with the run, whenever it did it."""
    subjects = {match.group(1) for item in violations for match in _SUBJECT.finditer(item)}
    if not subjects:
        return ""
    found = [
        f"{process.name}: {line}"
        for process in chaos.cluster.processes
        for line in process.output().splitlines()
        if any(subject in line for subject in subjects)
    ]
    return "\n===== lines naming the violations' runs =====\n" + "\n".join(found[-200:])


# -- violations by fault kind -------------------------------------------------------------

#: The run or task a violation names.
_SUBJECT = re.compile(r"\b(?:run|task|link) ([0-9A-Za-z-]{8,})")
#: A fault's effects outlast it (a recovery, a lease running out): seconds added to it.
AFTERMATH = timedelta(seconds=10)
#: Columns of the table: a violation's kind (the word before its colon) -> column.
COLUMNS = {
    "lost": "lost",
    "duplicated": "executed twice",
    "stuck": "stuck",
    "early": "early",
    "expired but ran": "early",
    "unexpected": "unexpected",
}
NO_FAULT = "(no fault while it lived)"
NOT_PLACED = "(no run to place in time)"


def run_lives(store: Store, violations: list[str]) -> dict[str, tuple[datetime, datetime]]:
    """From its fire (or claim) time to its end (or now), for each run a violation names."""
    ids = {run_id_for(match.group(1)) for v in violations if (match := _SUBJECT.search(v))}
    if not ids:
        return {}
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id, coalesce(fire_at, claimed_at), coalesce(finished_at, now())"
                " FROM beat_runs WHERE id = ANY(:ids)"
            ),
            {"ids": list(ids)},
        )
        return {str(run_id): (began, ended) for run_id, began, ended in rows}


def by_fault(
    violations: list[str],
    lives: Mapping[str, tuple[datetime, datetime]],
    timeline: list[tuple[FaultKind, datetime, datetime]],
) -> dict[str, Counter[str]]:
    """Each violation counted under every fault kind its run lived through (a fault
    from its start to ``AFTERMATH`` after its end), or under ``NO_FAULT``: what a kind
    of fault costs, and what the fleet's shape (a skewed clock, a worker without the
    package) costs with no fault at all."""
    table: dict[str, Counter[str]] = {}
    for violation in violations:
        column = COLUMNS.get(violation.split(":")[0], "other")
        match = _SUBJECT.search(violation)
        life = lives.get(str(run_id_for(match.group(1)))) if match else None
        if life is None:
            rows = [NOT_PLACED]
        else:
            start, end = life
            kinds = {
                k for k, began, ended in timeline if began <= end and start <= ended + AFTERMATH
            }
            rows = sorted(kinds) or [NO_FAULT]
        for row in rows:
            table.setdefault(row, Counter())[column] += 1
    return table


def format_by_fault(table: dict[str, Counter[str]]) -> list[str]:
    """The table of violations by fault kind (columns in ``COLUMNS`` order)."""
    columns = list(dict.fromkeys(COLUMNS.values()))
    width = max(len(row) for row in table)
    lines = [
        "violations by the faults their run lived through (a run may count under several):",
        f"  {'':{width}}  " + "  ".join(columns),
    ]
    for row, counts in table.items():
        cells = "  ".join(f"{counts[column]:>{len(column)}}" for column in columns)
        lines.append(f"  {row:{width}}  {cells}")
    return lines


# -- the summary ----------------------------------------------------------------------------


def format_summary(report: ChaosReport) -> str:
    config, verdict, log = report.config, report.verdict, report.log
    reclaims = verdict.reclaim_times
    fenced = [pause for pause in log.pauses if pause.taken_over]
    rows = [
        ("topology", str(config.topology)),
        *(
            (f"fault: {kind}", f"{log.injected[kind]}" + _missed(log, kind))
            for kind in config.kinds
        ),
        ("faults injected", str(sum(log.injected.values()))),
        ("fleet", _fleet(report)),
        ("runs expected / seen", f"{verdict.expected} / {verdict.seen}"),
        ("lost", str(len(verdict.lost))),
        ("executed twice (duplicated)", str(verdict.executed_twice)),
        ("stuck", str(len(verdict.stuck))),
        ("unexpected", str(len(verdict.unexpected))),
        ("early (published/received/started)", str(len(verdict.early))),
        ("started after their expiry", str(len(verdict.late))),
        ("run states", ", ".join(f"{k} {v}" for k, v in sorted(verdict.states.items()))),
        *_workload_rows(report),
        ("max failover gap", _gap(verdict)),
        (
            "lateness of 1 s fire times",
            f"max {verdict.max_lateness:.2f} s, p99 {verdict.p99_lateness:.2f} s",
        ),
        (
            "max reclaim time",
            f"{max(reclaims):.2f} s ({len(reclaims)} runs of killed workers finished elsewhere)"
            if reclaims
            else "- (no killed worker held a run)",
        ),
        ("runs started more than once", str(verdict.restarted_runs)),
        ("duplicate deliveries refused", str(verdict.duplicate_deliveries)),
        (
            "fencing",
            f"{len(fenced)} of {len(log.pauses)} paused leaders replaced while stopped;"
            f" {verdict.stale_writes} runs written by one after it woke",
        ),
        ("processes exited by themselves", ", ".join(log.self_exits) or "none"),
        (
            "time",
            f"{report.injection_seconds:.0f} s of faults,"
            f" quiescence {report.quiescence_seconds:.1f} s, {report.total_seconds:.0f} s in all",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [
        f"chaos run: seed {config.seed}, duration {config.duration:g} s,"
        f" {config.beats} beats + {len(config.fleet())} workers",
        *(f"  {name.ljust(width)}  {value}" for name, value in rows),
    ]
    violations = report.violations
    if report.by_fault:
        lines.extend(format_by_fault(report.by_fault))
    if violations:
        lines.append(
            f"FAILED: {len(violations)} violations (the first {SHOWN_PER_KIND} of each kind):"
        )
        lines.extend(f"  - {violation}" for violation in _first_of_each_kind(violations))
        lines.append(f"reproduce: {config.reproduce()}")
    else:
        lines.append(_ok_line(report.verdict.counts))
    return "\n".join(lines)


def _ok_line(counts: RunCounts) -> str:
    """The verdict without a violation, naming what the mixed fleet's documented costs
    left apart (the worker without the package cannot refuse a second message)."""
    apart = len(counts.twice_with_foreign) + len(counts.lost_to_unrecorded_consumers)
    waiting = len(counts.waiting_for_visibility)
    if not apart and not waiting:
        return "OK: every fire time ran exactly once, every effect exists exactly once"
    return (
        "OK: every fire time ran exactly once and every effect exists exactly once, but for"
        f" the mixed fleet's documented costs: {apart} plain runs ran twice or ended lost"
        f" where a worker without the package took a copy, {waiting} wait for the"
        " visibility timeout"
    )


def _first_of_each_kind(violations: list[str]) -> list[str]:
    """The first ``SHOWN_PER_KIND`` violations of each kind (the word before the colon)."""
    shown: Counter[str] = Counter()
    first = []
    for violation in violations:
        kind = violation.split(":")[0]
        shown[kind] += 1
        if shown[kind] <= SHOWN_PER_KIND:
            first.append(violation)
    return first


def _workload_rows(report: ChaosReport) -> list[tuple[str, str]]:
    """The summary's rows about the kinds of work beyond plain fire times."""
    counts, log = report.verdict.counts, report.log
    recoveries = counts.message_loss_recoveries
    deploys = report.code_schedule.deploys
    return [
        (
            "plain runs",
            f"{counts.plain} ({counts.plain_succeeded} succeeded,"
            f" {len(counts.plain_interrupted)} interrupted by a kill)",
        ),
        ("retrying runs", f"{counts.retried_runs} runs retried {counts.retries} times in all"),
        ("expired runs", str(counts.expired)),
        (
            "crowd firing every minute",
            f"{report.config.workload.crowd_schedules} crons beside {report.bad_rows} rows"
            " written with psql (each quarantined with its reason, none fired); lateness max"
            f" {report.verdict.crowd_max_lateness:.2f} s,"
            f" p99 {report.verdict.crowd_p99_lateness:.2f} s",
        ),
        (
            "ad hoc chains",
            f"{counts.chains_completed} of {counts.chains_sent} completed"
            f" ({counts.chain_links} links); cut where a message no worker had taken was"
            f" lost: {counts.chains_cut_by_message_loss} by a message loss,"
            f" {counts.chains_cut_by_redis_restart} by a Redis restart",
        ),
        (
            "message-loss recoveries",
            f"{len(recoveries)} runs republished of {counts.messages_deleted} messages deleted"
            + (f", max delay {max(recoveries):.1f} s" if recoveries else ""),
        ),
        (
            "deploys",
            f"{len(deploys)} ({sum(d.timing_changed for d in deploys)} with a new timing);"
            f" {counts.deploy_skipped} missed fire times recorded skipped",
        ),
        (
            "claimed ahead, cancelled by the end's pause",
            f"{counts.cancelled_by_the_end} runs, none of which ran",
        ),
        (
            "worker kills spared",
            f"{log.kills_spared} (one run interrupted MAX_INTERRUPTIONS times)",
        ),
        (
            "worker without the package",
            f"{counts.plain_by_foreign} plain runs executed by it (once);"
            f" {len(counts.waiting_for_visibility)} plain runs whose message the broker lost"
            " wait for the visibility timeout;"
            f" {len(counts.lost_to_unrecorded_consumers)} ended lost: their message came back"
            " and it may have run them;"
            f" {len(counts.twice_with_foreign)} ran twice, once on it (it cannot refuse a"
            " second message)",
        ),
        ("retries checked against their countdown", str(counts.retries_checked)),
        *_workflow_rows(report),
        ("server restarts mid-run", _restarts(log, report.config.kinds)),
        ("lease's Redis down past the hold", _outages(report) or "none"),
        (
            "worker pauses past the lease",
            f"{len(log.worker_pauses)}, holding {sum(len(p.held) for p in log.worker_pauses)} runs",
        ),
    ]


def _workflow_rows(report: ChaosReport) -> list[tuple[str, str]]:
    """The summary's rows about the workflow schedules (``tests.chaos.workload``)."""
    counts, shape = report.verdict.counts, report.config.workload
    if not shape.workflow_every:
        return [("workflow runs", "none (workflow_every 0)")]
    return [
        (
            "workflow runs",
            f"{counts.workflow_runs} of {len(WORKFLOW_SHAPES)} schedules every"
            f" {shape.workflow_every:g} s ({counts.workflows_succeeded} succeeded with every"
            " step once)",
        ),
        (
            "workflow steps",
            f"{counts.workflow_steps} recorded of {counts.workflow_steps_planned} planned,"
            f" {counts.workflow_steps_succeeded} succeeded;"
            f" {counts.workflow_steps_restarted} started again after an interruption",
        ),
        ("workflow runs lost", str(len(counts.workflows_lost))),
        ("workflow steps executed twice", str(len(counts.workflow_steps_twice))),
        ("workflow runs or steps stuck", str(len(counts.workflows_stuck))),
        (
            "workflow runs cancelled by the end's pause",
            f"{len(counts.workflows_run_though_cancelled)} whose steps ran all the same",
        ),
    ]


def _fleet(report: ChaosReport) -> str:
    config = report.config

    def clock(skew: float) -> str:
        return f" {skew:+g} s" if skew else ""

    beats = ", ".join(f"beat{clock(skew)}" for skew in config.beat_skews())
    workers = ", ".join(
        "without the package" if slot.foreign else f"{slot.pool}{clock(slot.skew)}"
        for slot in config.fleet()
    )
    return f"{beats}; {workers}"


#: The faults that stop a server (``Injector._mid_run`` aims them at runs running).
SERVER_FAULTS = (
    FaultKind.POSTGRES_RESTART,
    FaultKind.REDIS_RESTART,
    FaultKind.RABBITMQ_RESTART,
    FaultKind.SENTINEL_FAILOVER,
    FaultKind.PGBOUNCER_RESTART,
    FaultKind.REDIS_OUTAGE,
)


def _outages(report: ChaosReport) -> str:
    """Each outage of the lease's Redis: how long, the epochs on the row, the gap."""
    return "; ".join(
        f"{(outage.up - outage.down).total_seconds():.1f} s down, epochs {list(outage.epochs)},"
        f" longest without a claim {gap:.2f} s"
        for outage, gap in zip(report.log.redis_outages, report.verdict.outage_gaps, strict=True)
    )


def _restarts(log: InjectionLog, kinds: tuple[FaultKind, ...]) -> str:
    """Per server: restarts, and how many began with runs running on both pools / one."""
    parts = []
    for kind in (kind for kind in SERVER_FAULTS if kind in kinds):
        pools = [busy for restart, busy in log.restarts if restart == kind]
        both = sum(1 for busy in pools if {"prefork", "threads"} <= busy)
        some = sum(1 for busy in pools if busy)
        parts.append(f"{kind}: {len(pools)}, {some} mid-run ({both} on prefork and threads)")
    return "; ".join(parts)


def _missed(log: InjectionLog, kind: FaultKind) -> str:
    return f" ({log.missed[kind]} found no victim)" if log.missed[kind] else ""


def _gap(verdict: Verdict) -> str:
    began = verdict.max_claim_gap_from
    when = f" from {began:%H:%M:%S}" if began is not None else ""
    return f"{verdict.max_claim_gap:.2f} s{when} (longest time without a claim)"
