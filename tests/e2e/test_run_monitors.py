"""The overran monitor with real `celery beat` and `celery worker` processes: a job
running past its ``max_runtime`` opens an overran incident, told to a real local
webhook, resolved when the job ends; with ``revoke_after_max_runtime`` the run ends
``failed`` and its prefork pool process is terminated: its effect never happens, and
nothing runs it again."""

from __future__ import annotations

import time

import pytest

from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.test_incidents import FAST, incidents
from tests.integration.helpers import run_rows
from tests.receivers import http_receiver

pytestmark = pytest.mark.e2e


def test_a_job_running_past_its_max_runtime_opens_an_overran_incident_resolved_when_it_ends(
    cluster: Cluster, store: Store
) -> None:
    cluster.settings = FAST
    with http_receiver() as http:
        schedules = Schedules(store)
        schedules.add_webhook("hook", http.url("/habeat"))
        cluster.beat("beat0")
        cluster.worker("worker0", concurrency=2, pool="prefork")
        schedules.create(
            "long-etl",
            "e2e.plain_slow",
            in_seconds=1,
            args=["etl", 14],
            max_runtime=3,
            allow_unregistered=True,
        )

        wait_until(lambda: [i["kind"] for i in incidents(cluster)] == ["overran"], timeout=45)
        [run] = run_rows(store, schedule_name="long-etl")
        [incident] = incidents(cluster)
        assert incident["schedule"] == "long-etl"
        assert incident["last_error"].startswith(f"run {run.id} has been running for")
        assert "past its max_runtime of 3s" in incident["last_error"]

        wait_until(lambda: incidents(cluster) == [], timeout=45)
        [done] = run_rows(store, schedule_name="long-etl")
        assert done.state == "succeeded"  # told, not touched
        wait_until(lambda: len(http.received("/habeat")) >= 2, timeout=30)
        texts = [post.body["text"] for post in http.received("/habeat")]
        assert texts[0].startswith(f"Schedule long-etl overran: run {run.id}")
        assert texts[1].startswith("Schedule long-etl no longer overruns")
        assert cluster.effects() == {str(run.id): 1}


#: A job of the idempotent base, and a plain task (tracked by Celery's signals).
HUNG = {"hung-guarded": "e2e.slow", "hung-plain": "e2e.plain_slow"}


def test_a_run_revoked_past_its_max_runtime_ends_failed_its_body_is_terminated_and_never_run_again(
    cluster: Cluster, store: Store
) -> None:
    cluster.settings = {**FAST, "HABEAT_LEASE_TIMEOUT": "4"}
    cluster.beat("beat0")
    cluster.worker("worker0", concurrency=2, pool="prefork")
    schedules = Schedules(store)
    for name, task in HUNG.items():
        schedules.create(
            name,
            task,
            in_seconds=1,
            args=[name, 12],
            max_runtime=3,
            revoke_after_max_runtime=True,
            allow_unregistered=True,
        )

    def states() -> list[str]:
        return [run.state for name in HUNG for run in run_rows(store, schedule_name=name)]

    wait_until(lambda: states() == ["failed", "failed"], timeout=45)
    ended = [run for name in HUNG for run in run_rows(store, schedule_name=name)]
    assert {run.error for run in ended} == {"revoked: it ran past its max_runtime of 3s"}
    assert [run.attempt for run in ended] == [1, 1]
    # Past the run lease three times over, and past the jobs' own 12 s had they gone
    # on: no reaper, no redelivery ran them again, and the terminated bodies left no
    # effect.
    time.sleep(12)
    after = [run for name in HUNG for run in run_rows(store, schedule_name=name)]
    assert [(run.state, run.attempt, run.error) for run in after] == [
        (run.state, run.attempt, run.error) for run in ended
    ]
    assert cluster.effects() == {}
    found = incidents(cluster, "--all")
    assert sorted((incident["schedule"], incident["kind"]) for incident in found) == [
        ("hung-guarded", "overran"),
        ("hung-plain", "overran"),
    ]
    assert all("revoked" in incident["last_error"] for incident in found)
