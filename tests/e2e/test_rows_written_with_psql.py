"""A real `celery beat` over rows written with psql: the 1-second canary keeps firing
beside a row whose end_at is 'infinity' (and the other bad rows), each bad row is
quarantined with its reason, and `schedules health` says so. Issue 29, finding 1."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.e2e.cluster import Cluster, wait_until
from tests.integration.helpers import run_rows
from tests.integration.store.test_rows_written_with_psql import (
    INFINITE_TIMES,
    NEVER_FIRING,
    OVERSIZED,
    insert_rows,
)

pytestmark = pytest.mark.e2e

BAD_ROWS = {**INFINITE_TIMES, **NEVER_FIRING, **OVERSIZED}


def canary_runs(store: Store) -> int:
    return sum(
        1 for row in run_rows(store, schedule_name="canary") if row.state != RunState.PENDING.value
    )


def quarantined(store: Store) -> dict[str, str]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT name, disabled_reason FROM beat_schedules WHERE quarantined_at IS NOT NULL"
            )
        )
        return {row.name: row.disabled_reason for row in rows}


def test_the_canary_keeps_firing_beside_an_infinite_end_and_the_other_bad_rows(
    cluster: Cluster, store: Store
) -> None:
    """Issue 29, finding 1: on a0b959d the canary claimed 0 runs in 10 s, beat logged
    `beat tick failed` (timestamp too large) and `schedules health` exited 0."""
    Schedules(store).create(
        "canary", "e2e.record", every=1, start_at=datetime.now(UTC), allow_unregistered=True
    )
    insert_rows(store, BAD_ROWS)
    cluster.beat("beat0")
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)

    wait_until(lambda: set(quarantined(store)) == set(BAD_ROWS), timeout=30, interval=0.5)
    first = canary_runs(store)
    time.sleep(10)
    fired = canary_runs(store) - first

    print(f"canary runs in 10 s beside {len(BAD_ROWS)} bad rows: {fired}")
    assert fired >= 8, cluster.logs()
    assert "beat tick failed" not in cluster.logs()
    reasons = quarantined(store)
    assert "end_at = infinity" in reasons["end-infinity"]
    assert "it never fires" in reasons["cron-february-30"]
    assert "over the 65536-byte limit" in reasons["kwargs-10mb"]
    health = cluster.command("schedules", "health", "--json")
    checks = json.loads(health.stdout)["checks"]
    assert health.returncode == 1, health.stdout
    assert checks["claims"]["ok"] is True, checks["claims"]
    assert checks["schedules"]["ok"] is False
    assert f"{len(BAD_ROWS)} quarantined" in checks["schedules"]["detail"]
