"""The failing monitor with real `celery beat` and `celery worker` processes: a schedule
whose task fails every time opens one incident after its alert threshold and pauses
itself after its pause threshold, with the reason as its pause note; fixed and resumed,
its first success resolves the incident. Read with the real ``schedules`` command; the
notifications received by real local HTTP and SMTP servers."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import insert, select

from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.tables import notifications
from tests.e2e.cluster import Cluster, wait_until
from tests.integration.helpers import run_rows
from tests.receivers import Post, http_receiver, smtp_receiver

pytestmark = pytest.mark.e2e

FAST = {"HABEAT_LOCK_TTL": "3", "HABEAT_MAX_WAIT": "1", "HABEAT_STANDBY_POLL": "0.5"}


def incidents(cluster: Cluster, *flags: str) -> list[dict[str, Any]]:
    listed = cluster.command("schedules", "incidents", "--json", *flags)
    assert listed.returncode == 0, listed.stderr
    found: list[dict[str, Any]] = json.loads(listed.stdout)
    return found


def test_a_schedule_failing_every_time_opens_an_incident_pauses_itself_and_recovers(
    cluster: Cluster, store: Store
) -> None:
    cluster.settings = FAST
    cluster.beat("beat0")
    cluster.worker("worker0", concurrency=2)
    schedules = Schedules(store)
    schedules.create(
        "always-fails",
        "e2e.plain_fail",
        every=2,
        args=["nightly"],
        alert_after_failures=2,
        pause_after_failures=4,
        allow_unregistered=True,
    )

    wait_until(lambda: not schedules.get("always-fails").definition.enabled, timeout=90)

    paused = schedules.get("always-fails")
    [incident] = incidents(cluster)
    assert incident["schedule"] == "always-fails"
    assert incident["failures"] >= 4
    assert incident["paused_at"] is not None
    assert incident["last_error"] == "RuntimeError: nightly: fails every time"
    assert paused.disabled_reason is not None
    assert paused.disabled_reason.startswith(
        f"paused by the scheduler after {incident['failures']} failures in a row"
        f" (incident {incident['id']})"
    )
    shown = cluster.command("schedules", "show", "always-fails")
    assert "paused: paused by the scheduler after" in shown.stdout

    # Paused: no more fire times are claimed (a run claimed before the pause may end).
    claimed = len(run_rows(store, schedule_name="always-fails"))
    time.sleep(6)
    assert len(run_rows(store, schedule_name="always-fails")) <= claimed + 1

    schedules.update(
        "always-fails", task="e2e.plain_record", args=["fixed"], allow_unregistered=True
    )
    schedules.resume("always-fails")

    wait_until(lambda: incidents(cluster) == [], timeout=60)
    [resolved] = incidents(cluster, "--all")
    assert resolved["id"] == incident["id"]
    assert resolved["resolution"].endswith("succeeded")
    assert schedules.get("always-fails").definition.enabled


def events(posts: list[Post]) -> list[str]:
    return [post.body["event"] for post in posts]


def test_each_channel_is_told_once_of_the_incident_the_pause_and_the_recovery(
    cluster: Cluster, store: Store
) -> None:
    """A webhook, a Slack incoming webhook and an email channel, on real local receivers
    (an HTTP server, an SMTP server): each gets one notification per event, with its ID."""
    cluster.settings = FAST
    with http_receiver() as http, smtp_receiver() as smtp:
        schedules = Schedules(store)
        schedules.add_webhook("hook", http.url("/habeat"))
        schedules.add_slack("chat", http.url("/slack"))
        schedules.add_email("mail", smtp.url(), sender="beat@example.com", to=["ops@example.com"])
        cluster.beat("beat0")
        cluster.worker("worker0", concurrency=2)
        schedules.create(
            "always-fails", "e2e.plain_fail", every=2, args=["nightly"],
            alert_after_failures=2, pause_after_failures=3, allow_unregistered=True,
        )  # fmt: skip

        wait_until(lambda: len(http.received("/habeat")) >= 2, timeout=90)
        wait_until(lambda: len(smtp.mails) >= 2, timeout=30)
        schedules.update(
            "always-fails", task="e2e.plain_record", args=["fixed"], allow_unregistered=True
        )
        schedules.resume("always-fails")
        wait_until(lambda: len(http.received("/habeat")) >= 3, timeout=60)
        wait_until(lambda: len(http.received("/slack")) >= 3 and len(smtp.mails) >= 3, timeout=30)
        time.sleep(3)  # nothing more comes
        hooks, slacks, mails = http.received("/habeat"), http.received("/slack"), list(smtp.mails)

    assert events(hooks) == ["opened", "paused", "resolved"]
    [incident] = incidents(cluster, "--all")
    assert {post.body["incident"]["id"] for post in hooks} == {incident["id"]}
    ids = [int(post.headers["Idempotency-Key"]) for post in [*hooks, *slacks]]
    ids += [int(mail["X-Habeat-Notification"]) for mail in mails]
    assert len(ids) == len(set(ids)) == 9, "one notification per event and channel, each once"
    assert [post.body["text"].split(" (incident")[0] for post in slacks] == [
        post.body["text"] for post in hooks
    ]
    subjects = [" ".join(str(mail["Subject"]).split()) for mail in mails]  # unfolded
    assert subjects == [f"[habeat] {post.body['text']}" for post in hooks]


#: Leaders SIGKILLed while notifications are being sent (HABEAT_NOTIFY_KILLS to run more).
KILLS = int(os.environ.get("HABEAT_NOTIFY_KILLS", "3"))


def delivered(posts: list[Post]) -> set[int]:
    return {int(post.headers["Idempotency-Key"]) for post in posts}


def queue_notifications(store: Store, channels: list[str], count: int) -> list[int]:
    """``count`` notifications per channel in the outbox, as the monitor writes them."""
    payload = {
        "version": 1, "cluster": "e2e", "event": "opened", "at": "2026-12-06T00:00:00+00:00",
        "incident": {"id": 0, "kind": "failing", "schedule": "s", "failures": 3,
                     "last_error": None, "resolution": None},
        "text": "Schedule s failed 3 times in a row",
    }  # fmt: skip
    with store.engine.begin() as conn:
        rows = conn.execute(
            insert(notifications).returning(notifications.c.id),
            [
                {"channel": channel, "event": "opened", "payload": payload}
                for _ in range(count)
                for channel in channels
            ],
        )
        return [row.id for row in rows]


def test_notifications_pending_when_leaders_are_killed_are_each_delivered_at_most_twice(
    cluster: Cluster, store: Store
) -> None:
    """Leaders SIGKILLed one after another while they send (each send takes the receiver
    0.3 s): every notification reaches its receiver, none is lost, none arrives more than
    twice (a leader killed between a send and its record leaves it to be sent again)."""
    cluster.settings = FAST
    with http_receiver() as http:
        http.delay = 0.3
        schedules = Schedules(store)
        names = ["hook-a", "hook-b"]
        for name in names:
            schedules.add_webhook(name, http.url(f"/{name}"))
        ids = queue_notifications(store, names, 10 * (KILLS + 1))
        beats = [cluster.beat(f"beat{index}") for index in range(2)]
        for kill in range(KILLS):
            sends = 8 * (kill + 1)  # a few batches into this leader's term
            wait_until(lambda: len(http.received()) >= sends, timeout=120)  # noqa: B023
            leader = cluster.leading_process()
            assert leader is not None
            leader.signal(signal.SIGKILL)
            beats.append(cluster.beat(f"beat{len(beats)}"))
        wait_until(
            lambda: len({int(p.headers["Idempotency-Key"]) for p in http.received()}) >= len(ids),
            timeout=180,
        )
        received = Counter(int(post.headers["Idempotency-Key"]) for post in http.received())

    assert set(received) == set(ids), "each delivered, none lost"
    repeats = {notification: count for notification, count in received.items() if count > 1}
    print(f"{KILLS} leaders killed: {len(ids)} notifications, {len(repeats)} sent twice")
    assert max(received.values()) <= 2, repeats
    with store.engine.connect() as conn:
        unsent = conn.execute(
            select(notifications.c.id).where(notifications.c.sent_at.is_(None))
        ).all()
    assert unsent == [], "every send recorded"


def test_every_beat_stopped_past_the_stall_threshold_is_told_by_the_first_one_back(
    cluster: Cluster, store: Store
) -> None:
    """Every beat stopped for longer than six lease TTLs (18 s here): the first process
    started again opens the cluster's stall incident before it claims (its channel is
    told), and once its claims catch up, resolves it."""
    cluster.settings = FAST
    with http_receiver() as http:
        schedules = Schedules(store)
        schedules.add_webhook("hook", http.url("/habeat"))
        schedules.create("often", "e2e.plain_record", every=2, args=["x"], allow_unregistered=True)
        first = cluster.beat("beat0")
        wait_until(lambda: cluster.leading_process() is not None, timeout=30)
        first.signal(signal.SIGTERM)
        first.popen.wait(timeout=30)
        time.sleep(22)  # every fire time since waits unclaimed

        cluster.beat("beat1")
        wait_until(lambda: len(http.received("/habeat")) >= 2, timeout=60)
        posts = http.received("/habeat")

    assert events(posts) == ["opened", "resolved"]
    opened = posts[0].body
    assert opened["incident"]["kind"] == "stall"
    # The demo's code schedules wait too, one or both past the threshold as their phase
    # falls: the count is 1 or more.
    assert re.match(
        r"No fire time is being claimed: (1 schedule waits|\d+ schedules wait) unclaimed,"
        r" the oldest due \d+m\d\ds ago$",
        opened["text"],
    ), opened["text"]
    [stall] = incidents(cluster, "--all")
    assert (stall["kind"], stall["open"]) == ("stall", False)
