"""Runs claimed ahead of their fire time, kept in memory until it comes.

A claim that takes schedules due within ``claim_ahead`` seconds returns their
runs as *armed*: the claiming leader builds their messages ahead and sends
them at the fire time. The deadline of each is on this host's monotonic clock,
measured from the database's ``now`` at the claim (``DatabaseClock``), so a
wrong wall clock cannot send a run early. Armed runs are also in the outbox:
if this process stops leading they are dropped here, and whoever leads next
publishes them from the outbox at their fire time.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import datetime

from beat.models import RunToPublish
from beat.records import DatabaseClock
from beat.store.leader import Claim

#: Runs claimed ahead for one fire time: (monotonic deadline, runs).
Armed = tuple[float, list[RunToPublish]]
#: Seconds it takes to build the messages of so many runs.
Lead = Callable[[int], float]


def no_lead(runs: int) -> float:
    return 0.0


class ArmedRuns:
    """Armed runs by fire time. ``drop`` may be called from the lease renewer's
    thread: the dict is swapped, never changed under the loop's feet."""

    def __init__(self) -> None:
        self._armed: dict[datetime, Armed] = {}

    def __len__(self) -> int:
        return sum(len(runs) for _, runs in list(self._armed.values()))

    def arm(self, claim: Claim) -> None:
        """Keep ``claim``'s armed runs for their fire time (never early: the deadline
        is the fire time's distance from the database's ``now`` at the claim)."""
        database = DatabaseClock(now=claim.now, clock=claim.clock)
        for run in claim.armed:
            if run.fire_at is None:  # armed runs have one; this narrows the type
                continue
            self.keep(run.fire_at, database.monotonic_at(run.fire_at), [run])

    def keep(self, fire_at: datetime, deadline: float, runs: list[RunToPublish]) -> None:
        earlier, kept = self._armed.get(fire_at, (deadline, []))
        kept.extend(runs)
        self._armed[fire_at] = (max(earlier, deadline), kept)

    def drop(self) -> int:
        """Forget every armed run (this process stops leading); how many there were."""
        armed, self._armed = self._armed, {}
        return sum(len(runs) for _, runs in list(armed.values()))

    def discard(self, run_ids: set[uuid.UUID]) -> int:
        """Forget the armed runs ``run_ids`` (this leader cancelled them in the database,
        pausing their schedule): a plain task has no guard to refuse a cancelled run
        sent anyway. How many were armed."""
        armed = self._armed
        discarded = 0
        for fire_at, (deadline, runs) in list(armed.items()):
            kept = [run for run in runs if run.id not in run_ids]
            discarded += len(runs) - len(kept)
            if not kept:
                armed.pop(fire_at, None)
            elif len(kept) < len(runs):
                armed[fire_at] = (deadline, kept)
        return discarded

    def run_ids(self) -> set[uuid.UUID]:
        """The runs armed here: this leader sends them at their fire time."""
        return {run.id for _, runs in list(self._armed.values()) for run in runs}

    def next_deadline(self) -> float:
        return self.next_start()

    def next_start(self, lead: Lead = no_lead) -> float:
        """When the first fire time's messages must start being built: its deadline
        less ``lead`` (seconds to build so many runs)."""
        return min(
            (deadline - lead(len(runs)) for deadline, runs in list(self._armed.values())),
            default=float("inf"),
        )

    def any_due(self, now: float, lead: Lead = no_lead) -> bool:
        return self.next_start(lead) <= now

    def take_until(
        self, until: float, lead: Lead = no_lead
    ) -> Iterator[tuple[datetime, float, list[RunToPublish]]]:
        """Remove and yield, a fire time at a time in fire-time order, the armed runs
        whose messages must start being built before ``until`` (their deadline less
        ``lead``): with a lead, a large later fire time may be taken before a small
        earlier one. A caller that fails to send what it took gives it back with
        :meth:`keep`. The caller may take more while this runs (it sends an earlier
        fire time while it waits for a later one): what it took is not yielded."""
        armed = self._armed  # drop() may swap in another dict meanwhile
        for fire_at in sorted(armed):
            found = armed.get(fire_at)
            if found is None:
                continue  # taken meanwhile
            deadline, runs = found
            if deadline - lead(len(runs)) > until:
                continue
            del armed[fire_at]
            yield fire_at, deadline, runs
