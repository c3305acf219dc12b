"""Private PostgreSQL and Redis servers that the chaos harness owns.

The harness restarts its servers; doing that to the machine's shared
PostgreSQL and Redis would disturb every other test and service. So each run
creates a PostgreSQL cluster (initdb into a temporary directory) and a
``redis-server`` on free ports, and removes both at the end.

Redis runs without persistence (``--save "" --appendonly no``): a restart loses
the broker queue, the leader lease and the epoch counter, the worst case the
outbox, the stale-queued republish and the fencing epoch floor must recover from.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

#: Where Debian and Ubuntu install PostgreSQL's server binaries (not on PATH).
POSTGRES_BIN_GLOB = "/usr/lib/postgresql/*/bin"
#: The account initdb and postgres run under when the harness runs as root
#: (PostgreSQL refuses to run as root).
POSTGRES_USER = "postgres"
INSTALL_HINT = (
    "the chaos suite needs PostgreSQL server binaries (initdb, pg_ctl) and redis-server:"
    " install them (Debian/Ubuntu: apt-get install postgresql redis-server)"
)


class MissingBinaries(RuntimeError):
    """The server binaries the harness needs are not installed (the message says which)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Binaries:
    initdb: Path
    pg_ctl: Path
    redis_server: Path


def find_binaries() -> Binaries:
    """PostgreSQL's initdb and pg_ctl (newest installed version) and redis-server."""
    pg_dirs = sorted(Path("/").glob(POSTGRES_BIN_GLOB.lstrip("/")), key=_version_key)
    initdb = _which("initdb", pg_dirs)
    pg_ctl = _which("pg_ctl", pg_dirs)
    redis_server = _which("redis-server", [])
    if initdb is None or pg_ctl is None or redis_server is None:
        missing = [
            name
            for name, path in (
                ("initdb", initdb),
                ("pg_ctl", pg_ctl),
                ("redis-server", redis_server),
            )
            if path is None
        ]
        raise MissingBinaries(f"{', '.join(missing)} not found: {INSTALL_HINT}")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        raise MissingBinaries(f"running as root needs runuser to start PostgreSQL: {INSTALL_HINT}")
    return Binaries(initdb=initdb, pg_ctl=pg_ctl, redis_server=redis_server)


def binaries_for_a_test() -> Binaries:
    """``find_binaries()`` for a pytest test: skipped without them, failed in CI."""
    import pytest

    from tests.conftest import IN_CI

    try:
        return find_binaries()
    except MissingBinaries as exc:
        if IN_CI:
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


def _version_key(path: Path) -> tuple[int, ...]:
    version = path.parent.name
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def _which(name: str, extra_dirs: list[Path]) -> Path | None:
    found = shutil.which(name)
    if found:
        return Path(found)
    for directory in reversed(extra_dirs):  # newest version first
        candidate = directory / name
        if candidate.exists():
            return candidate
    return None


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port: int = probe.getsockname()[1]
        return port


def wait_for(check: Callable[[], object], what: str, timeout: float) -> None:
    """Call ``check()`` until it returns true (errors count as false); raise naming
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up within {timeout:.0f}s")


class PrivatePostgres:
    """A PostgreSQL cluster in ``workdir``, on a free port, trust auth, user postgres;
    on 127.0.0.1 and any more ``addresses`` (a test's own network), with server
    ``settings`` of the test's."""

    def __init__(
        self,
        binaries: Binaries,
        workdir: Path,
        *,
        addresses: tuple[str, ...] = (),
        settings: dict[str, str] | None = None,
    ) -> None:
        self._binaries = binaries
        self.datadir = workdir / "postgres"
        self.log = workdir / "postgres.log"
        self.port = free_port()
        self._as_root = os.geteuid() == 0
        self._addresses = addresses
        self._settings = settings or {}

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        self.datadir.mkdir(mode=0o700)
        self.log.touch()
        if self._as_root:
            shutil.chown(self.datadir, POSTGRES_USER, POSTGRES_USER)
            shutil.chown(self.log, POSTGRES_USER, POSTGRES_USER)
        self._run(
            str(self._binaries.initdb),
            "-D",
            str(self.datadir),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "--encoding=UTF8",
            "--locale=C",
        )
        with (self.datadir / "pg_hba.conf").open("a") as hba:
            for address in self._addresses:
                network = ipaddress.ip_network(f"{address}/24", strict=False)
                hba.write(f"host all all {network} trust\n")

    def start(self) -> None:
        # fsync off: the harness kills processes, never the machine, so the OS page
        # cache keeps every commit; it spares a slow disk the restarts' flushes.
        listen = ",".join(("127.0.0.1", *self._addresses))
        options = (
            f"-p {self.port} -k {self.datadir} -c listen_addresses={listen}"
            " -c fsync=off -c full_page_writes=off -c max_connections=200"
            + "".join(f" -c {name}={value}" for name, value in self._settings.items())
        )
        self._run(
            str(self._binaries.pg_ctl),
            "start",
            "-w",
            "-t",
            "60",
            "-D",
            str(self.datadir),
            "-l",
            str(self.log),
            "-o",
            options,
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; ``immediate`` is a crash (recovery replays the WAL at start)."""
        self._run(str(self._binaries.pg_ctl), "stop", "-w", "-D", str(self.datadir), "-m", mode)

    def running(self) -> bool:
        status = subprocess.run(
            self._command(str(self._binaries.pg_ctl), "status", "-D", str(self.datadir)),
            capture_output=True,
            check=False,
        )
        return status.returncode == 0

    def _command(self, *args: str) -> list[str]:
        prefix = ["runuser", "-u", POSTGRES_USER, "--"] if self._as_root else []
        return [*prefix, *args]

    def _run(self, *args: str) -> None:
        result = subprocess.run(
            self._command(*args), capture_output=True, text=True, check=False, timeout=120
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args[:2])} failed ({result.returncode}):"
                f" {result.stderr.strip() or result.stdout.strip()}"
            )


class PrivateRedis:
    """A ``redis-server`` child process on a free port, without persistence."""

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        *,
        password: str | None = None,
        extra: list[str] | None = None,
        addresses: tuple[str, ...] = (),
    ) -> None:
        self._binary = binary
        self._workdir = workdir
        self.log = workdir / "redis.log"
        self.port = free_port()
        self._password = password  # the default user's (``--requirepass``)
        self._extra = extra or []  # more server arguments, e.g. ``--user ...``
        self._addresses = addresses  # beside 127.0.0.1: a test's own network
        self._process: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        self._process = subprocess.Popen(
            [
                str(self._binary),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                *self._addresses,
                # Another address is a network of the test's own, not the machine's.
                *(["--protected-mode", "no"] if self._addresses else []),
                "--save",
                "",
                "--appendonly",
                "no",
                "--maxmemory-policy",
                "noeviction",
                "--dir",
                str(self._workdir),
                "--logfile",
                str(self.log),
                *(["--requirepass", self._password] if self._password else []),
                *self._extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=1, password=self._password)
        try:
            wait_for(client.ping, f"redis-server on port {self.port}", timeout=20)
        finally:
            client.close()

    def stop(self) -> None:
        """Kill the server (SIGKILL: nothing is saved anyway) and wait for it."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
        self._process.wait(timeout=30)
        self._process = None

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None


@contextlib.contextmanager
def private_servers(workdir: Path) -> Iterator[tuple[PrivatePostgres, PrivateRedis]]:
    """A private PostgreSQL and Redis in ``workdir``, started; stopped at the end."""
    binaries = find_binaries()
    postgres = PrivatePostgres(binaries, workdir)
    cache = PrivateRedis(binaries.redis_server, workdir)
    try:
        postgres.init()
        postgres.start()
        cache.start()
        yield postgres, cache
    finally:
        cache.stop()
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
