"""A message's expiry is timed by the database's clock, whatever the host's says.

Published to kombu's in-memory transport by a process whose wall clock is 2 minutes
ahead of (or behind) this one's (``tests.clock_skew``), a run's message expires at its
fire time + ``expires`` (the ``expires`` header), with a time to live (``expiration``)
of that instant less the database's time at the send.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from beat.publish.dispatch import time_to_live
from beat.records import DatabaseClock
from tests.clock_skew import skewed_env

ROOT = Path(__file__).resolve().parents[3]
EXPIRES = 25
#: The database's clock reads this long after the fire time when the runs are sent.
SINCE_FIRE = 5.0
#: Milliseconds between the reading of the database's clock and the send, at most.
SLACK_MS = 1_000

#: Publishes a run from its template and an ad hoc one with ``send_task``, on the
#: in-memory transport, the database's clock reading ``sys.argv[1]``; prints what the
#: messages carry.
PUBLISH = """
import json, sys, time, uuid
from datetime import datetime, timedelta
from celery import Celery
from beat.publish import dispatch
from beat.leader.armed import DatabaseClock
from beat.models import RunToPublish

app = Celery("expiry", broker="memory://", set_as_current=False)
app.conf.task_serializer = "json"
app.conf.task_default_queue = queue = f"expiry-{uuid.uuid4().hex}"
database_now = datetime.fromisoformat(sys.argv[1])
fire_at = datetime.fromisoformat(sys.argv[2])
database = DatabaseClock(now=database_now, clock=time.monotonic())
runs = [
    RunToPublish(
        id=uuid.uuid4(), task="tasks.x", args=[], kwargs={}, options={"expires": 25},
        schedule_name=name, fire_at=fire_at, attempt=0,
    )
    for name in ("scheduled", None)
]
result = dispatch.publish_runs(app, runs, database=database)
assert result.error is None and len(result.published) == 2, result
seen = []
with app.connection_for_read() as connection:
    channel = connection.default_channel
    while (message := channel.basic_get(queue, no_ack=True)) is not None:
        seen.append([message.properties.get("expiration"), message.headers["expires"]])
print(json.dumps(seen))
"""


def published_expiry(skew: float, fire_at: datetime, database_now: datetime) -> list[list[str]]:
    """(``expiration``, ``expires`` header) of the two messages a process whose wall
    clock is ``skew`` seconds off publishes when the database's clock reads
    ``database_now``."""
    done = subprocess.run(
        [sys.executable, "-c", PUBLISH, database_now.isoformat(), fire_at.isoformat()],
        cwd=ROOT,
        env=skewed_env(skew, {"PATH": "", "PYTHONPATH": str(ROOT)}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen: list[list[str]] = json.loads(done.stdout.splitlines()[-1])
    return seen


@pytest.mark.parametrize("skew", [120.0, -120.0, 0.0], ids=["ahead", "behind", "in-step"])
def test_a_message_expires_at_its_fire_time_plus_expires_by_the_database_s_clock(
    skew: float,
) -> None:
    """issue 38, finding 11: on a host whose clock is 2 minutes off, a run sent 5 s after
    its fire time by the database's clock has ``expiration`` = fire time + ``expires`` -
    the database's now (20 s), and its ``expires`` header is fire time + ``expires``,
    whether its message comes from a template or from ``send_task``."""
    database_now = datetime.now(UTC).replace(microsecond=0)
    fire_at = database_now - timedelta(seconds=SINCE_FIRE)
    seen = published_expiry(skew, fire_at, database_now)

    expected_ms = (EXPIRES - SINCE_FIRE) * 1000
    assert len(seen) == 2
    for expiration, header in seen:
        assert expected_ms - SLACK_MS <= int(expiration) <= expected_ms
        assert datetime.fromisoformat(header) == fire_at + timedelta(seconds=EXPIRES)


def test_the_time_to_live_is_what_is_left_of_the_expiry_by_the_database_s_clock() -> None:
    """Past the expiry: none left. Without a reading of the database's clock: no time to
    live at all (the worker decides by the header), never one from this host's clock."""
    fire_at = datetime(2030, 1, 1, tzinfo=UTC)
    expires = fire_at + timedelta(seconds=EXPIRES)
    reading = DatabaseClock(now=fire_at + timedelta(seconds=SINCE_FIRE), clock=100.0)
    assert time_to_live(expires, reading.now_at(100.0)) == EXPIRES - SINCE_FIRE
    assert time_to_live(expires, reading.now_at(130.0)) == 0.0
    assert time_to_live(expires, None) is None
