"""The cut-over, with real processes: a source beat (celery beat with its default
PersistentScheduler, or with django-celery-beat's DatabaseScheduler) fires a schedule
every 5 s to a real worker; it is stopped, the schedule is imported with its last
run, and two of this scheduler's beats take over. Across the switch every fire time
runs exactly once: none twice (the schedule that just ran does not fire again at
once), none skipped."""

from __future__ import annotations

import signal
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.conftest import ADMIN_DATABASE_URL
from tests.e2e.cluster import ROOT, Cluster, Process, wait_until

pytestmark = pytest.mark.e2e

PERIOD = 5.0
NAME = "every-5-s"

#: The app the source beat ran with, and this scheduler's beats run with after it.
APP_MODULE = """
from app import celery_app as app
import tests.e2e.jobs  # noqa: F401  (the jobs, on this app)

app.conf.beat_schedule = {
    "NAME": {"task": "e2e.plain_record", "schedule": PERIOD, "args": ("cutover",)},
}
""".replace("NAME", NAME).replace("PERIOD", repr(PERIOD))

#: The app django-celery-beat's beat ran with: Django set up on the source database,
#: the schedule a PeriodicTask row (made by django-celery-beat's models).
DJANGO_APP_MODULE = """
import os

import django
from django.conf import settings

settings.configure(
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql",
                           "NAME": os.environ["SOURCE_DATABASE"], "USER": "USER",
                           "HOST": "HOST", "PORT": "PORT"}},
    INSTALLED_APPS=["django_celery_beat"],
    USE_TZ=True,
    TIME_ZONE="UTC",
    DEFAULT_AUTO_FIELD="django.db.models.AutoField",
)
django.setup()

from app import celery_app as app  # noqa: E402
import tests.e2e.jobs  # noqa: E402, F401


def make_schedule():
    from django.core.management import call_command
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    call_command("migrate", "django_celery_beat", verbosity=0)
    every = IntervalSchedule.objects.create(every=int(PERIOD), period="seconds")
    PeriodicTask.objects.create(
        name="SCHEDULE_NAME", task="e2e.plain_record", interval=every, args='["cutover"]'
    )
"""


def executions(cluster: Cluster) -> list[tuple[str, datetime]]:
    with cluster.store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT task_id, at FROM e2e_effects WHERE label = 'cutover' ORDER BY at")
        )
        return [(row.task_id, row.at) for row in rows]


def our_runs(cluster: Cluster) -> dict[str, datetime]:
    """This scheduler's runs of the schedule, by run ID (the Celery task ID): fire times."""
    with cluster.store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id::text, fire_at FROM beat_runs WHERE schedule_name = :name"),
            {"name": NAME},
        )
        return {row[0]: row[1] for row in rows}


def seconds_between(times: list[datetime]) -> list[float]:
    return [(later - earlier).total_seconds() for earlier, later in pairwise(times)]


class Switch:
    """A cut-over on ``cluster``: the app modules in ``tmp_path``, a worker up."""

    def __init__(self, cluster: Cluster, tmp_path: Path, module: str, **env: str) -> None:
        self.cluster, self.tmp_path, self.module = cluster, tmp_path, module
        self.env = {"PYTHONPATH": f"{ROOT}:{tmp_path}", **env}
        cluster.worker("worker", **self.env)

    def celery(self, name: str, *args: str, module: str | None = None) -> Process:
        program = [sys.executable, "-m", "celery", "-A", module or self.module]
        return self.cluster.start(name, *args, program=program, **self.env)

    def run_source(self, *args: str) -> list[datetime]:
        """The source beat until its second fire time ran; stopped right after it.
        When its runs ran."""
        source = self.celery("source-beat", "beat", "--pidfile=", "-l", "info", *args)
        wait_until(lambda: len(executions(self.cluster)) >= 2, timeout=60, interval=0.1)
        source.signal(signal.SIGTERM)
        source.popen.wait(timeout=15)
        return [at for _, at in executions(self.cluster)]

    def import_and_take_over(self, *import_args: str) -> datetime:
        """Import, then start two of this scheduler's beats; when the import was done."""
        imported = self.celery("import", "schedules", "import", *import_args, module="cutover_app")
        assert imported.popen.wait(timeout=60) == 0, imported.output()
        done = self.cluster.store.now()
        for name in ("beat-1", "beat-2"):
            schedule = str(self.tmp_path / f"{name}-schedule")
            self.celery(
                name,
                *("beat", "-S", "beat.scheduler:HAScheduler", "--pidfile=", "-s", schedule),
                module="cutover_app",
            )
        return done

    def our_fire_times(self, after: int) -> list[datetime]:
        """Three fire times under this scheduler, each run once (as all runs are)."""
        wait_until(lambda: len(executions(self.cluster)) >= after + 3, timeout=90)
        time.sleep(2)  # a duplicate would come within moments
        counts: dict[str, int] = {}
        for task_id, _ in executions(self.cluster):
            counts[task_id] = counts.get(task_id, 0) + 1
        assert all(count == 1 for count in counts.values()), counts
        runs = our_runs(self.cluster)
        return sorted(fire_at for task_id, fire_at in runs.items() if task_id in counts)


def assert_once_across(
    theirs: list[datetime], ours: list[datetime], switch_seconds: float, imported: datetime
) -> None:
    """Fire times a period apart on each side; across the switch, a period too, or,
    when a fire time came due while no beat ran, that one once, at the import."""
    assert len(theirs) == 2
    assert len(ours) >= 3
    for times in (theirs, ours):
        assert all(PERIOD - 1 <= gap <= PERIOD + 1 for gap in seconds_between(times))
    switch = (ours[0] - theirs[-1]).total_seconds()
    if switch_seconds:
        assert ours[0] <= imported
        assert PERIOD < switch <= PERIOD + switch_seconds + 10
    else:
        # The schedule that ran last under the source fires one period after it.
        assert PERIOD - 1 <= switch <= PERIOD + 1
    print(f"fire times across the switch: {[t.isoformat() for t in theirs + ours]}")


@pytest.mark.parametrize(
    "switch_seconds",
    [
        pytest.param(0.0, id="switched-between-two-fire-times"),
        # A fire time comes due while no beat runs: it runs once, at the import.
        pytest.param(PERIOD + 2, id="a-fire-time-due-during-the-switch"),
    ],
)
def test_every_fire_time_runs_once_across_the_switch_from_celery_beat(
    cluster: Cluster, tmp_path: Path, switch_seconds: float
) -> None:
    (tmp_path / "cutover_app.py").write_text(APP_MODULE)
    switch = Switch(cluster, tmp_path, "cutover_app")
    schedule_file = str(tmp_path / "celerybeat-schedule")
    theirs = switch.run_source("-S", "celery.beat:PersistentScheduler", "-s", schedule_file)
    time.sleep(switch_seconds)
    imported = switch.import_and_take_over("celery-beat", "--schedule-file", schedule_file)
    assert_once_across(theirs, switch.our_fire_times(len(theirs)), switch_seconds, imported)


@pytest.fixture
def source_database() -> Iterator[str]:
    """A scratch database for django-celery-beat, dropped after."""
    name = f"habeat_e2e_dcb_{uuid.uuid4().hex[:8]}"
    admin = make_url(ADMIN_DATABASE_URL).set(drivername="postgresql")
    with psycopg.connect(admin.render_as_string(False), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(admin.render_as_string(False), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_every_fire_time_runs_once_across_the_switch_from_django_celery_beat(
    cluster: Cluster, tmp_path: Path, source_database: str
) -> None:
    admin = make_url(ADMIN_DATABASE_URL)
    (tmp_path / "cutover_app.py").write_text(APP_MODULE.replace('"NAME": ', "# "))
    django_app = (
        DJANGO_APP_MODULE.replace("SCHEDULE_NAME", NAME)
        .replace("PERIOD", repr(PERIOD))
        .replace('"USER"', repr(admin.username or "postgres"))
        .replace('"HOST"', repr(admin.host or "127.0.0.1"))
        .replace('"PORT"', repr(str(admin.port or 5432)))
    )
    (tmp_path / "django_beat_app.py").write_text(django_app)
    switch = Switch(cluster, tmp_path, "django_beat_app", SOURCE_DATABASE=source_database)
    made = switch.cluster.start(
        "make-schedule",
        "-c",
        "import django_beat_app; django_beat_app.make_schedule()",
        program=[sys.executable],
        **switch.env,
    )
    assert made.popen.wait(timeout=60) == 0, made.output()
    theirs = switch.run_source("-S", "django_celery_beat.schedulers:DatabaseScheduler")
    source_url = admin.set(drivername="postgresql", database=source_database)
    imported = switch.import_and_take_over(
        "django-celery-beat", "--database-url", source_url.render_as_string(False)
    )
    assert_once_across(theirs, switch.our_fire_times(len(theirs)), 0.0, imported)
