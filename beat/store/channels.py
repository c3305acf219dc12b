"""The channels incidents are notified to (``beat_channels``), as operators set them;
a channel's target is checked (``beat.notify.targets``) before it is written."""

from __future__ import annotations

from sqlalchemy import delete, text
from sqlalchemy.dialects.postgresql import insert

from beat.errors import ChannelNotFound, InvalidChannel
from beat.models import Channel, ChannelKind
from beat.notify.targets import check_channel
from beat.store.db import StoreConnection
from beat.store.tables import channels


class ChannelStatements(StoreConnection):
    """Add, list and remove channels."""

    def add_channel(self, name: str, kind: ChannelKind, target: str) -> Channel:
        """A new channel; InvalidChannel if it cannot be used or the name is taken."""
        check_channel(name, kind, target)
        with self._transaction() as conn:
            added = conn.execute(
                insert(channels)
                .values(name=name, kind=kind.value, target=target)
                .on_conflict_do_nothing(index_elements=["name"])
                .returning(channels.c.name)
            ).scalar_one_or_none()
        if added is None:
            raise InvalidChannel(
                f"a channel named {name} exists already: remove it first, or pick another name"
            )
        return Channel(name=name, kind=kind, target=target)

    def list_channels(self) -> list[Channel]:
        """The channels by name, each with how its sends go (one aggregate over the
        outbox, which retention keeps to the history's days)."""
        with self._transaction() as conn:
            rows = conn.execute(text(_CHANNELS_SQL)).all()
        return [
            Channel(
                name=row.name,
                kind=ChannelKind(row.kind),
                target=row.target,
                pending=row.pending,
                failing=row.failing,
                given_up=row.given_up,
                last_error=row.last_error,
                last_sent_at=row.last_sent_at,
            )
            for row in rows
        ]

    def remove_channel(self, name: str) -> None:
        """Remove a channel, and its notifications not sent yet."""
        with self._transaction() as conn:
            removed = conn.execute(
                delete(channels).where(channels.c.name == name).returning(channels.c.name)
            ).scalar_one_or_none()
        if removed is None:
            raise ChannelNotFound(
                f"no channel named {name!r:.120}: `celery -A app schedules channels list`"
                " shows them"
            )


_CHANNELS_SQL = """
SELECT c.name, c.kind, c.target,
       count(*) FILTER (WHERE n.id IS NOT NULL AND n.sent_at IS NULL AND n.given_up_at IS NULL)
           AS pending,
       count(*) FILTER (WHERE n.sent_at IS NULL AND n.given_up_at IS NULL AND n.attempts > 0
                        AND n.last_error IS NOT NULL) AS failing,
       count(*) FILTER (WHERE n.given_up_at IS NOT NULL) AS given_up,
       (array_agg(n.last_error ORDER BY n.next_attempt_at DESC)
            FILTER (WHERE n.sent_at IS NULL AND n.given_up_at IS NULL
                    AND n.last_error IS NOT NULL))[1] AS last_error,
       max(n.sent_at) AS last_sent_at
FROM beat_channels AS c
LEFT JOIN beat_notifications AS n ON n.channel = c.name
GROUP BY c.name, c.kind, c.target
ORDER BY c.name
"""
