"""How a pass of the leader loop sends runs: at once, or built ahead and sent at
their fire time; the runs whose message cannot be built failed and their schedules
quarantined, cancelled runs revoked."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime

from beat.errors import HABeatError, StaleEpoch
from beat.leader.loop_state import LoopState
from beat.leader.reporting import CLAIM
from beat.models import RunToPublish, UnpublishableRun
from beat.publish.dispatch import WAIT_STEP


class Publishing(LoopState):
    """Sending runs to the broker, confirmed by the lease, and recording what was sent."""

    def _waiting_only(self) -> float:
        self.leadership.made_progress()
        return WAIT_STEP

    def _send_armed(
        self,
        fire_at: datetime,
        deadline: float,
        runs: list[RunToPublish],
        *,
        while_waiting: Callable[[], float],
    ) -> None:
        """Send one fire time's armed runs at ``deadline``, built ahead."""
        try:
            self._publish(runs, source=CLAIM, deadline=deadline, while_waiting=while_waiting)
        except Exception as exc:
            # Kept for the next pass if the broker failed, or for the step-down to
            # drop if the lease is lost; not if PostgreSQL failed after the send.
            if isinstance(exc, StaleEpoch) or not isinstance(exc, HABeatError):
                self.armed.keep(fire_at, deadline, runs)
            raise

    def _publish(
        self,
        runs: list[RunToPublish],
        *,
        source: str,
        deadline: float | None = None,
        while_waiting: Callable[[], float] | None = None,
    ) -> None:
        """Publish ``runs`` (from the ``claim``, the ``outbox`` or the ``reclaim``er),
        at once or, built ahead, at ``deadline`` (``clock()``)."""
        if not runs:
            return
        if deadline is None:
            # Confirmed first, as for armed runs: a leader paused since its claim or its
            # outbox read, past its lease, sends nothing (the next leader does).
            self.leadership.confirm_for_send()
            result = self.publisher.publish(runs, database=self.database)
        else:
            started = self.clock()
            result = self.publisher.publish_at(
                runs,
                deadline,
                database=self.database,
                before_send=self.leadership.confirm_for_send,
                while_waiting=while_waiting or self._waiting_only,
            )
            self.build_pace.observe(len(runs), result.built_in)
            margin = deadline - started - result.built_in
            self.report.built_ahead(len(runs), result.built_in, margin)
        self.store.mark_published(result.published)
        self.report.published(runs, result.published, source, self._database_now())
        if result.rejected:
            self._reject(result.rejected)
        if result.error is not None:
            self.report.publish_failed()
            raise result.error

    def _database_now(self) -> datetime | None:
        """The database's time now, by the last reading of it; None without one."""
        return None if self.database is None else self.database.now_at(self.clock())

    def _reject(self, rejected: list[UnpublishableRun]) -> None:
        """Fail the runs whose message cannot be built and quarantine their schedules,
        so that one bad schedule does not stop the others."""
        self.report.rejected(rejected)
        self.report.quarantined(self.store.fail_unpublishable(rejected))

    def _revoke(self, run_ids: list[uuid.UUID]) -> None:
        """Tell workers to drop cancelled runs still in the queue (best effort: the run
        table already refuses them, and a running one loses its lease)."""
        if not run_ids:
            return
        try:
            self.publisher.revoke(run_ids)
        except Exception as exc:  # the broadcast is an optimisation only
            self.report.revoke_failed(len(run_ids), exc)
