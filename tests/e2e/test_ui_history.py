"""The history tab in a real browser (Debian's Chromium, driven by Playwright) against a
real `celery -A app schedules ui`: an operator's edit and pause are recorded as theirs,
with the UI as the entry and their address; the tab shows each field before and after;
a restore brings an earlier version back as a new change."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from beat.models import ChangeAction, ChangeEntry
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.e2e.cluster import Cluster
from tests.e2e.ui_browser import PASSWORD, USER, browser, screenshot, start_ui

pytestmark = pytest.mark.e2e


def test_an_operator_s_changes_are_in_the_history_tab_and_an_earlier_version_comes_back(
    cluster: Cluster, store: Store
) -> None:
    schedules = Schedules(store)
    schedules.create("reports/nightly", "e2e.record", cron="30 2 * * *", args=["v1"])
    _, base = start_ui(cluster)

    with browser() as chromium:
        context = chromium.new_context(
            http_credentials={"username": USER, "password": PASSWORD},
            viewport={"width": 1400, "height": 900},
        )
        page = context.new_page()
        page.goto(base + "/schedules/reports%2Fnightly")
        page.get_by_role("link", name="Edit").click()
        page.locator("#timing").fill("45 3 * * *")
        page.get_by_role("button", name="Save").click()
        expect(page.get_by_role("status")).to_contain_text("Saved")
        page.get_by_label("pause note").fill("waiting for the new warehouse")
        page.get_by_role("button", name="Pause").click()
        expect(page.locator("#state")).to_have_text("paused")

        page.get_by_role("link", name="History").click()
        rows = page.locator("#history > tbody > tr")
        expect(rows).to_have_count(3)
        edited = page.locator("#v2")
        expect(edited.locator("[data-field=cron] .before")).to_have_text('"30 2 * * *"')
        expect(edited.locator("[data-field=cron] .after")).to_have_text('"45 3 * * *"')
        expect(edited.locator(".actor")).to_have_text(USER)
        expect(page.locator("#v3")).to_contain_text("waiting for the new warehouse")
        screenshot(page, "history")

        page.locator("#v1").get_by_role("button", name="Restore version 1").click()
        expect(page.get_by_role("status")).to_contain_text("Restored")
        expect(rows).to_have_count(4)
        expect(page.locator("#v4")).to_have_attribute("data-action", "restore")
        expect(page.locator("#v4 [data-field=cron] .after")).to_have_text('"30 2 * * *"')
        context.close()

    restored = schedules.get("reports/nightly")
    assert restored.definition.trigger.expression == "30 2 * * *"  # type: ignore[union-attr]
    assert not restored.definition.enabled, "a restore keeps whether it is paused"
    log = list(reversed(schedules.audit("reports/nightly")))
    assert [change.action for change in log] == [
        ChangeAction.CREATE,
        ChangeAction.UPDATE,
        ChangeAction.PAUSE,
        ChangeAction.RESTORE,
    ]
    assert {(c.actor, c.entry, c.address) for c in log[1:]} == {(USER, ChangeEntry.UI, "127.0.0.1")}
    assert log[2].note == "waiting for the new warehouse"


def test_of_two_people_editing_at_once_the_second_save_is_refused_with_what_changed(
    cluster: Cluster, store: Store
) -> None:
    schedules = Schedules(store)
    schedules.create("reports/nightly", "e2e.record", cron="30 2 * * *", args=["v1"])
    _, base = start_ui(cluster)
    edit_page = base + "/schedules/reports%2Fnightly/edit"

    with browser() as chromium:
        credentials = {"username": USER, "password": PASSWORD}
        first = chromium.new_context(http_credentials=credentials).new_page()
        second = chromium.new_context(http_credentials=credentials).new_page()
        first.goto(edit_page)
        second.goto(edit_page)

        first.locator("#timing").fill("45 3 * * *")
        first.get_by_role("button", name="Save").click()
        expect(first.get_by_role("status")).to_contain_text("Saved")

        second.locator("#args").fill('["from the second"]')
        second.get_by_role("button", name="Save").click()
        expect(second.locator("#form-problem")).to_contain_text("someone changed this schedule")
        changed = second.locator("#changed-since [data-field=cron]")
        expect(changed.locator(".before")).to_have_text('"30 2 * * *"')
        expect(changed.locator(".after")).to_have_text('"45 3 * * *"')
        expect(second.locator("#args")).to_have_value('["from the second"]')
        screenshot(second, "edit-conflict")

        kept = schedules.get("reports/nightly").definition
        assert kept.trigger.expression == "45 3 * * *"  # type: ignore[union-attr]
        assert kept.args == ("v1",), "the second save overwrote nothing"

        second.locator("#timing").fill("45 3 * * *")  # seen what changed: keep it
        second.get_by_role("button", name="Save").click()
        expect(second.get_by_role("status")).to_contain_text("Saved")
    saved = schedules.get("reports/nightly").definition
    assert (saved.trigger.expression, saved.args) == ("45 3 * * *", ("from the second",))  # type: ignore[union-attr]
