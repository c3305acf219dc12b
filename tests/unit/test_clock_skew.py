"""The clock-skew shim (``tests.clock_skew``) shifts a process's wall clock, and only it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.clock_skew import skewed_env
from tests.e2e.cluster import ROOT


def _python(code: str, skew: float) -> str:
    """Run ``code`` in a new interpreter whose wall clock is ``skew`` seconds off."""
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=skewed_env(skew, os.environ | {"PYTHONPATH": str(ROOT)}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


def test_a_skewed_process_sees_its_wall_clock_off_and_sleeps_on_time() -> None:
    code = """
import datetime, logging, time
from datetime import UTC, datetime as dt
skews = [
    time.time() - time.clock_gettime(time.CLOCK_REALTIME),
    time.time_ns() / 1e9 - time.clock_gettime(time.CLOCK_REALTIME),
    dt.now(UTC).timestamp() - time.clock_gettime(time.CLOCK_REALTIME),
    dt.utcnow().replace(tzinfo=UTC).timestamp() - time.clock_gettime(time.CLOCK_REALTIME),
    time.mktime(time.localtime()) + 0.5 - time.clock_gettime(time.CLOCK_REALTIME),  # whole s
]
started = time.monotonic(); time.sleep(0.2); slept = time.monotonic() - started
real = datetime.datetime.fromtimestamp(0, UTC)  # made by C code: the true class
record = logging.makeLogRecord({"msg": "x"})
logging.Formatter("%(asctime)s").format(record)  # converter = time.localtime, unbound
print(*(round(skew, 2) for skew in skews), round(slept, 2), isinstance(real, dt))
"""
    *skews, slept, real_class = _python(code, -120).split()
    # Each read beside the true clock: a loaded machine may pause between the two reads
    # (and the mktime one counts whole seconds).
    assert all(abs(float(skew) + 120) < 1.5 for skew in skews), skews
    # Slept on the true clock: 0.2 s, not minus two minutes (a loaded machine may be
    # late to wake, never early).
    assert 0.15 <= float(slept) < 5
    assert real_class == "True"
    assert all(abs(float(skew)) < 1.5 for skew in _python(code, 0).split()[:5])


def test_a_skewed_process_pickles_the_datetime_class() -> None:
    """A worker's guard against poison messages pickles what it keeps; the shim's classes
    were local ones, which pickle refuses ('Can't pickle local object'), and a good
    message was set aside as invalid."""
    code = """
import datetime, pickle
print(pickle.loads(pickle.dumps(datetime.datetime)) is datetime.datetime,
      pickle.loads(pickle.dumps(datetime.date)) is datetime.date)
"""
    assert _python(code, -120).split() == ["True", "True"]
