"""No credential of the lease's Redis reaches what the cluster shows: beat's and the
worker's logs, ``celery inspect conf``, Flower's worker API, the CLI.

The lease is on a private Redis that requires a password, reached as the default
user (``redis://:password@``) or as an ACL user (``redis://user:password@``); the
broker stays the tests' Redis. (A ``rediss://`` URL is masked by the same code:
tests/unit/ops/test_secrets.py.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.servers import PrivateRedis
from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.test_flower import start_flower

pytestmark = pytest.mark.e2e

SECRET = "Zq7-lease-secret"
ACL_USER = "beatlease"


@pytest.fixture(scope="module")
def lease_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(
        Path(binary),
        tmp_path_factory.mktemp("lease-redis"),
        password=SECRET,
        extra=["--user", ACL_USER, "on", f">{SECRET}", "~*", "&*", "+@all"],
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("user", ["", ACL_USER], ids=["password", "acl-user"])
def test_the_lease_password_is_shown_nowhere(
    cluster: Cluster, lease_redis: PrivateRedis, user: str
) -> None:
    lease_url = f"redis://{user}:{SECRET}@127.0.0.1:{lease_redis.port}/0"
    cluster.settings["REDIS_URL"] = lease_url  # the broker stays CELERY_BROKER_URL
    flower = start_flower(cluster)
    cluster.beat("beat0")
    cluster.worker("worker1", concurrency=1)
    wait_until(lambda: cluster.leading_process() is not None, timeout=60, interval=0.2)
    flower.wait_ready("worker1")

    def worker_conf() -> dict[str, object] | None:
        # Flower asks the workers (inspect, a 1-s timeout): a busy machine may need a retry.
        status, found = flower.api("/api/workers?refresh=1")
        assert status == 200
        confs = [info.get("conf") for name, info in found.items() if name.startswith("worker1@")]
        return confs[0] if confs and confs[0] else None

    wait_until(worker_conf, timeout=30, interval=1)
    status, workers = flower.api("/api/workers")
    assert status == 200
    ((hostname, conf),) = [
        (name, info["conf"]) for name, info in workers.items() if name.startswith("worker1@")
    ]
    assert conf["habeat_redis_url"] == "********"
    assert SECRET not in json.dumps(workers)

    shown = [
        text_of(cluster.command("inspect", "conf", "-d", hostname, "--timeout", "10")),
        text_of(cluster.command("schedules", "leader")),
        text_of(cluster.command("schedules", "health")),
        text_of(cluster.command("report")),
    ]
    assert "habeat_redis_url" in shown[0]
    for output in shown:
        assert SECRET not in output
    assert "this process now leads" in cluster.logs()
    assert SECRET not in cluster.logs()


def text_of(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout + done.stderr
