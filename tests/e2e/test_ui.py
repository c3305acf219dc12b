"""The schedules UI in a real browser (Debian's Chromium, driven by Playwright) against
a real cluster: `celery -A app schedules ui`, a beat and a worker.

An operator logs in, finds a schedule, pauses it, triggers it and sees the run
succeed, makes a mistake in its cron and sees the error beside the field with
nothing written, and resumes it. Without the password the UI answers 401; a
write without the CSRF token is refused."""

from __future__ import annotations

import base64
import re
import urllib.request

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import insert

from beat.models import IncidentKind, RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.tables import incidents
from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.ui_browser import (
    FLOWER_URL,
    PASSWORD,
    USER,
    browser,
    screenshot,
    start_ui,
    status_of,
)

pytestmark = pytest.mark.e2e


def _schedule_row(store: Store, name: str) -> dict[str, object]:
    schedule = Schedules(store).get(name)
    definition = schedule.definition
    return {
        "trigger": definition.trigger,
        "enabled": definition.enabled,
        "next_fire_at": schedule.next_fire_at,
        "updated_at": schedule.updated_at,
    }


def _post_without_token(url: str) -> int:
    credentials = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    request = urllib.request.Request(url, data=b"", method="POST")
    request.add_header("Authorization", f"Basic {credentials}")
    return status_of(request)


def test_an_operator_pauses_triggers_fixes_and_resumes_a_schedule(
    cluster: Cluster, store: Store
) -> None:
    schedules = Schedules(store)
    schedules.create(
        "reports/nightly", "e2e.record", cron="30 2 * * *", tz="Europe/Berlin", args=["ui"]
    )
    for number in range(3):
        schedules.create(f"tenant-{number:02d}", "e2e.record", every=3600, args=[f"t{number}"])
    cluster.beat("beat0")
    cluster.worker("worker1", concurrency=1)
    _, base = start_ui(cluster)
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)

    with browser() as chromium:
        anonymous = chromium.new_context()
        assert anonymous.request.get(base + "/").status == 401, "no password, no page"
        anonymous.close()

        context = chromium.new_context(
            http_credentials={"username": USER, "password": PASSWORD},
            viewport={"width": 1400, "height": 900},
        )
        page = context.new_page()
        response = page.goto(base + "/")
        assert response is not None
        assert response.status == 200
        expect(page.locator("#schedules")).to_contain_text("reports/nightly")
        expect(page.locator("#schedules")).to_contain_text("every day at 02:30 (Europe/Berlin)")
        screenshot(page, "schedules")

        page.get_by_role("searchbox").fill("nightly")
        page.get_by_role("button", name="Filter").click()
        expect(page.locator("#schedules tbody tr")).to_have_count(1)

        page.get_by_role("link", name="reports/nightly").click()
        expect(page.locator("h1")).to_contain_text("reports/nightly")
        expect(page.locator("#upcoming tbody tr")).to_have_count(10)
        expect(page.locator("#upcoming")).to_contain_text("02:30:00 CET")

        page.get_by_role("button", name="Pause").click()
        expect(page.locator("#state")).to_have_text("paused")
        assert _schedule_row(store, "reports/nightly")["enabled"] is False

        page.get_by_role("button", name="Trigger now").click()
        expect(page.get_by_role("status")).to_contain_text("Triggered")
        _wait_for_run_to_succeed(page)
        row = page.locator("#runs tbody tr").first
        run_id = row.get_attribute("data-run")
        assert run_id is not None
        expect(row.get_by_role("link", name=run_id)).to_have_attribute(
            "href", f"{FLOWER_URL}/task/{run_id}"
        )
        assert cluster.effects() == {run_id: 1}, "the triggered run ran once"
        screenshot(page, "schedule")

        before = _schedule_row(store, "reports/nightly")
        page.get_by_role("link", name="Edit").click()
        page.locator("#timing").fill("61 2 * * *")
        page.locator("#args").fill('["changed"]')
        page.get_by_role("button", name="Save").click()
        expect(page.locator("#timing-error")).to_contain_text("61")
        expect(page.locator("#form-problem")).to_contain_text("Nothing was saved")
        expect(page.locator("#timing")).to_have_value("61 2 * * *")
        screenshot(page, "edit-error")
        assert _schedule_row(store, "reports/nightly") == before, "nothing written"
        assert schedules.get("reports/nightly").definition.args == ("ui",)

        page.get_by_role("link", name="cancel").click()
        page.get_by_role("button", name="Resume").click()
        expect(page.locator("#state")).to_have_text("enabled")
        assert _schedule_row(store, "reports/nightly")["enabled"] is True

        page.goto(base + "/cluster")
        expect(page.locator("#beats")).to_contain_text("leader")
        expect(page.locator("#workers")).to_contain_text("worker1@")
        screenshot(page, "cluster")
        page.goto(base + "/plots?window=15m")
        expect(page.locator("#totals")).to_contain_text("succeeded")
        screenshot(page, "plots")
        context.close()

    assert _post_without_token(f"{base}/schedules/tenant-00/pause") == 403
    assert schedules.get("tenant-00").definition.enabled, "the forged write changed nothing"


def _wait_for_run_to_succeed(page: Page) -> None:
    def succeeded() -> bool:
        page.reload()
        first = page.locator("#runs tbody tr").first
        return bool(re.search(RunState.SUCCEEDED.value, first.inner_text()))

    wait_until(succeeded, timeout=60, interval=0.5)


def test_a_schedule_is_created_from_the_apps_tasks_and_deleted(
    cluster: Cluster, store: Store
) -> None:
    _, base = start_ui(cluster)
    with browser() as chromium:
        context = chromium.new_context(http_credentials={"username": USER, "password": PASSWORD})
        page = context.new_page()
        page.goto(base + "/new")
        page.locator("#name").fill("made-in-the-browser")
        page.locator("#task").select_option("e2e.record")
        page.locator("#kind").select_option("every")
        page.locator("#timing").fill("10m")
        page.locator("#tz").fill("")
        page.locator("#args").fill('["browser"]')
        page.get_by_role("button", name="Create").click()
        expect(page.get_by_role("status")).to_contain_text("Created")
        created = Schedules(store).get("made-in-the-browser")
        assert created.definition.task == "e2e.record"
        assert created.definition.args == ("browser",)

        page.locator("summary", has_text="Delete").click()
        page.get_by_role("button", name=re.compile("^Delete made-in-the-browser")).click()
        expect(page.get_by_role("status")).to_contain_text("Deleted")
        assert Schedules(store).list() == []
        context.close()


def test_an_operator_finds_an_open_incident_from_the_navigation_and_opens_its_schedule(
    cluster: Cluster, store: Store
) -> None:
    schedules = Schedules(store)
    schedules.create("exports/hourly", "e2e.record", every=3600)
    with store.engine.begin() as conn:
        conn.execute(
            insert(incidents).values(
                schedule_id=store.get_schedule("exports/hourly").id,
                schedule_name="exports/hourly",
                kind=IncidentKind.FAILING.value,
                epoch=1,
                failures=3,
                last_error="ConnectionError: the export bucket refused us",
            )
        )
    _, base = start_ui(cluster)
    with browser() as chromium:
        context = chromium.new_context(http_credentials={"username": USER, "password": PASSWORD})
        page = context.new_page()
        page.goto(base + "/")
        page.get_by_role("navigation").get_by_role("link", name="Incidents 1").click()
        expect(page.locator("h1")).to_contain_text("Incidents")
        expect(page.locator("#incidents tbody tr")).to_have_count(1)
        expect(page.locator("#incidents")).to_contain_text("the export bucket refused us")
        screenshot(page, "incidents")

        page.locator("#incidents").get_by_role("link", name="exports/hourly").click()
        expect(page.locator("h1")).to_contain_text("exports/hourly")
        expect(page.locator("#schedule-incidents")).to_contain_text("failing")
        screenshot(page, "schedule-incidents")
        page.locator("#open-incidents").get_by_role("link", name="all incidents").click()
        expect(page).to_have_url(base + "/incidents")
        context.close()
