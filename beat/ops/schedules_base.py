"""What the parts of :class:`beat.ops.schedules.Schedules` share: the store, the app,
the settings and the run history, declared once for the parts to read."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from beat.config import BeatConfig
from beat.models import Schedule
from beat.store.all_roles import Store
from beat.store.runs import RunStore
from beat.store.stats import RunStatsStore


class SchedulesBase:
    """The state of a :class:`~beat.ops.schedules.Schedules`, set (and told) by its
    constructor, and the one read every part makes: a schedule by name."""

    store: Store
    app: Any | None
    default_tz: str
    defaults: dict[str, Any]
    history_retention: timedelta | None
    config: BeatConfig | None
    _run_store: RunStore
    _run_stats: RunStatsStore

    def get(self, name: str) -> Schedule:
        return self.store.get_schedule(name)
