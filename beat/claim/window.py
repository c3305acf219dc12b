"""How far ahead the leader claims: a window that widens before a burst.

Runs claimed ahead are built ahead and sent at their fire time (``beat.leader.armed``), so
their lateness is one round trip to the broker, however many share the fire time,
as long as the claim and the build of all of them end before it. Both take time in
proportion to the runs: 100,000 runs due at midnight take the leader seconds to
claim and build. A fixed window (``habeat_claim_ahead``) covers a small burst only.

So the leader looks ahead, up to ``habeat_claim_ahead_max``, at how many runs are
due second by second (``DueProfile``), and at how long a run has taken it to claim
and to build (``Pace``, measured on its own claims and builds). A fire second must
start being claimed once the runs due up to it, at that pace, would take all the
time left before it less ``habeat_claim_ahead``: the window then reaches it, and it is claimed batch
after batch (see ``claim_window`` and ``seconds_until_claim``).

The window is bounded by memory: at most ``habeat_max_armed`` runs are held armed;
beyond that the later ones are claimed closer to their time. Outside a burst the
window is ``habeat_claim_ahead``, so a schedule paused or edited is claimed ahead by
no more than that.

The profile counts schedules of the ``allow`` overlap policy (the others are not
claimed ahead): a schedule that fires more than once within the window counts once,
and its other runs are claimed in the same claim, so the pace measured covers them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

#: The paces a leader assumes before it has measured its own (seconds per run to
#: claim, to build its message): slow on purpose, so that a first burst is claimed
#: early rather than late.
FIRST_CLAIM_PACE = 0.0004
FIRST_BUILD_PACE = 0.0001
#: The time a run takes to claim and build, times this, is what the window allows
#: for it: a pass may be slower than the last ones (other work on the host, a
#: checkpoint of PostgreSQL, a larger payload).
SAFETY = 2.0
#: A burst that takes less than this (seconds) to claim and build is left to
#: ``habeat_claim_ahead``: no wider window, no earlier wake-up.
SMALL_LEAD = 0.25
#: How much of the pace measured so far is kept at each new claim (0: only the last).
DECAY = 0.8
#: Claims of fewer runs than this say little of the pace: their fixed cost dominates.
SMALL_CLAIM = 50


#: The profile counts fire times by whole seconds.
BUCKET = 1.0


@dataclass(frozen=True, slots=True)
class DueSecond:
    """Schedules due in one second: the first ``seconds`` from now, ``count`` of them."""

    seconds: float
    count: int


#: What is due within the look-ahead, by fire second, earliest first.
DueProfile = Sequence[DueSecond]


class Pace:
    """Seconds a run takes this leader to claim (or to build), from its own claims
    (builds): decayed sums, so that a large claim weighs more than a small one and
    old ones fade."""

    def __init__(self, first: float) -> None:
        self._seconds = first * SMALL_CLAIM
        self._runs = float(SMALL_CLAIM)

    def observe(self, runs: int, seconds: float) -> None:
        """``runs`` runs took ``seconds``."""
        if runs < SMALL_CLAIM:
            return
        self._seconds = self._seconds * DECAY + seconds
        self._runs = self._runs * DECAY + runs

    @property
    def per_run(self) -> float:
        return self._seconds / self._runs


def lead_time(runs: int, per_run: float) -> float:
    """Seconds to allow for ``runs`` runs that take ``per_run`` each (measured)."""
    return runs * per_run * SAFETY


def claim_window(profile: DueProfile, *, base: float, per_run: float, room: int) -> float:
    """Seconds ahead to claim now: ``base``, or up to the latest fire second whose
    claim must start now (the runs due up to it would not be ready in time if claimed
    later), as long as they fit in ``room`` more armed runs."""
    window = base
    for second, due, lead in _leads(profile, per_run):
        if due > room:
            break
        # (A millisecond of tolerance: woken at the start it computed, it claims.)
        if lead >= SMALL_LEAD and second.seconds - lead <= base + 0.001:
            # To the end of its second: all of it, though the clocks that measure the
            # window (PostgreSQL's, then this host's) move on between claims.
            window = max(window, second.seconds + BUCKET)
    return window


def seconds_until_claim(profile: DueProfile, *, base: float, per_run: float) -> float | None:
    """Seconds until a fire second of ``profile`` must start being claimed (<= 0: now),
    or None if nothing in it needs more than ``base`` ahead."""
    starts = [
        second.seconds - lead - base
        for second, _, lead in _leads(profile, per_run)
        if lead >= SMALL_LEAD
    ]
    return min(starts, default=None)


def _leads(profile: DueProfile, per_run: float) -> Iterator[tuple[DueSecond, int, float]]:
    """Each fire second of ``profile`` with the runs due up to it, and the seconds to
    allow for claiming and building them."""
    due = 0
    for second in profile:
        due += second.count
        yield second, due, lead_time(due, per_run)
