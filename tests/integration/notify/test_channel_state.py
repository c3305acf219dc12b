"""How a channel's sends go, as operators read it against real PostgreSQL: `channels
list` (text and JSON) and the UI's incidents page say a channel whose sends fail, with
the newest error, and the last send of one that works; a target's secret stays hidden."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

import pytest
from celery import Celery

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.integration.helpers import finished_runs, invoke
from tests.integration.ui import test_ui_http
from tests.integration.ui.test_ui_http import UI

pytestmark = pytest.mark.integration

app, serve, schedules = test_ui_http.app, test_ui_http.serve, test_ui_http.schedules

LEASE = timedelta(seconds=60)
SECRET_HOOK = "https://hooks.slack.com/services/T000/B000/SECRETSECRET"


def an_incident_told_to_two_channels(store: Store, schedules: Schedules) -> None:
    """Channels ``good`` and ``bad``; one incident opened: one notification each; the
    send to ``good`` went, the one to ``bad`` failed."""
    assert store.take_leadership(1, "leader")
    schedules.add_webhook("good", "https://good.example.com/hook")
    schedules.add_slack("bad", SECRET_HOOK)
    schedules.create("flaky", "ui.job", every=60)
    finished_runs(store, "flaky", [RunState.FAILED] * 3)
    store.watch_failures(1, alert_after=3, pause_after=0, idle_timeout=5)
    for taken in store.take_notifications(1, limit=10, lease=LEASE, idle_timeout=5):
        if taken.channel == "good":
            store.notification_sent(taken.id)
        else:
            store.notification_failed(taken.id, "HTTP 500 from hooks.slack.com", epoch=1)


def test_channels_list_says_which_channel_fails_and_with_what(
    app: Celery, store: Store, schedules: Schedules
) -> None:
    an_incident_told_to_two_channels(store, schedules)

    listed = invoke(app, "channels", "list", "--json")
    text = invoke(app, "channels", "list")

    by_name = {channel["name"]: channel for channel in json.loads(listed.stdout)}
    assert (by_name["bad"]["state"], by_name["bad"]["failing"]) == ("failing", 1)
    assert by_name["bad"]["last_error"] == "HTTP 500 from hooks.slack.com"
    assert (by_name["good"]["state"], by_name["good"]["pending"]) == ("ok", 0)
    assert by_name["good"]["last_sent_at"] is not None
    assert "failing: 1 of 1 to send failed, the last with HTTP 500" in text.stdout
    assert "SECRETSECRET" not in listed.stdout + text.stdout


def test_the_incidents_page_lists_the_channels_and_the_one_that_fails(
    serve: Callable[..., UI], store: Store, schedules: Schedules
) -> None:
    an_incident_told_to_two_channels(store, schedules)

    page = serve().request("/incidents").body

    assert 'data-channel="bad" class="failing"' in page
    assert "failing: 1 of 1 to send failed, the last with HTTP 500 from hooks.slack.com" in page
    assert 'data-channel="good" class=""' in page
    assert "SECRETSECRET" not in page
