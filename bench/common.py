"""What every benchmark shares: a scratch database and Redis key prefix, real
scheduler processes, and one recorder that consumes the broker queue directly.

Nothing here asserts: the benchmarks measure and report.
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from beat.store.all_roles import Store

ADMIN_URL = os.environ.get(
    "HABEAT_BENCH_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
#: A Redis DB number of its own; every key also carries the run's prefix.
REDIS_URL = os.environ.get("HABEAT_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
#: The task every benchmark schedule sends. No worker runs it: the recorder takes the messages.
TASK = "bench.noop"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Scratch:
    """A scratch PostgreSQL database and Redis key prefix, removed by ``close``."""

    database_url: str
    redis_url: str
    prefix: str
    workdir: Path

    @classmethod
    def create(cls) -> Scratch:
        suffix = uuid.uuid4().hex[:8]
        database_url = (
            make_url(ADMIN_URL)
            .set(database=f"habeat_bench_{suffix}")
            .render_as_string(hide_password=False)
        )
        scratch = cls(
            database_url=database_url,
            redis_url=REDIS_URL,
            prefix=f"habeat-bench-{suffix}",
            workdir=Path(tempfile.mkdtemp(prefix="habeat-bench-")),
        )
        store = Store.connect(database_url)
        try:
            store.migrate()
        finally:
            store.dispose()
        return scratch

    @property
    def broker_prefix(self) -> str:
        return f"{self.prefix}:broker:"

    @property
    def queue_key(self) -> str:
        """The Redis list of Celery's default queue under this run's broker prefix."""
        return f"{self.broker_prefix}celery"

    def store(self) -> Store:
        return Store.connect(self.database_url, leader_name=self.prefix)

    def execute(self, sql: str, params: dict[str, Any] | None = None, **options: Any) -> None:
        """One statement on the scratch database, committed (``options``: execution options)."""
        store = self.store()
        try:
            with store.engine.connect().execution_options(**options) as conn:
                conn.execute(text(sql), params or {})
                conn.commit()
        finally:
            store.dispose()

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a `celery` process of this project or of a peer scheduler."""
        env = dict(os.environ)
        env.update(
            DATABASE_URL=self.database_url,
            REDIS_URL=self.redis_url,
            CELERY_BROKER_URL=self.redis_url,
            HABEAT_KEY_PREFIX=self.prefix,
            HABEAT_BROKER_KEY_PREFIX=self.broker_prefix,
            BENCH_REDIS_URL=self.redis_url,
            BENCH_PREFIX=self.prefix,
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        return env

    def clear_redis(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        keys = list(client.scan_iter(match=f"{self.prefix}*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])
        client.close()

    def close(self) -> None:
        self.clear_redis()
        admin = Store.connect(ADMIN_URL)
        name = make_url(self.database_url).database
        with admin.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        keep = os.environ.get("BENCH_LOGS")  # a directory to keep the processes' logs in
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            for log in self.workdir.glob("*.log"):
                shutil.copy(log, Path(keep) / f"{self.prefix}-{log.name}")
        for path in sorted(self.workdir.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        self.workdir.rmdir()


@contextmanager
def scratch() -> Iterator[Scratch]:
    made = Scratch.create()
    try:
        yield made
    finally:
        made.close()


@dataclass
class Process:
    """A real `celery` process; its log goes to a file of the scratch directory."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, name: str, args: Sequence[str], env: dict[str, str], workdir: Path) -> Process:
        log = workdir / f"{name}.log"
        with log.open("ab") as handle:
            popen = subprocess.Popen(
                [sys.executable, "-m", "celery", *args],
                cwd=ROOT,
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
        return cls(name=name, popen=popen, log=log)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def cpu_seconds(self) -> float:
        """User plus system CPU time so far, from /proc."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def kill(self, signum: int = signal.SIGKILL) -> None:
        if self.alive():
            os.kill(self.pid, signum)

    def stop(self, timeout: float = 20) -> None:
        self.kill(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass(frozen=True, slots=True)
class Arrival:
    """One message taken from the queue, with the wall-clock time it was taken."""

    at: float
    task_id: str
    task: str
    #: The schedule and fire time our scheduler puts in headers (None for the peers).
    schedule: str | None
    fire_at: float | None


@dataclass
class Recorder:
    """Consumes the queue directly (not a worker) and stamps when each message arrived,
    never early. Two upper bounds, the lower taken:

    - when the message was in hand: popped up to 1,000 at a time, each batch stamped
      when it is in hand (late by at most one pop, ``slowest_pop``);
    - when the queue was seen holding it: a second connection reads the queue's length
      every millisecond, and the messages popped before it plus that length have all
      arrived by then (the queue is first in, first out). A burst is then stamped as
      it lands, not as it is drained: 10,000 messages take about ten pops.

    Messages are decoded after the run so the loops only pop and count."""

    redis_url: str
    key: str
    _raw: list[tuple[float, bytes]] = field(default_factory=list)
    #: (time, messages known to have arrived by then), the count increasing.
    _seen: list[tuple[float, int]] = field(default_factory=list)
    _popped: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    #: Seconds the slowest pop of a batch took: how finely the pops stamp arrivals.
    slowest_pop: float = 0.0

    def start(self) -> Recorder:
        for target in (self._pop_loop, self._count_loop):
            thread = threading.Thread(target=target, name="recorder", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> list[Arrival]:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        return self.arrivals()

    def count(self) -> int:
        return len(self._raw)

    def arrivals(self) -> list[Arrival]:
        seen_at = [at for at, _ in self._seen]
        seen_count = [count for _, count in self._seen]
        arrivals = []
        for index, (popped_at, raw) in enumerate(list(self._raw)):
            # The first time the queue was seen holding the (index + 1)-th message.
            first = bisect.bisect_left(seen_count, index + 1)
            at = min(popped_at, seen_at[first]) if first < len(seen_at) else popped_at
            arrivals.append(_decode(at, raw))
        return arrivals

    def _pop_loop(self) -> None:
        # Bytes, not str: the client does not decode responses.
        client = redis.Redis.from_url(self.redis_url)
        while not self._stop.is_set():
            # Messages are LPUSHed: the oldest is on the right.
            popped = client.brpop([self.key], timeout=0.05)
            if popped is None:
                continue
            self._raw.append((time.time(), popped[1]))  # type: ignore[arg-type]
            asked = time.time()
            burst: list[bytes] = client.rpop(self.key, 1000) or []  # type: ignore[assignment]
            now = time.time()  # when the last of the burst was in hand: never early
            self.slowest_pop = max(self.slowest_pop, now - asked)
            self._raw.extend((now, raw) for raw in burst)
            # Counted once popped, after the pop: a count read meanwhile is too low.
            self._popped = len(self._raw)
        client.close()

    def _count_loop(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        known = 0
        while not self._stop.is_set():
            # The popped count first: a pop between the two reads makes the sum too
            # low (a later stamp), never too high.
            popped = self._popped
            length = int(client.llen(self.key))
            at = time.time()
            if popped + length > known:
                known = popped + length
                self._seen.append((at, known))
            time.sleep(0.001)
        client.close()


def _decode(at: float, raw: bytes) -> Arrival:
    headers = json.loads(raw)["headers"]
    fire_at = headers.get("habeat_fire_at")
    return Arrival(
        at=at,
        task_id=headers["id"],
        task=headers["task"],
        schedule=headers.get("habeat_schedule"),
        fire_at=datetime.fromisoformat(fire_at).timestamp() if fire_at else None,
    )


def wait_for(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return False


def sleep_until(wall_time: float) -> None:
    time.sleep(max(0.0, wall_time - time.time()))


def next_minute(after: float) -> float:
    """The first minute boundary (wall clock, seconds) at or after ``after``."""
    return (int(after) // 60 + 1) * 60.0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), inclusive method; NaN for no values."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 10) - 1]


def utc(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, UTC)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
