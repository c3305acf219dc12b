"""Real `celery beat` and `celery worker` processes for end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from celery import Celery
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.factory import create_app
from beat.store.all_roles import Store
from tests.chaos.servers import PrivatePostgres
from tests.conftest import SessionEnv

ROOT = Path(__file__).resolve().parents[2]
CELERY = [sys.executable, "-m", "celery", "-A", "app"]
#: Seconds a new celery process needs to start (import, connect) before it stands by.
START_UP = 4.0


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.pid, signum)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Cluster:
    env: SessionEnv
    store: Store
    workdir: Path
    settings: dict[str, str] = field(default_factory=dict)
    processes: list[Process] = field(default_factory=list)

    def process_env(self) -> dict[str, str]:
        dsn = (
            make_url(self.env.database_url)
            .set(drivername="postgresql")
            .render_as_string(hide_password=False)
        )
        env = self.env.process_env(
            HABEAT_IMPORTS="tests.e2e.jobs",
            E2E_EFFECTS_DSN=dsn,
            PYTHONPATH=str(ROOT),
            **self.settings,
        )
        env.pop("CELERY_CONFIG_MODULE", None)
        return env

    def start(
        self,
        name: str,
        *args: str,
        program: Sequence[str] = CELERY,
        cwd: Path = ROOT,
        **env: str,
    ) -> Process:
        """``program`` (``celery -A app``) with ``args``, in ``cwd``, its output in a log."""
        log = self.workdir / f"{name}.log"
        handle = log.open("ab")  # a restarted process appends to its log
        popen = subprocess.Popen(
            [*program, *args],
            cwd=cwd,
            env=self.process_env() | env,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
        handle.close()
        process = Process(name=name, popen=popen, log=log)
        self.processes.append(process)
        return process

    def command(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A one-off ``celery -A app ...`` command on this cluster, run to its end."""
        return subprocess.run(
            [*CELERY, *args],
            cwd=ROOT,
            env=self.process_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def beat(self, name: str, program: Sequence[str] = CELERY, **env: str) -> Process:
        return self.start(
            name,
            "beat",
            "-l",
            "info",
            "--pidfile=",
            "-s",
            str(self.workdir / f"{name}-schedule"),
            program=program,
            **env,
        )

    def worker(
        self,
        name: str,
        concurrency: int = 4,
        pool: str = "threads",
        options: tuple[str, ...] = (),
        program: Sequence[str] = CELERY,
        **env: str,
    ) -> Process:
        return self.start(
            name,
            "worker",
            "-l",
            "info",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-n",
            f"{name}@%h",
            "--without-gossip",
            "--without-mingle",
            *options,
            program=program,
            **env,
        )

    def app(self) -> Celery:
        """A Celery app on this cluster's broker, to send tasks from the test."""
        return create_app(self.env.settings())

    def process_for_worker(self, hostname: str) -> Process:
        name = hostname.split("@")[0]
        return next(p for p in reversed(self.processes) if p.name == name)

    def leader_holder(self) -> tuple[int, str] | None:
        info = self.store.leader_info()
        return None if info is None else (info.epoch, info.holder)

    def leading_process(self) -> Process | None:
        holder = self.leader_holder()
        if holder is None:
            return None
        pid = int(holder[1].split(":")[1])
        return next((p for p in self.processes if p.pid == pid and p.alive()), None)

    def stop_all(self, timeout: float = 15) -> None:
        for process in self.processes:
            process.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()

    def effects(self) -> dict[str, int]:
        with self.store.engine.connect() as conn:
            rows = conn.execute(text("SELECT task_id, count(*) FROM e2e_effects GROUP BY task_id"))
            return {row[0]: row[1] for row in rows}

    def labels(self) -> dict[str, int]:
        """How many effects the jobs recorded under each label."""
        with self.store.engine.connect() as conn:
            rows = conn.execute(text("SELECT label, count(*) FROM e2e_effects GROUP BY label"))
            return {row[0]: row[1] for row in rows}

    def logs(self) -> str:
        return "\n".join(
            f"===== {p.name} (pid {p.pid}) =====\n{p.output()[-6000:]}" for p in self.processes
        )


@contextlib.contextmanager
def cluster_on(
    postgres: PrivatePostgres,
    redis_url: str,
    workdir: Path,
    *,
    prefix: str,
    settings: dict[str, str] | None = None,
) -> Iterator[Cluster]:
    """A cluster on a database of its own (named ``prefix``) on a private PostgreSQL,
    with the effects table the jobs write; its processes stopped, its logs printed and
    its pool closed at the end."""
    database = prefix.replace("-", "_")
    with psycopg.connect(postgres.admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    env = SessionEnv(database_url=postgres.url(database), redis_url=redis_url, key_prefix=prefix)
    store = Store.connect(env.database_url, leader_name=prefix)
    store.migrate()
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE e2e_effects"
                " (task_id text NOT NULL, label text, at timestamptz DEFAULT now())"
            )
        )
    cluster = Cluster(env=env, store=store, workdir=workdir, settings=dict(settings or {}))
    try:
        yield cluster
    finally:
        cluster.stop_all()
        print(cluster.logs()[-20000:])
        store.dispose()


def wait_until(condition: Callable[[], object], timeout: float, interval: float = 0.05) -> float:
    """Poll ``condition`` until truthy; return the seconds waited, or raise AssertionError."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if condition():
            return time.monotonic() - start
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")
