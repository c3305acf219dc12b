"""Real Flower next to a real worker: a run appears in Flower's API under its run ID
(the Celery task ID), and the API refuses requests without valid credentials."""

from __future__ import annotations

import base64
import json
import socket
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest

from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.e2e.cluster import Cluster, Process, wait_until

pytestmark = pytest.mark.e2e

USER, PASSWORD = "ops", "s3cret"
#: Seconds one HTTP request to Flower may take.
HTTP_TIMEOUT = 5.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def basic_auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def get(url: str, authorization: str | None = None) -> tuple[int, Any]:
    """(status, parsed JSON body or None); status 0 while Flower does not answer yet."""
    request = urllib.request.Request(url)
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
            body = response.read()
            status: int = response.status
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, None
    except (urllib.error.URLError, OSError):
        return 0, None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


class Flower:
    """Flower's HTTP API, as an operator would use it."""

    def __init__(self, process: Process, port: int) -> None:
        self.process = process
        self.base = f"http://127.0.0.1:{port}"
        self.auth = basic_auth(USER, PASSWORD)

    def api(self, path: str) -> tuple[int, Any]:
        return get(self.base + path, self.auth)

    def wait_ready(self, worker: str) -> None:
        """Until Flower answers and hears ``worker``'s events (it learns of tasks only so)."""
        wait_until(
            lambda: get(self.base + "/healthcheck")[0] == 200 or not self.process.alive(),
            timeout=60,
            interval=0.2,
        )
        assert self.process.alive(), "Flower exited"

        def hears_worker() -> bool:
            status, alive = self.api("/api/workers?status=1")
            return status == 200 and any(
                name.startswith(f"{worker}@") and up for name, up in alive.items()
            )

        wait_until(hears_worker, timeout=60, interval=0.5)

    def task(self, task_id: str) -> dict[str, Any] | None:
        status, info = self.api(f"/api/task/info/{task_id}")
        return info if status == 200 else None

    def wait_succeeded(self, task_id: str) -> dict[str, Any]:
        wait_until(
            lambda: (self.task(task_id) or {}).get("state") == "SUCCESS", timeout=30, interval=0.25
        )
        info = self.task(task_id)
        assert info is not None
        return info


def start_flower(cluster: Cluster) -> Flower:
    port = free_port()
    process = cluster.start(
        "flower",
        "flower",
        f"--port={port}",
        "--address=127.0.0.1",
        FLOWER_BASIC_AUTH=f"{USER}:{PASSWORD}",
    )
    return Flower(process, port)


def test_flower_shows_a_run_under_its_run_id_and_requires_auth(cluster: Cluster) -> None:
    flower = start_flower(cluster)
    cluster.worker("worker1", concurrency=1)
    flower.wait_ready("worker1")
    run_id = str(uuid.uuid4())

    app = cluster.app()
    try:
        app.send_task("e2e.record", args=["flower"], task_id=run_id)
    finally:
        app.close()
    wait_until(lambda: cluster.effects().get(run_id) == 1, timeout=60, interval=0.2)

    info = flower.wait_succeeded(run_id)
    assert info["uuid"] == run_id
    assert info["name"] == "e2e.record"
    assert info["worker"].startswith("worker1@")
    status, listed = flower.api("/api/tasks?taskname=e2e.record")
    assert status == 200
    assert run_id in listed
    assert listed[run_id]["state"] == "SUCCESS"

    assert get(flower.base + "/api/tasks")[0] == 401, "no credentials"
    assert get(flower.base + "/api/tasks", basic_auth(USER, "wrong"))[0] == 401, "bad password"
    assert get(flower.base + f"/api/task/info/{run_id}")[0] == 401


def test_a_triggered_run_shows_in_flower_under_the_printed_run_id(
    cluster: Cluster, store: Store
) -> None:
    """The whole chain: `schedules trigger` -> leader publishes -> worker runs -> Flower."""
    Schedules(store).create(
        "by-hand", "e2e.record", every=3600, args=["triggered"], allow_unregistered=True
    )
    flower = start_flower(cluster)
    cluster.beat("beat0")
    cluster.worker("worker1", concurrency=1)
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    flower.wait_ready("worker1")

    triggered = cluster.command("schedules", "trigger", "by-hand", "--json")
    assert triggered.returncode == 0, triggered.stderr
    run_id = json.loads(triggered.stdout)["id"]

    wait_until(lambda: cluster.effects().get(run_id) == 1, timeout=60, interval=0.2)
    info = flower.wait_succeeded(run_id)
    assert info["name"] == "e2e.record"
    assert cluster.effects() == {run_id: 1}, "one run, executed once; the schedule did not fire"
