"""Celery's prefork pool forks a child from the worker's main process while that
process's own threads work: the heartbeat keeps the process's beacon every second,
holding the registry's lock. A plain lock held at the fork stays held for ever in
the child: its first run asked for its beacon and waited for ever, holding its
run's message (CI: ``test_attempts_exhausted_end_lost_and_nothing_loops`` stuck for
90 s). Every registry lock a child takes is free in the child."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from beat.claim import run_ids
from beat.delivery import app_config, database_clock, heartbeat, run_leases
from beat.lease import beacon
from beat.store import runs

REGISTRY_LOCKS = {
    "beacons": (beacon, "_process_lock"),
    "worker heartbeats": (heartbeat, "_leases_lock"),
    "run leases": (run_leases, "_leases_lock"),
    "run stores": (runs, "_stores_lock"),
    "worker clocks": (database_clock, "_clocks_lock"),
    "delivery configs": (app_config, "_lock"),
    "run IDs": (run_ids._IDS, "_lock"),
}


def held_by_a_thread(lock: Any) -> threading.Event:
    """Hold ``lock`` in another thread until the returned event is set."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            done.wait(10)

    threading.Thread(target=hold, daemon=True).start()
    assert taken.wait(5)
    return done


@pytest.mark.parametrize("registry", sorted(REGISTRY_LOCKS))
def test_a_lock_another_thread_holds_at_a_fork_is_free_in_the_child(registry: str) -> None:
    module, name = REGISTRY_LOCKS[registry]
    done = held_by_a_thread(getattr(module, name))
    try:
        pid = os.fork()
        if pid == 0:  # the child: exit at once, whatever happens
            acquired = getattr(module, name).acquire(timeout=2)
            os._exit(0 if acquired else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        done.set()
    assert os.waitstatus_to_exitcode(status) == 0, f"the {registry} lock stayed held in the child"
