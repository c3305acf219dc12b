"""RabbitMQ for tests: a virtual host of a test's own on the machine's RabbitMQ, or a
private node (its own name, ports, data and settings) that a test may stop and start."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.servers import free_port
from tests.conftest import IN_CI

#: The machine's RabbitMQ, as the test environment runs it.
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672"
#: Seconds a private node may take to start or stop.
NODE_TIMEOUT = 90


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=60)


@contextmanager
def rabbitmq_vhost() -> Iterator[str]:
    """The broker URL of a new virtual host (guest may use it), deleted afterwards."""
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not installed")
    vhost = f"habeat-test-{uuid.uuid4().hex[:10]}"
    try:
        _rabbitmqctl("add_vhost", vhost)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"RabbitMQ is not reachable: {exc.stderr.decode(errors='replace')}")
    try:
        _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield f"{RABBITMQ}/{vhost}"
    finally:
        _rabbitmqctl("delete_vhost", vhost)


class PrivateRabbitMQ:
    """A RabbitMQ node of the test's own in ``workdir``: a name and ports nobody else
    uses, its data kept across ``restart()`` (durable queues and persistent messages
    survive it, as on a real restart), and settings the machine's node must not take
    (``consumer_timeout``). Debian's ``rabbitmq-server`` runs as the ``rabbitmq``
    account, so that account owns ``workdir``."""

    def __init__(
        self,
        workdir: Path,
        *,
        consumer_timeout: float | None = None,
        heartbeat: int | None = None,
        addresses: tuple[str, ...] = (),
    ) -> None:
        self.workdir = workdir
        self.node = f"habeat{uuid.uuid4().hex[:8]}@localhost"
        self.port = free_port()
        self._dist_port = free_port()
        self._pid_file = workdir / "rabbitmq.pid"
        self._consumer_timeout = consumer_timeout
        #: The heartbeat the node proposes (seconds): the lower of it and the client's
        #: is used, and a peer silent for two of them is taken for gone.
        self._heartbeat = heartbeat
        #: Addresses it listens on besides 127.0.0.1 (a network namespace's link).
        self._addresses = addresses
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.url_at("127.0.0.1")

    def url_at(self, address: str) -> str:
        return f"amqp://guest:guest@{address}:{self.port}//"

    def start(self) -> None:
        if shutil.which("rabbitmq-server") is None:
            raise RuntimeError("rabbitmq-server is not installed (Debian's rabbitmq-server)")
        if self._process is None:
            self._write_config()
        log = (self.workdir / "rabbitmq.out").open("ab")
        self._process = subprocess.Popen(
            ["rabbitmq-server"],
            cwd=self.workdir,
            env=os.environ | self._environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self._ctl("wait", str(self._pid_file), "--timeout", str(NODE_TIMEOUT))

    def stop(self) -> None:
        """Stop the node as an operator does (its queues and messages are on disk)."""
        if self._process is None:
            return
        try:
            self._ctl("stop", str(self._pid_file))
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self._kill_node()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=NODE_TIMEOUT)

    def messages(self) -> dict[str, int]:
        """Each queue's messages, ready or delivered and not yet acknowledged."""
        listing = subprocess.run(
            ["rabbitmqctl", "-n", self.node, "list_queues", "name", "messages", "--quiet"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        rows = [line.split("\t") for line in listing.splitlines() if "\t" in line]
        return {name: int(count) for name, count in rows if count.isdigit()}

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the node if it runs; kill it if it does not stop."""
        if self._process is not None and self._process.poll() is None:
            self.stop()
        if self._process is not None and self._process.poll() is None:
            self._kill_node()
            self._process.kill()
        self._process = None

    def _write_config(self) -> None:
        settings = [f"listeners.tcp.default = 127.0.0.1:{self.port}", "loopback_users = none"]
        settings += [
            f"listeners.tcp.{index} = {address}:{self.port}"
            for index, address in enumerate(self._addresses, start=1)
        ]
        if self._heartbeat is not None:
            settings.append(f"heartbeat = {self._heartbeat}")
        advanced = "[]."
        if self._consumer_timeout is not None:
            settings.append(f"consumer_timeout = {round(self._consumer_timeout * 1000)}")
            # RabbitMQ looks for timed-out deliveries on each channel's tick, once a
            # minute by default: a tick each second finds them within a second.
            advanced = "[{rabbit, [{channel_tick_interval, 1000}]}]."
        (self.workdir / "rabbitmq.conf").write_text("\n".join(settings) + "\n")
        (self.workdir / "advanced.config").write_text(advanced + "\n")
        (self.workdir / "enabled_plugins").write_text("[].\n")
        for directory in ("data", "log"):
            (self.workdir / directory).mkdir(exist_ok=True)
        _give_to_rabbitmq(self.workdir)

    def _environment(self) -> dict[str, str]:
        return {
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self._dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.workdir / "data"),
            "RABBITMQ_LOG_BASE": str(self.workdir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.workdir / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.workdir / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.workdir / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self._pid_file),
        }

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            ["rabbitmqctl", "-n", self.node, *args],
            check=True,
            capture_output=True,
            timeout=NODE_TIMEOUT + 10,
        )

    def _kill_node(self) -> None:
        """SIGKILL the node's Erlang VM (the process this object started, by its PID)."""
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(self._pid_file.read_text().strip()), signal.SIGKILL)


def _give_to_rabbitmq(path: Path) -> None:
    """As root, Debian's wrapper runs the node as ``rabbitmq``: it must write here."""
    if os.geteuid() != 0:
        return
    try:
        account = pwd.getpwnam("rabbitmq")
    except KeyError:
        return
    for item in [path, *path.rglob("*")]:
        os.chown(item, account.pw_uid, account.pw_gid)


@contextmanager
def private_rabbitmq(workdir: Path, **settings: Any) -> Iterator[PrivateRabbitMQ]:
    """A started private node in ``workdir``; skipped (failed in CI) if it cannot run."""
    node = PrivateRabbitMQ(workdir, **settings)
    try:
        node.start()
    except (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        node.close()
        message = f"a private RabbitMQ node did not start: {exc}"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield node
    finally:
        node.close()
