"""A RabbitMQ virtual host of a test's own, on the machine's RabbitMQ."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

#: The machine's RabbitMQ, as the test environment runs it.
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672"


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
