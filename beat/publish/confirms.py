"""Publisher confirms: on RabbitMQ, beat has the broker confirm each of its publishes."""

from __future__ import annotations

from typing import Any

#: Broker URL schemes of AMQP (RabbitMQ), where a publish is confirmed by default.
AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp"})


def confirm_publishes(app: Any) -> bool:
    """On RabbitMQ, have the broker confirm each publish of this process (py-amqp's
    ``confirm_publish``), unless the app's ``broker_transport_options`` say otherwise:
    a message the broker refuses (a queue at its length limit with ``reject-publish``,
    a full disk) is then an error, and its run stays in the outbox to be sent again,
    rather than one the broker dropped while the run counts as sent. True if set."""
    scheme = str(app.conf.broker_url or "").split("://", 1)[0].lower()
    options = dict(app.conf.broker_transport_options or {})
    if scheme not in AMQP_SCHEMES or "confirm_publish" in options:
        return False
    app.conf.broker_transport_options = {**options, "confirm_publish": True}
    return True
