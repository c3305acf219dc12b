"""The chaos harness: a real cluster on private servers, faults from a seeded plan,
then quiescence and the verdict (``tests.chaos.checks``).

    report = run_chaos(ChaosConfig(seed=7, duration=60))
    print(report.summary())

The cluster: 3 ``celery -A app beat`` and 3 ``celery -A app worker`` processes,
a private PostgreSQL and Redis (``tests.chaos.servers``), and between each beat
and each server a proxy (``tests.e2e.proxy.CuttableProxy``) that can cut or
stall that one link. Workers reach the servers directly: worker faults are
kills, and the server restarts hit them too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text

from beat.api import Schedules
from beat.errors import HABeatError
from beat.store import Store
from beat.timing import parse_zone
from tests.chaos.checks import SECOND_KIND, Expectation, LeaderPause, Verdict, WorkerKill, judge
from tests.chaos.faults import Fault, FaultKind, make_plan
from tests.chaos.servers import PrivatePostgres, PrivateRedis, find_binaries
from tests.conftest import SessionEnv
from tests.e2e.cluster import Cluster, Process, wait_until
from tests.e2e.proxy import CuttableProxy

DATABASE = "habeat"
KEY_PREFIX = "chaos"
#: Seconds the processes get to start before the harness gives up.
STARTUP_TIMEOUT = 90.0
#: Threads per worker (the e2e cluster's default pool is threads).
WORKER_CONCURRENCY = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class ChaosConfig:
    seed: int
    #: Seconds of fault injection (a run covers every fault kind, so it may run a little past).
    duration: float
    beats: int = 3
    workers: int = 3
    #: Short timeouts so that recovery fits a short run; faults are sized from them.
    lock_ttl: float = 3.0
    lease_timeout: float = 4.0
    visibility_timeout: int = 5
    max_wait: float = 1.0
    misfire_grace: float = 60.0
    #: The workload: 1-second intervals (quick job), 1-minute crons and one-offs (slow job,
    #: so that worker kills catch runs mid-job and the reaper has work).
    second_schedules: int = 4
    minute_crons: int = 2
    one_off_every: float = 3.0
    slow_job_seconds: float = 2.0
    #: Bounds of the end phase: catching up the last fire times, then every run finishing.
    catch_up_timeout: float = 45.0
    quiescence_timeout: float = 90.0
    #: Copy every process's full log (and the servers') here at the end, if set.
    keep_logs: Path | None = None

    def process_settings(self) -> dict[str, str]:
        """Environment of every process (the e2e cluster adds the e2e jobs module)."""
        return {
            "HABEAT_LOCK_TTL": str(self.lock_ttl),
            "HABEAT_LEASE_TIMEOUT": str(self.lease_timeout),
            "HABEAT_VISIBILITY_TIMEOUT": str(self.visibility_timeout),
            "HABEAT_MAX_WAIT": str(self.max_wait),
            "HABEAT_MISFIRE_GRACE": str(self.misfire_grace),
        }

    def reproduce(self) -> str:
        """The command that replays this run's fault plan."""
        sizes = (
            ""
            if (self.beats, self.workers) == (3, 3)
            else (f" --beats {self.beats} --workers {self.workers}")
        )
        return f"scripts/chaos.sh --seed {self.seed} --duration {self.duration:g}{sizes}"


@dataclass(kw_only=True)
class InjectionLog:
    injected: Counter[FaultKind] = field(default_factory=Counter)
    #: Faults that found no victim (no leader at that moment), by kind.
    missed: Counter[FaultKind] = field(default_factory=Counter)
    kills: list[WorkerKill] = field(default_factory=list)
    pauses: list[LeaderPause] = field(default_factory=list)
    #: Processes that exited without being killed (restarted by the harness).
    self_exits: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class ChaosReport:
    config: ChaosConfig
    plan: list[Fault]
    log: InjectionLog
    verdict: Verdict
    injection_seconds: float
    quiescence_seconds: float
    total_seconds: float
    #: The end of every process's log, kept when the run found a violation.
    logs_tail: str = ""

    @property
    def violations(self) -> list[str]:
        # A beat must never exit by itself (nothing escapes its tick). A worker may:
        # Celery's consumer sometimes dies in kombu while reconnecting after a Redis
        # restart; a supervisor restarts it, as the harness does. Reported, not judged.
        beat_exits = [name for name in self.log.self_exits if name.startswith("beat")]
        return [
            *self.verdict.violations,
            *(f"{name} exited by itself" for name in beat_exits),
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


@dataclass(kw_only=True)
class WorkerSlot:
    index: int
    generation: int = 0
    process: Process | None = None

    @property
    def name(self) -> str:
        # A new name per incarnation: a run's `worker` column then tells them apart.
        return f"w{self.index}g{self.generation}"


class ChaosCluster:
    """Beats behind their proxies and workers, each kept in a slot so a killed
    process is replaced by a new one in the same slot."""

    def __init__(
        self, cluster: Cluster, postgres: PrivatePostgres, redis: PrivateRedis, config: ChaosConfig
    ) -> None:
        self.cluster = cluster
        self.postgres = postgres
        self.redis = redis
        self.beats = [
            BeatSlot(
                name=f"beat{index}",
                redis_proxy=CuttableProxy("127.0.0.1", redis.port),
                postgres_proxy=CuttableProxy("127.0.0.1", postgres.port),
            )
            for index in range(config.beats)
        ]
        self.workers = [WorkerSlot(index=index) for index in range(config.workers)]

    def start_beat(self, slot: BeatSlot) -> None:
        redis_url = f"redis://127.0.0.1:{slot.redis_proxy.port}/0"
        slot.process = self.cluster.beat(
            slot.name,
            DATABASE_URL=f"postgresql+psycopg://postgres@127.0.0.1:{slot.postgres_proxy.port}/"
            + DATABASE,
            REDIS_URL=redis_url,
            CELERY_BROKER_URL=redis_url,
        )

    def start_worker(self, slot: WorkerSlot) -> None:
        slot.process = self.cluster.worker(slot.name, concurrency=WORKER_CONCURRENCY)

    def start_all(self) -> None:
        for beat in self.beats:
            self.start_beat(beat)
        for worker in self.workers:
            self.start_worker(worker)

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


def create_workload(store: Store, config: ChaosConfig, until: datetime) -> list[Expectation]:
    """1-second intervals, 1-minute crons and one-offs every few seconds up to ``until``."""
    schedules = Schedules(store)
    anchor = store.now() + timedelta(seconds=1)
    created = []
    for index in range(config.second_schedules):
        created.append(
            (
                SECOND_KIND,
                schedules.create(
                    f"every-second-{index}",
                    "e2e.record",
                    every=1,
                    start_at=anchor,
                    args=[f"s{index}"],
                    allow_unregistered=True,
                ),
            )
        )
    for index in range(config.minute_crons):
        created.append(
            (
                "cron 1 min",
                schedules.create(
                    f"every-minute-{index}",
                    "e2e.slow",
                    cron="* * * * *",
                    args=[f"m{index}", config.slow_job_seconds],
                    allow_unregistered=True,
                ),
            )
        )
    at, index = anchor + timedelta(seconds=config.one_off_every), 0
    while at < until:
        created.append(
            (
                "one-off",
                schedules.create(
                    f"once-{index:04d}",
                    "e2e.slow",
                    at=at,
                    args=[f"o{index}", config.slow_job_seconds],
                    allow_unregistered=True,
                ),
            )
        )
        at, index = at + timedelta(seconds=config.one_off_every), index + 1
    expectations = []
    for kind, schedule in created:
        assert schedule.next_fire_at is not None
        expectations.append(
            Expectation(
                name=schedule.name,
                kind=kind,
                trigger=schedule.definition.trigger,
                zone=parse_zone(schedule.definition.timezone),
                first_fire=schedule.next_fire_at,
            )
        )
    return expectations


def pause_code_schedules(store: Store) -> None:
    """Pause the schedules beat synced from code (the demo jobs): only the workload
    should fire (a pause made at runtime survives the restarts of beat)."""
    schedules = Schedules(store)
    for schedule in schedules.list():
        schedules.pause(schedule.name)


def create_effects_table(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS e2e_effects"
                " (task_id text NOT NULL, label text, at timestamptz DEFAULT now())"
            )
        )


# -- the faults -------------------------------------------------------------------------


class Injector:
    """Injects the plan's faults one at a time, each healed before the next."""

    def __init__(self, chaos: ChaosCluster, store: Store, log: InjectionLog) -> None:
        self.chaos = chaos
        self.store = store
        self.log = log
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
        }

    def run(self, plan: list[Fault]) -> None:
        started = time.monotonic()
        for fault in plan:
            self.calm(until=started + fault.at)
            if self._actions[fault.kind](fault):
                self.log.injected[fault.kind] += 1
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

    def _kill_worker(self, fault: Fault) -> bool:
        held = self._runs_held_by_workers()
        busy = [slot for slot in self.chaos.workers if held.get(slot.name)]
        # Aimed: a worker in the middle of a run, so the kill needs the reaper.
        candidates = busy if fault.aimed and busy else self.chaos.workers
        slot = candidates[int(fault.pick * len(candidates))]
        assert slot.process is not None
        runs = held.get(slot.name, ())
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

    def _runs_held_by_workers(self) -> dict[str, tuple[uuid.UUID, ...]]:
        """Running runs by worker name (the part of the hostname before the '@')."""
        held: dict[str, list[uuid.UUID]] = {}
        with self.store.engine.connect() as conn:
            for run_id, worker in conn.execute(
                text("SELECT id, worker FROM beat_runs WHERE state = 'running'")
            ):
                held.setdefault((worker or "").split("@")[0], []).append(run_id)
        return {name: tuple(runs) for name, runs in held.items()}

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

    def _restart_redis(self, fault: Fault) -> bool:
        say(f"Redis down for {fault.duration:.1f}s (its queue and lease are lost)")
        self.chaos.redis.stop()
        time.sleep(fault.duration)
        self.chaos.redis.start()
        return True

    def _restart_postgres(self, fault: Fault) -> bool:
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
        wait_until(lambda: _unfinished(store) == 0, config.quiescence_timeout, 0.5)
    return window_end, time.monotonic() - started


def _due_before(store: Store, moment: datetime) -> int:
    with store.engine.connect() as conn:
        count: int = conn.execute(
            text("SELECT count(*) FROM beat_schedules WHERE enabled AND next_fire_at <= :moment"),
            {"moment": moment},
        ).scalar_one()
        return count


def _unfinished(store: Store) -> int:
    with store.engine.connect() as conn:
        count: int = conn.execute(
            text(
                "SELECT count(*) FROM beat_runs"
                " WHERE state IN ('pending', 'queued', 'running', 'retrying')"
            )
        ).scalar_one()
        return count


# -- the run ------------------------------------------------------------------------------


@contextlib.contextmanager
def private_servers(workdir: Path) -> Iterator[tuple[PrivatePostgres, PrivateRedis]]:
    binaries = find_binaries()
    postgres = PrivatePostgres(binaries, workdir)
    redis = PrivateRedis(binaries.redis_server, workdir)
    try:
        postgres.init()
        postgres.start()
        redis.start()
        yield postgres, redis
    finally:
        redis.stop()
        if postgres.running():
            postgres.stop("immediate")


@contextlib.contextmanager
def workspace() -> Iterator[Path]:
    """A temporary directory the postgres account can enter (as root it runs initdb)."""
    path = Path(tempfile.mkdtemp(prefix="habeat-chaos-"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def keep_logs(workdir: Path, destination: Path) -> None:
    destination.mkdir(parents=True, exist_ok=True)
    for log in workdir.glob("*.log"):
        shutil.copy(log, destination / log.name)
    say(f"logs kept in {destination}")


def run_chaos(config: ChaosConfig) -> ChaosReport:
    """One chaos run (see the module docstring); raises MissingBinaries before starting
    anything if PostgreSQL or Redis is not installed."""
    find_binaries()
    plan = make_plan(config.seed, config.duration, lock_ttl=config.lock_ttl)
    planned_end = plan[-1].at + plan[-1].duration
    say(f"seed {config.seed}: {len(plan)} faults over {planned_end:.0f}s")
    started = time.monotonic()
    with workspace() as workdir, private_servers(workdir) as (postgres, redis):
        env = SessionEnv(
            database_url=postgres.url(DATABASE), redis_url=redis.url(), key_prefix=KEY_PREFIX
        )
        store = Store.connect(env.database_url, leader_name=KEY_PREFIX)
        try:
            store.migrate()
            create_effects_table(store)
            cluster = Cluster(
                env=env, store=store, workdir=workdir, settings=config.process_settings()
            )
            chaos = ChaosCluster(cluster, postgres, redis, config)
            try:
                return _run(chaos, store, config, plan, planned_end, started)
            finally:
                chaos.close()
                if config.keep_logs is not None:
                    keep_logs(workdir, config.keep_logs)
        finally:
            store.dispose()


def _run(
    chaos: ChaosCluster,
    store: Store,
    config: ChaosConfig,
    plan: list[Fault],
    planned_end: float,
    started: float,
) -> ChaosReport:
    chaos.start_all()
    wait_until(lambda: chaos.leader() is not None, STARTUP_TIMEOUT, 0.2)
    wait_until(chaos.workers_ready, STARTUP_TIMEOUT, 0.2)
    say(f"cluster up after {time.monotonic() - started:.1f}s; creating the schedules")
    pause_code_schedules(store)
    expectations = create_workload(
        store, config, until=store.now() + timedelta(seconds=planned_end)
    )
    log = InjectionLog()
    injector = Injector(chaos, store, log)
    injection_started = time.monotonic()
    injector.run(plan)
    injector.calm(until=time.monotonic() + 1)  # replace what a last fault left dead
    injection_seconds = time.monotonic() - injection_started
    say(f"faults done after {injection_seconds:.0f}s; waiting for quiescence")
    window_end, quiescence = quiesce(store, [e.name for e in expectations], config)
    verdict = judge(store, expectations, window_end=window_end, kills=log.kills, pauses=log.pauses)
    report = ChaosReport(
        config=config,
        plan=plan,
        log=log,
        verdict=verdict,
        injection_seconds=injection_seconds,
        quiescence_seconds=quiescence,
        total_seconds=time.monotonic() - started,
    )
    if report.violations:
        report.logs_tail = chaos.cluster.logs()
    return report


# -- the summary ----------------------------------------------------------------------------


def format_summary(report: ChaosReport) -> str:
    config, verdict, log = report.config, report.verdict, report.log
    reclaims = verdict.reclaim_times
    fenced = [pause for pause in log.pauses if pause.taken_over]
    rows = [
        *((f"fault: {kind}", f"{log.injected[kind]}" + _missed(log, kind)) for kind in FaultKind),
        ("faults injected", str(sum(log.injected.values()))),
        ("runs expected / seen", f"{verdict.expected} / {verdict.seen}"),
        ("lost", str(len(verdict.lost))),
        ("duplicated", str(len(verdict.duplicated))),
        ("stuck", str(len(verdict.stuck))),
        ("unexpected", str(len(verdict.unexpected))),
        ("run states", ", ".join(f"{k} {v}" for k, v in sorted(verdict.states.items()))),
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
        f" {config.beats} beats + {config.workers} workers",
        *(f"  {name.ljust(width)}  {value}" for name, value in rows),
    ]
    violations = report.violations
    if violations:
        lines.append(f"FAILED: {len(violations)} violations (first 30):")
        lines.extend(f"  - {violation}" for violation in violations[:30])
        lines.append(f"reproduce: {config.reproduce()}")
    else:
        lines.append("OK: every fire time ran exactly once, every effect exists exactly once")
    return "\n".join(lines)


def _missed(log: InjectionLog, kind: FaultKind) -> str:
    return f" ({log.missed[kind]} found no victim)" if log.missed[kind] else ""


def _gap(verdict: Verdict) -> str:
    began = verdict.max_claim_gap_from
    when = f" from {began:%H:%M:%S}" if began is not None else ""
    return f"{verdict.max_claim_gap:.2f} s{when} (longest time without a claim)"
