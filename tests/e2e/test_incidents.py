"""The failing monitor with real `celery beat` and `celery worker` processes: a schedule
whose task fails every time opens one incident after its alert threshold and pauses
itself after its pause threshold, with the reason as its pause note; fixed and resumed,
its first success resolves the incident. Read with the real ``schedules`` command."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.e2e.cluster import Cluster, wait_until
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.e2e

FAST = {"HABEAT_LOCK_TTL": "3", "HABEAT_MAX_WAIT": "1", "HABEAT_STANDBY_POLL": "0.5"}


def incidents(cluster: Cluster, *flags: str) -> list[dict[str, Any]]:
    listed = cluster.command("schedules", "incidents", "--json", *flags)
    assert listed.returncode == 0, listed.stderr
    found: list[dict[str, Any]] = json.loads(listed.stdout)
    return found


def test_a_schedule_failing_every_time_opens_an_incident_pauses_itself_and_recovers(
    cluster: Cluster, store: Store
) -> None:
    cluster.settings = FAST
    cluster.beat("beat0")
    cluster.worker("worker0", concurrency=2)
    schedules = Schedules(store)
    schedules.create(
        "always-fails",
        "e2e.plain_fail",
        every=2,
        args=["nightly"],
        alert_after_failures=2,
        pause_after_failures=4,
        allow_unregistered=True,
    )

    wait_until(lambda: not schedules.get("always-fails").definition.enabled, timeout=90)

    paused = schedules.get("always-fails")
    [incident] = incidents(cluster)
    assert incident["schedule"] == "always-fails"
    assert incident["failures"] >= 4
    assert incident["paused_at"] is not None
    assert incident["last_error"] == "RuntimeError: nightly: fails every time"
    assert paused.disabled_reason is not None
    assert paused.disabled_reason.startswith(
        f"paused by the scheduler after {incident['failures']} failures in a row"
        f" (incident {incident['id']})"
    )
    shown = cluster.command("schedules", "show", "always-fails")
    assert "paused: paused by the scheduler after" in shown.stdout

    # Paused: no more fire times are claimed (a run claimed before the pause may end).
    claimed = len(run_rows(store, schedule_name="always-fails"))
    time.sleep(6)
    assert len(run_rows(store, schedule_name="always-fails")) <= claimed + 1

    schedules.update(
        "always-fails", task="e2e.plain_record", args=["fixed"], allow_unregistered=True
    )
    schedules.resume("always-fails")

    wait_until(lambda: incidents(cluster) == [], timeout=60)
    [resolved] = incidents(cluster, "--all")
    assert resolved["id"] == incident["id"]
    assert resolved["resolution"].endswith("succeeded")
    assert schedules.get("always-fails").definition.enabled
