"""What the parts of :class:`beat.ops.schedules.Schedules` share: the store, the app,
the settings and the run history, declared once for the parts to read."""

from __future__ import annotations

import copy
import getpass
import socket
from datetime import timedelta
from typing import Any, Self

from beat.config import BeatConfig
from beat.models import ChangeEntry, Schedule
from beat.records import ChangeContext
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
    #: Who makes the changes, as the audit log records them (``acting_as``).
    change: ChangeContext

    def get(self, name: str) -> Schedule:
        return self.store.get_schedule(name)

    def acting_as(
        self,
        entry: ChangeEntry,
        *,
        actor: str | None = None,
        address: str | None = None,
    ) -> Self:
        """These schedules, changed from ``entry`` by ``actor`` (by default the user
        this process runs as), from ``address`` over HTTP: on the same connections."""
        acting = copy.copy(self)
        acting.change = this_machine(entry, actor=actor, address=address)
        return acting


def this_machine(
    entry: ChangeEntry, *, actor: str | None = None, address: str | None = None
) -> ChangeContext:
    """A change made on this machine, by ``actor`` or the user this process runs as."""
    return ChangeContext(
        actor=actor or _user(), entry=entry, host=socket.gethostname(), address=address
    )


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this process's user (a bare container)
        return "unknown"
