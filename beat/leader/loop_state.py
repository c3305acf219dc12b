"""What every part of the leader loop shares: its collaborators (``beat.leader.ports``)
and what it keeps from one pass to the next."""

from __future__ import annotations

import time
from collections.abc import Callable

from beat.claim.planning import PlanningRules
from beat.claim.window import FIRST_BUILD_PACE, FIRST_CLAIM_PACE, Pace
from beat.config import BeatConfig
from beat.leader.armed import ArmedRuns
from beat.leader.notifier import Notifier
from beat.leader.overlapped_send import OverlappedSend
from beat.leader.ports import (
    ClaimStore,
    Leader,
    MessageRecovery,
    Publisher,
    RunCrashes,
    Sends,
    Waiter,
)
from beat.leader.reporting import Reporter
from beat.leader.schedule_series import ScheduleSeriesGauges
from beat.lease.beacon import WorkerDeaths
from beat.models import RunToPublish
from beat.records import DatabaseClock
from beat.store.leader import Claim


class _NoCrashes:
    def dead_runs(self, *, limit: int) -> WorkerDeaths:
        return WorkerDeaths()


NO_CRASH_DETECTION = _NoCrashes()


class LoopState:
    """The loop's collaborators and state, set once; its parts (``beat.leader.loop``
    composes them) read and update them."""

    def __init__(
        self,
        *,
        config: BeatConfig,
        store: ClaimStore,
        leadership: Leader,
        publisher: Publisher,
        waiter: Waiter,
        lost_messages: MessageRecovery,
        armed: ArmedRuns,
        reporter: Reporter,
        clock: Callable[[], float] = time.monotonic,
        after_claim_commit: Callable[[Claim], None] | None = None,
        crash_detection: RunCrashes | None = None,
        sends: Sends | None = None,
        series_gauges: ScheduleSeriesGauges | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.leadership = leadership
        self.publisher = publisher
        self.waiter = waiter
        self.lost_messages = lost_messages
        self.armed = armed
        self.report = reporter
        self.clock = clock
        #: Test hook: called after a claim commits and before its runs are published.
        self.after_claim_commit = after_claim_commit
        #: Runs of dead workers, reclaimed without waiting for their lease.
        self.crashes: RunCrashes = crash_detection or NO_CRASH_DETECTION
        self.rules = PlanningRules(
            misfire_grace=config.misfire_grace, max_catchup=config.max_catchup
        )
        #: The last claim was a full batch: more are due (see _maintenance_due).
        self._in_burst = False
        #: Seconds a run takes this leader to claim, and to build (``beat.claim.window``).
        self.claim_pace = Pace(FIRST_CLAIM_PACE)
        self.build_pace = Pace(FIRST_BUILD_PACE)
        #: clock() up to which the burst being claimed is claimed ahead, and when to
        #: look again at what is due (once a second while a burst is claimed).
        self._claim_until = 0.0
        self._replan_at = 0.0
        self._next_maintenance = 0.0
        self._next_retention = 0.0  # clock() of the next history prune
        self._next_summary = 0.0  # clock() of the next summary of finished runs
        self._next_schedule_series = 0.0  # clock() of the next read of the schedules' series
        self._next_monitor = 0.0  # clock() of the failing monitor's next pass
        #: The per-schedule series this process serves while it leads.
        self.series_gauges = series_gauges or ScheduleSeriesGauges()
        #: Sends the notification outbox while this process leads.
        self.notifier = notifier or Notifier()
        self._next_notify = 0.0  # clock() of the next look at the notification outbox
        self._next_stall_check = 0.0  # clock() of the next look for a stall of the cluster
        #: The send of a burst's batch, in flight while the next batch is claimed.
        self.sends: Sends = sends or OverlappedSend()
        #: A burst's batch claimed while the send before it failed: sent next pass.
        self._carried: list[RunToPublish] = []
        #: The database's clock as the last claim read it (before this term's first
        #: claim, as the takeover did): messages' expiry and lateness count on it.
        self.database: DatabaseClock | None = None
