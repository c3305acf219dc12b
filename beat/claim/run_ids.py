"""Random run IDs (UUID version 4), drawn from the operating system a batch at a time.

``uuid.uuid4()`` reads 16 bytes with ``os.urandom``, which lets go of the GIL for
each read. While a burst is claimed, the send thread (``beat.leader.overlapped_send``) runs
Python, and each let-go can leave the claim waiting for the GIL: one read per batch
of IDs instead of one per run. The IDs are made exactly as ``uuid4`` makes them.

A process that forks (a Celery prefork worker, say) draws afresh in the child: the
bytes left over in the parent are never used by both.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

from beat.process_locks import ForkSafeLock

#: IDs drawn per read from the operating system.
BATCH = 1024


class _RunIds:
    def __init__(self) -> None:
        self._lock = ForkSafeLock()  # a lock held at a fork stays held in the child
        self._pool: Iterator[uuid.UUID] = iter(())

    def next(self) -> uuid.UUID:
        with self._lock:
            run_id = next(self._pool, None)
            if run_id is None:
                self._pool = _drawn(BATCH)
                run_id = next(self._pool)
            return run_id

    def forget(self) -> None:
        """Drop the IDs drawn but not used (in a forked child: the parent has them too)."""
        self._pool = iter(())


def _drawn(count: int) -> Iterator[uuid.UUID]:
    data = os.urandom(16 * count)
    return (
        uuid.UUID(bytes=data[start : start + 16], version=4) for start in range(0, len(data), 16)
    )


_IDS = _RunIds()
os.register_at_fork(after_in_child=_IDS.forget)


def new_run_id() -> uuid.UUID:
    """A new random run ID, as ``uuid.uuid4()`` makes one."""
    return _IDS.next()
