"""A process whose wall clock is off by some seconds, for tests of skewed hosts.

``sitecustomize.py`` in this directory shifts the wall clock of every Python process
that has the directory on its ``PYTHONPATH`` and ``SKEW_VARIABLE`` set: ``time.time``,
``time.time_ns`` and ``datetime.datetime.now``/``utcnow``/``today`` (and
``datetime.date.today``). The monotonic clocks (``time.monotonic``, ``time.sleep``,
``time.perf_counter``) are left alone, as on a host whose clock is set wrong; libfaketime
0.9.10 cannot do that on Python 3.11 (``time.sleep`` breaks). ``skewed_env`` builds the
environment of such a process, ``skew_overrides`` the variables to set on top of one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

#: The variable ``sitecustomize.py`` reads: seconds to add to the wall clock (negative:
#: behind).
SKEW_VARIABLE: Final = "HABEAT_TEST_CLOCK_SKEW"
#: The directory to put first on ``PYTHONPATH``.
SHIM_DIR: Final = Path(__file__).resolve().parent


def skewed_env(seconds: float, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) for a process whose wall clock is ``seconds``
    ahead of this host's (behind if negative)."""
    base = dict(os.environ if env is None else env)
    return base | skew_overrides(seconds, base.get("PYTHONPATH", ""))


def skew_overrides(seconds: float, pythonpath: str = "") -> dict[str, str]:
    """The variables that make a process's wall clock ``seconds`` ahead of this host's
    (behind if negative), given the ``PYTHONPATH`` it would have otherwise."""
    return {
        "PYTHONPATH": os.pathsep.join(part for part in (str(SHIM_DIR), pythonpath) if part),
        SKEW_VARIABLE: repr(float(seconds)),
    }
