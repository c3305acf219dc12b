"""Run IDs drawn a batch at a time (``beat.claim.run_ids``): what ``uuid4`` gives, never
the same twice, across batches, threads and forks."""

from __future__ import annotations

import os
import threading
import uuid

from beat.claim import run_ids
from beat.claim.run_ids import new_run_id


def test_each_id_is_a_random_uuid_as_uuid4_makes_it() -> None:
    drawn = [new_run_id() for _ in range(3 * run_ids.BATCH + 7)]  # across batches
    assert len(set(drawn)) == len(drawn)
    assert {(run_id.version, run_id.variant) for run_id in drawn} == {(4, uuid.RFC_4122)}
    reference = uuid.uuid4()
    assert (reference.version, reference.variant) == (4, uuid.RFC_4122)


def test_threads_drawing_at_once_never_get_the_same_id() -> None:
    drawn: list[list[uuid.UUID]] = [[] for _ in range(4)]

    def draw(into: list[uuid.UUID]) -> None:
        into.extend(new_run_id() for _ in range(3000))

    threads = [threading.Thread(target=draw, args=(into,)) for into in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [run_id for ids in drawn for run_id in ids]
    assert len(set(every)) == len(every) == 12000


def test_a_forked_child_does_not_reuse_the_ids_its_parent_drew() -> None:
    new_run_id()  # the parent holds a batch drawn, mostly unused
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next IDs, to the parent
        try:
            os.write(write_end, b"".join(new_run_id().bytes for _ in range(10)))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    child = {uuid.UUID(bytes=data[start : start + 16]) for start in range(0, len(data), 16)}
    parent = {new_run_id() for _ in range(10)}
    assert len(child) == 10
    assert child.isdisjoint(parent)
