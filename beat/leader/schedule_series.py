"""Each schedule's series for Prometheus, served by the leader: its failures in a row
and the fire time of its last success (``beat.store.schedule_series``), one label value
per schedule while the cluster holds at most ``habeat_metrics_schedule_limit`` of them.

Past the limit no schedule is served (a time series per schedule would cost Prometheus
more than the alerts are worth) and ``habeat_schedule_series_capped`` is 1. A schedule
removed since the last read loses its series; a process that stops leading drops them
all (``forget``), so only the leader ever serves them.

The read runs on a thread of its own: the leader's loop starts it and goes on (its
claims and armed runs never wait for a statement over a thousand schedules' history).
A read that ends after the process stopped leading serves nothing: ``forget`` moves
the term on, and only a read of the current term is served."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence

from beat import metrics
from beat.errors import error_text
from beat.store.schedule_series import ScheduleSeries

logger = logging.getLogger(__name__)

#: Reads the series: None when there are more schedules than the limit.
Read = Callable[[], Sequence[ScheduleSeries] | None]


def _start_thread(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="habeat-schedule-series", daemon=True).start()


class ScheduleSeriesGauges:
    """The per-schedule gauges of this process, and the schedules they name."""

    def __init__(self, start: Callable[[Callable[[], None]], None] = _start_thread) -> None:
        #: Runs a read (on a thread of its own, by default).
        self._start = start
        self._lock = threading.Lock()
        self._names: set[str] = set()
        self._said_capped = False
        self._reading = False
        #: Moved on by ``forget``: a read started before it serves nothing.
        self._term = 0

    def read(self, read: Read, limit: int) -> None:
        """Start a read unless one is running; serve what it finds when it ends."""
        with self._lock:
            if self._reading:
                return
            self._reading, term = True, self._term

        def work() -> None:
            try:
                series = read()
            except Exception as exc:
                # Numbers for dashboards: they keep their last values until the next read.
                logger.warning(
                    "could not read the schedules' series for Prometheus: %s; trying again later",
                    error_text(exc),
                )
                with self._lock:
                    self._reading = False
                return
            with self._lock:
                if term == self._term:
                    self._serve(series, limit)
                self._reading = False

        self._start(work)

    def forget(self) -> None:
        """This process no longer leads: it serves no schedule's series."""
        with self._lock:
            self._term += 1
            metrics.forget_schedule_series()
            self._names = set()
            self._said_capped = False

    def _serve(self, series: Sequence[ScheduleSeries] | None, limit: int) -> None:
        capped = series is None and limit > 0
        metrics.SCHEDULE_SERIES_CAPPED.set(1 if capped else 0)
        if capped and not self._said_capped:
            logger.warning(
                "more than %d schedules: no per-schedule series is served (raise"
                " habeat_metrics_schedule_limit to have them, a label value each)",
                limit,
            )
        self._said_capped = capped
        names = {one.name for one in series or ()}
        for gone in self._names - names:
            _drop(gone)
        for one in series or ():
            metrics.SCHEDULE_CONSECUTIVE_FAILURES.labels(schedule=one.name).set(
                one.consecutive_failures
            )
            if one.last_success is None:
                with contextlib.suppress(KeyError):
                    metrics.SCHEDULE_LAST_SUCCESS.remove(one.name)
            else:
                metrics.SCHEDULE_LAST_SUCCESS.labels(schedule=one.name).set(
                    one.last_success.timestamp()
                )
        self._names = names


def _drop(name: str) -> None:
    for gauge in (metrics.SCHEDULE_CONSECUTIVE_FAILURES, metrics.SCHEDULE_LAST_SUCCESS):
        with contextlib.suppress(KeyError):
            gauge.remove(name)
