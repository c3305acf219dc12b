"""What a source reader returns: a schedule ready to be written here, or a refusal
with its reason; and what every reader is given."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from beat.models import ScheduleDefinition
from beat.store.imports import ImportedRow


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceSchedule(ImportedRow):
    """A schedule of another scheduler, as it will be stored here: its definition and
    history (``next_fire_at`` is what the source would fire next, None if never again),
    where it came from (``source``, ``source_id``) and, for an entry of the app's
    ``beat_schedule``, its ``code_hash`` (so beat's sync of the code keeps it)."""

    #: Its name in the source (the definition's may carry ``--prefix``).
    source_name: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Refusal:
    """A schedule of the source that cannot be carried over with its meaning."""

    source_name: str
    source_id: str
    #: Why, and what to do: one line.
    reason: str


Found = SourceSchedule | Refusal


@dataclass(frozen=True, kw_only=True, slots=True)
class ReadContext:
    """What a reader needs besides its source."""

    #: The Celery app the schedules are for (its zone, its ``beat_schedule``).
    app: Any
    #: The schedule database's now: overdue fire times become due at it.
    now: datetime
    default_tz: str
    #: Fields every new schedule gets unless the source says otherwise (settings).
    defaults: Mapping[str, Any] = field(default_factory=dict)
    #: Put before every imported name (``--prefix``), but those of ``code``.
    prefix: str = ""
    #: The app's ``beat_schedule`` entries (each a definition and its code hash), by
    #: name: a source's row of one of them stays a schedule in code.
    code: Mapping[str, tuple[ScheduleDefinition, str]] = field(default_factory=dict)


class ScheduleSource(Protocol):
    """A scheduler to import from."""

    #: Its name, as recorded in each schedule's ``source``.
    kind: str

    def describe(self) -> str:
        """Where it reads, for people (secrets hidden)."""
        ...

    def read(self, context: ReadContext) -> list[Found]:
        """Every schedule of the source; SourceError when the source cannot be read."""
        ...
