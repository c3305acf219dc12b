"""A PostgreSQL failover with real servers: a private primary and a streaming standby
(``pg_basebackup``), the processes on a multi-host URL with
``target_session_attrs=read-write``. The standby is promoted while the old primary is
stopped, or left up but read-only: the first write through a connection to the old
one is a lost connection (StoreUnavailable, never a crash), the next goes to the new
primary, and the fencing epoch came over with the data, so a deposed leader's write
is refused there as it was before."""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest

from beat.errors import StaleEpoch, StoreUnavailable
from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.runs import RunStore
from tests.chaos.servers import (
    POSTGRES_BIN_GLOB,
    POSTGRES_USER,
    Binaries,
    PrivatePostgres,
    binaries_for_a_test,
    wait_for,
    workspace,
)

pytestmark = pytest.mark.integration

T = TypeVar("T")
DATABASE = "habeat"


class Standby(PrivatePostgres):
    """A streaming replica of ``primary`` (``pg_basebackup -R``), promotable."""

    def __init__(self, binaries: Binaries, workdir: Path, primary: PrivatePostgres) -> None:
        super().__init__(binaries, workdir)
        self._primary = primary
        self._pg_ctl = binaries.pg_ctl
        # Beside initdb in PostgreSQL's own directory (Debian's are not on PATH).
        found = sorted(Path("/").glob(POSTGRES_BIN_GLOB.lstrip("/") + "/pg_basebackup"))
        self._basebackup = shutil.which("pg_basebackup") or str(found[-1] if found else "")

    def init(self) -> None:
        self.datadir.mkdir(mode=0o700)
        self.log.touch()
        if self._as_root:
            shutil.chown(self.datadir, POSTGRES_USER, POSTGRES_USER)
            shutil.chown(self.log, POSTGRES_USER, POSTGRES_USER)
        self._run(
            self._basebackup,
            "-D",
            str(self.datadir),
            "-h",
            "127.0.0.1",
            "-p",
            str(self._primary.port),
            "-U",
            "postgres",
            "-R",
            "-X",
            "stream",
            "--checkpoint=fast",  # not a spread checkpoint: minutes
        )

    def promote(self) -> None:
        self._run(str(self._pg_ctl), "promote", "-w", "-D", str(self.datadir))


@pytest.fixture
def servers() -> Iterator[tuple[PrivatePostgres, Standby]]:
    binaries = binaries_for_a_test()
    with workspace() as workdir:
        (workdir / "a").mkdir(mode=0o755)
        (workdir / "b").mkdir(mode=0o755)
        primary = PrivatePostgres(binaries, workdir / "a")
        standby = Standby(binaries, workdir / "b", primary)
        try:
            primary.init()
            primary.start()
            with psycopg.connect(primary.admin_dsn, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {DATABASE}")
            standby.init()
            standby.start()
            yield primary, standby
        finally:
            for server in (standby, primary):
                if server.running():
                    server.stop("immediate")


def multi_host_url(primary: PrivatePostgres, standby: Standby) -> str:
    return (
        f"postgresql+psycopg://postgres@/{DATABASE}?host=127.0.0.1:{primary.port}"
        f"&host=127.0.0.1:{standby.port}&target_session_attrs=read-write"
    )


def once_reconnected(write: Callable[[], T]) -> T:
    """``write`` through a connection pooled before the failover: the first try may meet
    the lost connection (and only that); the next one goes to the new primary."""
    with contextlib.suppress(StoreUnavailable):
        return write()
    return write()


def database_dsn(server: PrivatePostgres) -> str:
    return f"postgresql://postgres@127.0.0.1:{server.port}/{DATABASE}"


def replicated(standby: Standby, epoch: int) -> bool:
    with psycopg.connect(database_dsn(standby)) as conn:
        row = conn.execute("SELECT max(epoch) FROM beat_leader").fetchone()
    return row is not None and row[0] == epoch


@pytest.mark.parametrize("old_primary", ["stopped", "left read-only"])
def test_after_a_promotion_writes_go_to_the_new_primary_and_the_epoch_still_fences(
    servers: tuple[PrivatePostgres, Standby], old_primary: str
) -> None:
    primary, standby = servers
    url = multi_host_url(primary, standby)
    store = Store.connect(url, leader_name="promotion")
    runs = RunStore.connect(url)
    try:
        store.migrate()
        schedules = Schedules(store)
        schedules.create("rates", "tasks.demo.add", every=60, args=[1, 2])
        assert store.take_leadership(1, "beat-a")
        run_id = uuid.uuid4()
        wait_for(lambda: replicated(standby, 1), "the standby's copy of epoch 1", 30)

        if old_primary == "stopped":
            primary.stop("fast")
        else:
            with psycopg.connect(primary.admin_dsn, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
                conn.execute("SELECT pg_reload_conf()")
        standby.promote()

        assert once_reconnected(lambda: store.take_leadership(2, "beat-b"))
        with pytest.raises(StaleEpoch):
            store.watch_runs(1, idle_timeout=5)  # the deposed leader, on the new primary
        assert [schedule.definition.name for schedule in schedules.list()] == ["rates"]
        started = once_reconnected(
            lambda: runs.start(
                run_id,
                owner="w1",
                worker="w1@host",
                lease_seconds=30,
                task="tasks.demo.add",
                args=[1, 2],
                kwargs={},
                options={},
                retries=0,
                max_attempts=3,
                may_create=True,
            )
        )
        assert type(started).__name__ == "Started"
        assert runs.finish(run_id, owner="w1", state=RunState.SUCCEEDED)
        with psycopg.connect(database_dsn(standby)) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
            assert conn.execute("SELECT state FROM beat_runs").fetchall() == [("succeeded",)]
    finally:
        with contextlib.suppress(Exception):
            runs.dispose()
        store.dispose()
