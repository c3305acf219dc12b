"""The UI's audit log over HTTP, in-process against real PostgreSQL and Redis: the
history tab and the JSON API of changes, the restore form's checks (the password, the
token, read-only, a bad version), and the user and address each write is recorded with."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from beat.models import ChangeAction, ChangeEntry
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.integration.helpers import table_rows
from tests.integration.ui import test_ui_http
from tests.integration.ui.test_ui_http import PASSWORD, UI, USER

pytestmark = pytest.mark.integration

#: The UI's fixtures, shared with the tests of its pages.
app, serve, schedules = test_ui_http.app, test_ui_http.serve, test_ui_http.schedules


def test_a_write_through_the_ui_is_recorded_as_its_user_s_from_their_address(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    schedules.create("target", "ui.job", every=60)
    ui = serve(users={USER: PASSWORD})

    assert ui.post_form("/schedules/target/pause", {"note": "  disk full  "}).status == 303

    [paused, _] = schedules.audit("target")
    assert (paused.action, paused.actor, paused.entry, paused.address, paused.note) == (
        ChangeAction.PAUSE,
        USER,
        ChangeEntry.UI,
        "127.0.0.1",
        "disk full",
    )
    assert schedules.get("target").disabled_reason == "disk full"


def test_the_history_tab_and_the_json_api_list_the_changes(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    schedules.create("target", "ui.job", every=60)
    schedules.update("target", every=90)
    ui = serve(users={USER: PASSWORD})

    page = ui.request("/schedules/target/history")
    one = ui.request("/api/schedules/target/changes").json()
    every = ui.request("/api/changes?limit=1").json()

    assert page.status == 200
    assert 'id="v2"' in page.body
    assert 'data-field="every_seconds"' in page.body
    assert "Restore version 1" in page.body
    assert "Restore version 2" not in page.body
    assert [(c["version"], c["action"]) for c in one["changes"]] == [(2, "update"), (1, "create")]
    # A new interval counts from the change: its anchor moved too.
    assert set(one["changes"][0]["changes"]) == {"every_seconds", "anchor_at"}
    assert one["changes"][0]["changes"]["every_seconds"] == {"before": 60, "after": 90}
    assert len(every["changes"]) == 1
    assert ui.request("/api/changes?limit=0").status == 400
    assert ui.request("/schedules/never-was/history").status == 404


def test_a_removed_schedule_s_history_stays_and_restoring_brings_it_back(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    schedules.create("gone", "ui.job", every=60)
    schedules.delete("gone")
    ui = serve(users={USER: PASSWORD})

    page = ui.request("/schedules/gone/history")
    restored = ui.post_form("/schedules/gone/restore", {"version": "1"})

    assert page.status == 200
    assert 'id="removed"' in page.body
    assert restored.status == 303
    assert restored.headers["location"] == "/schedules/gone/history?done=restored#v2"
    assert schedules.get("gone").definition.trigger.seconds == 60  # type: ignore[union-attr]


def test_a_restore_without_the_token_read_only_or_of_a_bad_version_writes_nothing(
    serve: Callable[..., UI], schedules: Schedules, store: Store
) -> None:
    schedules.create("target", "ui.job", every=60)
    schedules.update("target", every=90)
    ui = serve(users={USER: PASSWORD})
    read_only = serve(users={USER: PASSWORD}, read_only=True)
    before = table_rows(store)

    assert ui.request("/schedules/target/restore", form={"version": "1"}).status == 403
    assert (
        read_only.post_form("/schedules/target/restore", {"version": "1"}, ui.token()).status == 403
    )
    for version in ("0", "x", "", "99"):
        refused = ui.post_form("/schedules/target/restore", {"version": version})
        assert refused.status in (400, 404), version
    assert "Restore version" not in read_only.request("/schedules/target/history").body
    assert table_rows(store) == before
