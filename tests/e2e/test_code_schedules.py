"""A real `celery beat` with this scheduler refuses a code schedule it cannot follow:
one line naming the entry and the fix, exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SessionEnv
from tests.e2e.cluster import ROOT

pytestmark = pytest.mark.e2e

SOLAR_APP = """
import os

from celery import Celery
from celery.schedules import solar

app = Celery("solar_app", broker=os.environ["CELERY_BROKER_URL"])
app.conf.update(
    habeat_database_url=os.environ["DATABASE_URL"],
    habeat_redis_url=os.environ["REDIS_URL"],
    habeat_key_prefix=os.environ["HABEAT_KEY_PREFIX"],
    beat_schedule={
        "sunrise-report": {
            "task": "reports.sunrise",
            "schedule": solar("sunrise", 52.52, 13.40),
        },
    },
)
"""

# solar() needs ephem, which is not installed here, only to build an observer: beat
# refuses the entry before asking it anything.
FAKE_EPHEM = """
class Observer:
    pass
"""


def test_a_solar_entry_stops_beat_with_one_line_and_exit_status_2(
    test_env: SessionEnv, tmp_path: Path
) -> None:
    (tmp_path / "solar_app.py").write_text(SOLAR_APP)
    (tmp_path / "ephem.py").write_text(FAKE_EPHEM)
    env = test_env.process_env(PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    env.pop("CELERY_CONFIG_MODULE", None)

    beat = subprocess.run(
        [
            *(sys.executable, "-m", "celery", "-A", "solar_app", "beat"),
            *("-S", "beat.scheduler:HAScheduler", "--pidfile=", "-s", str(tmp_path / "sched")),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert beat.returncode == 2, beat.stderr
    [line] = beat.stderr.splitlines()
    assert line.endswith(
        "CRITICAL/MainProcess] beat cannot start: beat_schedule['sunrise-report']:"
        " solar('sunrise', 52.52, 13.4) is not supported (beat computes no sunrise or sunset"
        " times); use crontab() at a fixed local time, e.g. crontab(hour=7, minute=0),"
        " with 'tz' set to the place's zone"
    )
    assert "Traceback" not in beat.stdout + beat.stderr
