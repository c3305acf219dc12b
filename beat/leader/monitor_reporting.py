"""What the leader tells people and Prometheus of its monitors (``beat.monitors``):
incidents opened and resolved, schedules paused, runs revoked, a stall of the cluster."""

from __future__ import annotations

import logging

from beat import metrics
from beat.errors import error_text
from beat.models import IncidentKind
from beat.store.leader import MonitorReport
from beat.store.leader.run_monitors import RunMonitorReport
from beat.store.leader.stall import StallReport

logger = logging.getLogger("beat.scheduler")


class MonitorReporting:
    """The monitors' events: one method each (``beat.leader.reporting.Reporter``)."""

    def watched(self, report: MonitorReport) -> None:
        """The failing monitor's pass: each incident opened or resolved and each
        schedule paused said once (the incident's ID is in ``schedules incidents``)."""
        for name, failures in report.opened:
            metrics.INCIDENTS_OPENED.labels(kind=IncidentKind.FAILING.value).inc()
            logger.warning(
                "schedule %s failed %d times in a row: incident opened",
                name,
                failures,
                extra={"schedule": name, "failures": failures},
            )
        for name, failures in report.paused:
            metrics.SCHEDULES_AUTO_PAUSED.inc()
            logger.warning(
                "schedule %s paused after %d failures in a row; resume it once fixed"
                " (celery -A app schedules resume %s)",
                name,
                failures,
                name,
                extra={"schedule": name, "failures": failures},
            )
        for name, resolution in report.resolved:
            logger.info(
                "schedule %s: incident resolved (%s)",
                name,
                resolution,
                extra={"schedule": name},
            )
        for kind, count in report.open.items():
            metrics.INCIDENTS_OPEN.labels(kind=kind.value).set(count)

    def runs_watched(self, report: RunMonitorReport) -> None:
        """The run monitors' pass: each incident opened or resolved said once."""
        for name, kind in report.opened:
            metrics.INCIDENTS_OPENED.labels(kind=kind.value).inc()
            logger.warning(
                "schedule %s: %s incident opened", name, kind.value, extra={"schedule": name}
            )
        for name, kind in report.resolved:
            logger.info(
                "schedule %s: %s incident resolved", name, kind.value, extra={"schedule": name}
            )
        if report.revoke:
            logger.warning(
                "revoking %d runs past their max_runtime (ended failed): %s",
                len(report.revoke),
                ", ".join(report.revoke[:10]),
            )

    def stall_watched(self, report: StallReport) -> None:
        if report.opened:
            logger.error(
                "no fire time is being claimed: %s (stall incident opened)",
                report.detail,
                extra={"overdue": report.overdue},
            )
        elif report.resolved:
            logger.warning("fire times are claimed again: stall incident resolved")

    def stall_check_failed(self, exc: BaseException) -> None:
        logger.warning(
            "could not look for a stall of the cluster: %s; trying again in 15 s",
            error_text(exc),
        )

    def monitor_failed(self, exc: BaseException) -> None:
        logger.warning(
            "could not look for schedules failing in a row, overrunning, late or missed: %s;"
            " trying again in 30 s",
            error_text(exc),
        )
