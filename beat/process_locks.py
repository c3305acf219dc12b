"""Locks of a process's registries that a forked child finds free.

Celery's prefork pool forks its children from the worker's main process while that
process's own threads work (the heartbeat keeps the process's beacon every second).
A lock one of them holds at the fork stays held for ever in the child, whose only
thread is the one that forked: the child's first run, asking the registry for its
beacon, its store or its leases, would wait for ever while the main process renews
the lease of its message. A ``ForkSafeLock`` is a new, free lock in every child.

For module-level registries only: each lock stays registered for the process's life.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType


class ForkSafeLock:
    """A ``threading.Lock`` that a forked child gets free (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._free_in_child)

    def _free_in_child(self) -> None:
        # What the parent's registry holds stays (keyed by the parent's pid, so unused
        # here): closing it would close the parent's connections under it.
        self._lock = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._lock.release()
