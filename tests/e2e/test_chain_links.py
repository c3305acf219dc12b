"""A chain's next link is sent even when the link before it completed and its worker
could not send it: the process died between the completion and the send, or the
broker refused the send. The completion is recorded before Celery sends the next
link, so a second delivery of the link before finds it succeeded and is skipped; it
must still send what the first delivery did not."""

from __future__ import annotations

import pytest
from celery import chain

from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.jobs import DIE_AT_DISPATCH, FAIL_AT_DISPATCH

pytestmark = pytest.mark.e2e

#: A short lease: a second delivery sends the links of a run whose completion is older.
SETTINGS = {"HABEAT_LEASE_TIMEOUT": "4", "HABEAT_MAX_WAIT": "1"}


@pytest.mark.parametrize(
    ("how", "pool", "next_task"),
    [
        (DIE_AT_DISPATCH, "prefork", "e2e.record"),
        (DIE_AT_DISPATCH, "prefork", "e2e.plain_record"),
        (FAIL_AT_DISPATCH, "threads", "e2e.record"),
    ],
    ids=["killed-idempotent-next", "killed-plain-next", "refused-send"],
)
def test_a_chains_next_link_is_sent_once_when_its_first_send_never_happened(
    cluster: Cluster, how: str, pool: str, next_task: str
) -> None:
    cluster.settings = SETTINGS
    cluster.worker("worker1", concurrency=1, pool=pool)
    app = cluster.app()
    last = f"{how}last"
    workflow = chain(
        app.signature("e2e.record", args=["first"], immutable=True),
        app.signature(next_task, args=[last], immutable=True),
        app.signature("e2e.record", args=["after"], immutable=True),
    )
    workflow.apply_async()

    wait_until(lambda: cluster.labels().get("after") == 1, timeout=60, interval=0.2)
    labels = cluster.labels()
    assert labels[f"{last}:dispatch"] == 1, "the first send of the next link was broken"
    assert (labels["first"], labels[last], labels["after"]) == (1, 1, 1)
