"""When the leader loop claims next and how far ahead: the claim window, wider
before a burst (``beat.claim.window``) by the pace measured of claims and builds,
and the wait until the next claim."""

from __future__ import annotations

from beat.claim.window import claim_window, lead_time, seconds_until_claim
from beat.leader.loop_state import LoopState
from beat.leader.maintenance import BURST_MAINTENANCE_INTERVAL

#: The leader wakes this long after a worker's lease expires (seconds), so the reaper
#: sees it expired.
LEASE_EXPIRY_MARGIN = 0.05


class ClaimPacing(LoopState):
    """The claim window and the wait until the next claim."""

    def until_next_claim(self, *, claimed_any: bool) -> float:
        """Seconds to wait: until the next fire time less ``claim_ahead``, or until a
        burst must start being claimed (``beat.claim.window``), or until a worker's
        lease expires (its run is reclaimed at once), or max_wait.

        Something due within ``claim_ahead`` that the last claim did not take (``allow``
        schedules are taken ahead; other overlap policies wait for their fire time,
        jittered runs for theirs) is waited for until its own time."""
        wait = self.config.max_wait
        until_next = self.store.seconds_until_next_fire(self.leadership.epoch)
        if until_next is not None:
            ahead = self.config.claim_ahead
            if until_next > ahead or claimed_any:
                wait = min(wait, until_next - ahead)  # <= 0: claim again at once
            else:
                wait = min(wait, until_next)
        if self._adapts and self._armed_room() > 0:
            profile = self.store.due_profile(self.config.claim_ahead_max)
            start = seconds_until_claim(
                profile, base=self.config.claim_ahead, per_run=self._run_pace()
            )
            # Not at once again after a claim that took nothing (rows locked elsewhere).
            if start is not None and (start > 0 or claimed_any):
                wait = min(wait, max(start, 0.0))
        until_expiry = self.store.seconds_until_lease_expiry()
        if until_expiry is not None:
            # The reaper compares with now(): wake just after the expiry, not before it.
            wait = min(wait, until_expiry + LEASE_EXPIRY_MARGIN)
        return wait

    @property
    def _adapts(self) -> bool:
        """Whether the claim window widens before a burst (``beat.claim.window``)."""
        return self.config.claim_ahead_max > self.config.claim_ahead

    def _armed_room(self) -> int:
        """How many more runs may be held armed (``max_armed``)."""
        return self.config.max_armed - len(self.armed)

    def _run_pace(self) -> float:
        """Seconds a run takes this leader to claim and build, as measured so far."""
        return self.claim_pace.per_run + self.build_pace.per_run

    def build_lead(self, runs: int) -> float:
        """Seconds to allow for building the messages of ``runs`` armed runs."""
        return lead_time(runs, self.build_pace.per_run)

    def _window(self) -> float:
        """Seconds ahead to claim: ``claim_ahead``, or as far as a coming burst needs
        (``beat.claim.window``); ``claim_ahead`` once ``max_armed`` runs are held.
        While a burst is claimed batch after batch the window keeps its far end, and
        is looked at again once a second (the pace measured meanwhile may widen it)."""
        base = self.config.claim_ahead
        room = self._armed_room()
        if not self._adapts or room <= 0:
            return base
        now = self.clock()
        kept = self._claim_until - now if self._in_burst else 0.0
        if self._in_burst and now < self._replan_at:
            return max(base, kept)
        profile = self.store.due_profile(self.config.claim_ahead_max)
        window = claim_window(profile, base=base, per_run=self._run_pace(), room=room)
        window = max(window, kept)
        self._claim_until = now + window
        self._replan_at = now + BURST_MAINTENANCE_INTERVAL
        return window
