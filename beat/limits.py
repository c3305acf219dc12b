"""Bounds on what a schedule may hold, shared by the API, the CLI and the checks made
again where stored rows are read. Each is far above any real need and low enough that
a value past it is a mistake (a unit off, a runaway loop) or an attack."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

#: Longest duration anywhere (an interval, a one-off's delay, a relative expiry): an
#: interval longer than ten years would in effect never fire.
MAX_DURATION: Final = timedelta(days=3650)

#: Largest value of an ``integer`` column (max_runs, max_attempts): PostgreSQL refuses more.
MAX_INT4: Final = 2**31 - 1

#: Longest jitter of a schedule (a day): a longer delay is a mistake, and a huge one
#: overflows the date arithmetic of every claim.
MAX_JITTER_SECONDS: Final = 86_400.0

#: Most failures in a row a monitor may wait for (``alert_after_failures``,
#: ``pause_after_failures``): the leader reads at most this many of a schedule's newest
#: runs to count them.
MAX_FAILURE_THRESHOLD: Final = 100

#: A notification channel's name (``beat.notify``), and the most channels a schedule
#: routes its incidents to.
CHANNEL_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_CHANNEL_NAME_LENGTH: Final = 100
MAX_SCHEDULE_CHANNELS: Final = 20
