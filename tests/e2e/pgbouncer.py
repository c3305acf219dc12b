"""Debian's PgBouncer in front of a test's database, as a pooler runs in production."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from tests.chaos.servers import POSTGRES_USER, free_port, wait_for, workspace
from tests.conftest import IN_CI


class PgBouncer:
    """Debian's ``pgbouncer`` in ``mode`` (``transaction``, ``session``) on a free
    port, in front of one database (trust: the tests' servers trust local connections)."""

    def __init__(self, workdir: Path, upstream: str, mode: str) -> None:
        url = make_url(upstream)
        self.port = free_port()
        self.database = url.database or "postgres"
        self.log = workdir / "pgbouncer.log"
        config = workdir / "pgbouncer.ini"
        users = workdir / "pgbouncer-users.txt"
        users.write_text('"postgres" ""\n')
        config.write_text(
            "[databases]\n"
            f"{self.database} = host={url.host} port={url.port or 5432} dbname={self.database}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {users}\npool_mode = {mode}\n"
            f"logfile = {self.log}\nmax_client_conn = 200\ndefault_pool_size = 20\n"
            # After a failed server login PgBouncer refuses every client for this long
            # (15 s by default): keep it below the run lease, or a worker cannot record
            # a run's end for longer than its lease after a PostgreSQL restart.
            "server_login_retry = 1\n"
        )
        for path in (config, users):
            path.chmod(0o644)
        self._command = ["pgbouncer", str(config)]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            self._command = ["runuser", "-u", POSTGRES_USER, "--", *self._command]
        self.log.touch()
        if os.geteuid() == 0:
            shutil.chown(self.log, POSTGRES_USER)
        self._process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            self._command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        try:
            wait_for(self._answers, f"pgbouncer on port {self.port}", timeout=20)
        except RuntimeError:
            process.kill()  # nobody else holds it: it would outlive the test
            process.wait(timeout=30)
            raise
        return process

    def restart(self, down: float) -> None:
        """Stop it at once (SIGTERM: every client connection dropped), keep it down
        ``down`` seconds, start it again on the same port."""
        self.stop()
        time.sleep(down)
        self._process = self._start()

    def url(self, query: str = "") -> str:
        """The SQLAlchemy URL through this PgBouncer, with ``query`` (``?...``) if given."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{self.database}{query}"

    def _answers(self) -> bool:
        dsn = f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
        self._process.wait(timeout=30)


@contextmanager
def running_pgbouncer(upstream: str, mode: str) -> Iterator[PgBouncer]:
    """PgBouncer in ``mode`` before ``upstream`` (a SQLAlchemy URL), stopped at the end;
    skipped (failed in CI) without ``pgbouncer``."""
    if shutil.which("pgbouncer") is None:
        message = "pgbouncer is not installed: apt-get install -y pgbouncer"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    with workspace() as workdir:  # a directory the postgres account can enter
        bouncer = PgBouncer(workdir, upstream, mode)
        try:
            yield bouncer
        finally:
            bouncer.stop()
