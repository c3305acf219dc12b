"""Unroutable messages on RabbitMQ. A message whose exchange routes it to no queue (no
queue bound with its routing key) is dropped by RabbitMQ, and with publisher confirms
it is even confirmed: its run would count as sent while no worker can ever get it.

So where beat has the broker confirm its publishes (``beat.publish.confirms``), it
publishes with ``mandatory``: RabbitMQ returns such a message (``basic.return``,
NO_ROUTE) before it confirms it, and the channel's handler here notes it by its task ID.
The publish then reports the run as one that cannot be published (its schedule is
quarantined, with the exchange, the routing key and what to do), instead of as sent."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from beat.publish.confirms import AMQP_SCHEMES


class Returns:
    """The messages the broker returned during one publish, by task ID."""

    def __init__(self) -> None:
        self._returned: dict[str, str] = {}

    def on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        """py-amqp's ``basic_return`` handler: called while the publish waits for its
        confirm, before it returns."""
        properties = getattr(message, "properties", None) or {}
        headers = properties.get("application_headers") or {}
        task_id = properties.get("correlation_id") or headers.get("id")
        if task_id is None:
            return
        where = f"exchange {exchange or '(the default)'!r:.200}, routing key {routing_key!r:.200}"
        self._returned[str(task_id)] = (
            f"the broker routed its message to no queue and returned it ({exc}; {where}):"
            " declare the queue and bind it to that exchange with that routing key (or fix"
            " the schedule's options), then resume the schedule"
        )

    def returned(self, task_id: str) -> str | None:
        """Why the message of ``task_id`` came back, if it did."""
        return self._returned.pop(task_id, None)


def confirmed(app: Any) -> bool:
    """Whether this app's publishes go to RabbitMQ with confirms (``confirm_publishes``)."""
    scheme = str(app.conf.broker_url or "").split("://", 1)[0].lower()
    options = dict(app.conf.broker_transport_options or {})
    return scheme in AMQP_SCHEMES and bool(options.get("confirm_publish"))


@contextlib.contextmanager
def watched(app: Any, producer: Any) -> Iterator[Returns | None]:
    """The returns of ``producer``'s channel while the block publishes, where the broker
    confirms (a return comes before its confirm, so it is known when a publish returns);
    None elsewhere (Redis has no routing to fail, and returns nothing)."""
    channel = getattr(producer, "channel", None)
    events = getattr(channel, "events", None)
    if not confirmed(app) or events is None:
        yield None
        return
    returns = Returns()
    events["basic_return"].add(returns.on_return)
    try:
        yield returns
    finally:
        events["basic_return"].discard(returns.on_return)
