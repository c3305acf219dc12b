"""Projects adopt the scheduler as they configure Celery beat today: each style is a
stand-in package in ``adoption_styles/``, loaded by real ``celery`` processes. For each:
``schedules migrate``, ``schedules sync``, a real ``celery beat`` that leads, and every
entry's next 500 fire times from several instants (around DST changes too) equal to
those Celery's own schedule object gives, stepped as ``celery beat`` steps it
(``adoption_styles/fire_times.py``), but for the DST cases the README documents."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from beat.ops.schedules import Schedules
from beat.schedule.timing import Cron
from beat.store.all_roles import Store
from tests.conftest import SessionEnv

pytestmark = pytest.mark.e2e

STYLES_DIR = Path(__file__).resolve().parent / "adoption_styles"
CELERY = Path(sys.executable).parent / "celery"


def celery(
    env: SessionEnv, app: str, *args: str, **variables: str
) -> subprocess.CompletedProcess[str]:
    """``celery -A <app> <args>`` with the stand-ins importable, on this session's state."""
    return subprocess.run(
        [str(CELERY), "-A", app, *args],
        cwd=STYLES_DIR,
        env=env.process_env(PYTHONPATH=str(STYLES_DIR), **variables),
        capture_output=True,
        text=True,
        timeout=120,
    )


#: Instants the fire times are compared from: a plain one, and the days before the
#: DST changes of 2027 in Europe (28 March, 31 October) and the US (14 March, 7 November).
STARTS = (
    "2027-01-15T10:07:13+00:00",
    "2027-03-27T20:00:00+00:00",
    "2027-10-30T20:00:00+00:00",
    "2027-03-13T20:00:00+00:00",
    "2027-11-06T20:00:00+00:00",
)
FIRES = 500
#: Seconds a started beat gets to take the lease (a deadline, not a measurement).
LEAD_TIMEOUT = 60.0


@dataclass(frozen=True)
class Style:
    module: str
    zone: str
    #: Beat's arguments: the app names the scheduler itself when it has beat_scheduler.
    beat_args: tuple[str, ...] = ("-S", "ha")
    variables: dict[str, str] = field(default_factory=dict)


#: A host whose local time is Berlin's (Celery's zone for an app with enable_utc off).
BERLIN_HOST = {"TZ": "Europe/Berlin"}
STYLES = {
    "celery docs": Style("docs_style.celery_app", "UTC"),
    "on_after_finalize": Style("signal_style.celery_app", "UTC"),
    "old-style settings": Style("old_settings_style.celery_app", "America/New_York"),
    "django namespace": Style("django_namespace_style.celery_app", "Europe/Berlin", ()),
    "local time": Style(
        "local_time.celery_app", "Europe/Berlin", variables={"TZ": "Europe/Berlin"}
    ),
    "pickle": Style("pickle_style.celery_app", "Asia/Kolkata"),
}


@pytest.mark.parametrize("style", STYLES.values(), ids=STYLES.keys())
def test_each_style_migrates_syncs_leads_and_fires_when_celery_would(
    test_env: SessionEnv, store: Store, redis_client: redis.Redis, style: Style, tmp_path: Path
) -> None:
    migrated = celery(test_env, style.module, "schedules", "migrate", **style.variables)
    assert migrated.returncode == 0, migrated.stderr
    synced = celery(test_env, style.module, "schedules", "sync", "--json", **style.variables)
    assert synced.returncode == 0, synced.stderr
    compared = compare_fire_times(test_env, style)
    assert compared["zone"] == style.zone
    assert set(json.loads(synced.stdout)["created"]) == set(compared["entries"]), synced.stdout
    for name, entry in compared["entries"].items():
        assert entry["elsewhere"] == [], f"{name}: {entry}"
        assert entry["compared"] >= FIRES * len(STARTS) - len(entry["at_dst"]), f"{name}: {entry}"
    crons = [s for s in Schedules(store).list() if isinstance(s.definition.trigger, Cron)]
    assert {schedule.definition.timezone for schedule in crons} == {style.zone}

    assert lead(test_env, style, tmp_path) is not None, "beat did not take the lead"
    if style.module.startswith("pickle_style"):
        assert published_content_types(test_env, redis_client) == {"application/x-python-serialize"}


def compare_fire_times(env: SessionEnv, style: Style) -> dict[str, Any]:
    script = STYLES_DIR / "fire_times.py"
    done = subprocess.run(
        [sys.executable, str(script), style.module, str(FIRES), *STARTS],
        cwd=STYLES_DIR,
        env=env.process_env(PYTHONPATH=str(STYLES_DIR), **style.variables),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def lead(env: SessionEnv, style: Style, logs: Path) -> str | None:
    """Start ``celery beat`` on the style's app until ``schedules leader`` names a holder
    (returned, None if none by the deadline); the beat is stopped by its PID."""
    log = (logs / "beat.log").open("wb")
    beat = subprocess.Popen(
        [str(CELERY), "-A", style.module, "beat", *style.beat_args, "-l", "info"],
        cwd=STYLES_DIR,
        env=env.process_env(PYTHONPATH=str(STYLES_DIR), **style.variables),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + LEAD_TIMEOUT
        while time.monotonic() < deadline and beat.poll() is None:
            status = celery(env, style.module, "schedules", "leader", "--json", **style.variables)
            document = json.loads(status.stdout) if status.returncode == 0 else {}
            if document.get("valid"):
                time.sleep(3)  # a fire time or two of its 2-second schedules
                return str(document["leader"]["holder"])
            time.sleep(0.5)
        return None
    finally:
        if beat.poll() is None:
            os.kill(beat.pid, signal.SIGTERM)
        beat.wait(timeout=30)
        log.close()


def published_content_types(env: SessionEnv, client: redis.Redis) -> set[str]:
    """The content types of the messages beat left in the broker's default queue."""
    queue = f"{env.broker_key_prefix}celery"
    messages = [json.loads(raw) for raw in client.lrange(queue, 0, -1)]
    client.delete(queue)
    return {message["content-type"] for message in messages}


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
        "nightly-0230",
        "--json",
        TZ="Europe/Berlin",
    )
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["timezone"] == "Europe/Berlin"
    assert {fire["local"][11:19] for fire in document["upcoming"]} == {"02:30:00"}
    text = celery(test_env, "local_time.celery_app", "schedules", "show", "nightly-0230").stdout
    assert "Europe/Berlin" in text
