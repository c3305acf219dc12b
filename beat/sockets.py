"""What a connection's socket shows at once, without a round trip to its server."""

from __future__ import annotations

import select


def readable(fileno: int) -> bool:
    """Whether a socket has something to read (data, or its peer's close), at once; by
    ``poll``, which takes any descriptor (``select`` refuses those above 1,023)."""
    poller = select.poll()
    poller.register(fileno, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))
