"""The channels incidents are notified to, the channels part of
:class:`beat.ops.schedules.Schedules`: add one (its target checked before it is
written), list them, remove one."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from urllib.parse import urlencode

from beat.errors import InvalidChannel
from beat.models import Channel, ChannelKind
from beat.ops.schedules_base import SchedulesBase


class ChannelCommands(SchedulesBase):
    """Where the leader sends what happens to incidents."""

    def add_webhook(self, name: str, url: str) -> Channel:
        """A channel that POSTs each notification's JSON document to ``url``."""
        return self.store.add_channel(name, ChannelKind.WEBHOOK, url)

    def add_slack(self, name: str, url: str) -> Channel:
        """A channel that posts each notification to a Slack incoming webhook."""
        return self.store.add_channel(name, ChannelKind.SLACK, url)

    def add_email(self, name: str, smtp_url: str, *, sender: str, to: Sequence[str]) -> Channel:
        """A channel that mails each notification through the SMTP server at
        ``smtp_url`` (``smtp://host:587``, ``smtps://user:password@host``;
        ``?starttls=true`` to upgrade a plain connection)."""
        if "?" in smtp_url and ("from=" in smtp_url or "to=" in smtp_url):
            raise InvalidChannel(
                "give the sender and recipients as --from and --to, not in the URL"
            )
        separator = "&" if "?" in smtp_url else "?"
        query = urlencode([("from", sender), *(("to", address) for address in to)])
        return self.store.add_channel(name, ChannelKind.EMAIL, f"{smtp_url}{separator}{query}")

    def channels(self) -> builtins.list[Channel]:
        return self.store.list_channels()

    def remove_channel(self, name: str) -> None:
        """Remove a channel, and its notifications not sent yet."""
        self.store.remove_channel(name)
