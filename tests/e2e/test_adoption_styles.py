"""Projects adopt the scheduler as they configure Celery beat today: each style is a
stand-in package in ``adoption_styles/``, loaded by a real ``celery`` process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from beat.api import Schedules
from beat.store import Store
from tests.conftest import SessionEnv

pytestmark = pytest.mark.e2e

STYLES = Path(__file__).resolve().parent / "adoption_styles"
CELERY = Path(sys.executable).parent / "celery"


def celery(
    env: SessionEnv, app: str, *args: str, **variables: str
) -> subprocess.CompletedProcess[str]:
    """``celery -A <app> <args>`` with the stand-ins importable, on this session's state."""
    return subprocess.run(
        [str(CELERY), "-A", app, *args],
        cwd=STYLES,
        env=env.process_env(PYTHONPATH=str(STYLES), **variables),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_schedules_added_in_an_on_after_finalize_handler_are_synced_and_kept(
    test_env: SessionEnv, store: Store
) -> None:
    """issue 36, finding 2: add_periodic_task in an on_after_finalize handler of a module
    autodiscover_tasks() finds is synced by `schedules sync` as beat syncs it; a sync that
    finds none of the stored code schedules removes nothing without --prune."""
    synced = celery(test_env, "signal_style.celery_app", "schedules", "sync", "--json")
    assert synced.returncode == 0, synced.stderr
    names = {schedule.name for schedule in Schedules(store).list()}
    assert names == {"heartbeat every hour", "cleanup at 02:30"}

    emptied = celery(
        test_env, "signal_style.celery_app", "schedules", "sync", SIGNAL_STYLE_NO_SCHEDULES="1"
    )
    assert emptied.returncode == 2, emptied.stderr
    (line,) = emptied.stderr.strip().splitlines()
    assert "--prune" in line
    assert {schedule.name for schedule in Schedules(store).list()} == names

    pruned = celery(
        test_env,
        "signal_style.celery_app",
        "schedules",
        "sync",
        "--prune",
        "--json",
        SIGNAL_STYLE_NO_SCHEDULES="1",
    )
    assert pruned.returncode == 0, pruned.stderr
    assert sorted(json.loads(pruned.stdout)["removed"]) == sorted(names)
    assert Schedules(store).list() == []


def test_an_app_on_local_time_fires_in_the_hosts_zone_and_shows_it(
    test_env: SessionEnv, store: Store
) -> None:
    """issue 36, finding 4: enable_utc = False and no timezone, on a host in Europe/Berlin:
    Celery reads crontab(minute=30, hour=2) at 02:30 Berlin time, and so does this
    scheduler; `schedules show` names the zone."""
    synced = celery(test_env, "local_time.celery_app", "schedules", "sync", TZ="Europe/Berlin")
    assert synced.returncode == 0, synced.stderr
    shown = celery(
        test_env,
        "local_time.celery_app",
        "schedules",
        "show",
        "nightly at 02:30",
        "--json",
        TZ="Europe/Berlin",
    )
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["timezone"] == "Europe/Berlin"
    assert {fire["local"][11:19] for fire in document["upcoming"]} == {"02:30:00"}
    text = celery(test_env, "local_time.celery_app", "schedules", "show", "nightly at 02:30").stdout
    assert "Europe/Berlin" in text
