"""The incidents in the UI over HTTP, in-process against real PostgreSQL and Redis: the
incidents page (the open ones newest first, ``?all=1`` the resolved ones too, the
cluster's stall without a link), the count in the navigation, a schedule's monitor
settings and open incidents on its page, hostile errors escaped and cut, and the JSON
API beside the CLI's ``--json``. Incidents are opened by the leader's real failing
monitor, or written as rows where a test needs a time or a kind of its own."""

from __future__ import annotations

import html
import json
import re
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import insert

from beat.models import IncidentKind, RunState
from beat.ops.monitor_rendering import monitor_settings
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.tables import incidents, runs
from tests.integration.helpers import invoke
from tests.integration.ui import test_ui_http
from tests.integration.ui.test_ui_http import UI

pytestmark = pytest.mark.integration

#: The UI's fixtures, shared with the tests of its pages.
app, serve, schedules = test_ui_http.app, test_ui_http.serve, test_ui_http.schedules

HOSTILE = "<script>alert('incident')</script>"


def failed_runs(store: Store, name: str, states: list[RunState], *, error: str) -> None:
    """Finished runs of schedule ``name``, a minute apart, the newest fired a minute
    after the newest so far, as a worker leaves them (each but a success with
    ``error``)."""
    schedule = store.get_schedule(name)
    now = store.now()
    already = len(runs_of(store, name))
    rows = [
        {
            "id": uuid.uuid4(),
            "schedule_id": schedule.id,
            "schedule_name": name,
            "task": "ui.job",
            "state": state.value,
            "fire_at": now - timedelta(minutes=30) + timedelta(minutes=already + index),
            "claimed_at": now,
            "finished_at": now,
            "error": None if state is RunState.SUCCEEDED else error,
        }
        for index, state in enumerate(states)
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(runs), rows)


def runs_of(store: Store, name: str) -> list[Any]:
    with store.engine.connect() as conn:
        return list(conn.execute(runs.select().where(runs.c.schedule_name == name)))


def watch(store: Store) -> Any:
    """One pass of the leader's failing monitor: an incident after 2 failures in a row."""
    return store.watch_failures(1, alert_after=2, pause_after=0, idle_timeout=5)


def add_incident(store: Store, *, opened_ago: timedelta, **columns: Any) -> int:
    """A row of ``beat_incidents`` as the leader writes it, opened ``opened_ago``."""
    values = {
        "opened_at": store.now() - opened_ago,
        "epoch": 1,
        "failures": 3,
        "kind": IncidentKind.FAILING.value,
    } | columns
    with store.engine.begin() as conn:
        added: int = conn.execute(
            insert(incidents).values(**values).returning(incidents.c.id)
        ).scalar_one()
    return added


def listed_ids(body: str, table: str = "incidents") -> list[int]:
    """The incident IDs of table ``table``'s rows, in order."""
    shown = body[body.index(f'id="{table}"') :]
    return [
        int(found)
        for found in re.findall(r'data-incident="(\d+)"', shown[: shown.index("</table>")])
    ]


def nav_count(body: str) -> str | None:
    found = re.search(r'id="open-incidents-count"[^>]*>(\d+)<', body)
    return None if found is None else found[1]


@pytest.fixture
def leader(store: Store) -> Store:
    """The store, as leader 1 of this cluster (the failing monitor writes as leader)."""
    assert store.take_leadership(1, "leader")
    return store


def test_the_incidents_page_lists_the_open_ones_newest_first_and_all_with_resolved_ones(
    serve: Callable[..., UI], schedules: Schedules, leader: Store
) -> None:
    schedules.create("nightly", "ui.job", every=60)
    ui = serve()
    empty = ui.request("/incidents")
    assert empty.status == 200
    assert "No incident is open." in empty.body
    assert nav_count(empty.body) is None, "no count without open incidents"

    failing = add_incident(
        leader,
        opened_ago=timedelta(minutes=5),
        schedule_id=leader.get_schedule("nightly").id,
        schedule_name="nightly",
        last_error="ValueError: boom",
    )
    stall = add_incident(
        leader,
        opened_ago=timedelta(minutes=1),
        schedule_name="(cluster)",
        kind=IncidentKind.STALL.value,
        failures=7,
        last_error="7 schedules wait unclaimed",
    )
    resolved = add_incident(
        leader,
        opened_ago=timedelta(minutes=3),
        schedule_name="removed-since",
        resolved_at=leader.now(),
        resolution="the schedule was removed",
    )
    page = ui.request("/incidents")

    assert listed_ids(page.body) == [stall, failing], "open ones, newest first"
    assert nav_count(page.body) == "2"
    assert nav_count(ui.request("/").body) == "2", "every page's navigation counts them"
    assert '<a href="/schedules/nightly">nightly</a>' in page.body
    assert "(cluster)" in page.body
    assert 'href="/schedules/%28cluster%29"' not in page.body, "the cluster has no page"
    assert '<span class="badge">stall</span>' in page.body
    assert "the schedule was removed" not in page.body
    everything = ui.request("/incidents?all=1")
    assert listed_ids(everything.body) == [stall, resolved, failing]
    assert "the schedule was removed" in everything.body
    assert 'href="/schedules/removed-since"' not in everything.body, "its schedule is gone"


def test_every_kind_of_incident_is_shown_by_its_name(
    serve: Callable[..., UI], leader: Store
) -> None:
    for kind in IncidentKind:
        add_incident(leader, opened_ago=timedelta(0), schedule_name=f"of-{kind}", kind=kind.value)
    page = serve().request("/incidents")
    assert len(listed_ids(page.body)) == len(IncidentKind)
    for kind in IncidentKind:
        assert f'<span class="badge">{kind.value}</span>' in page.body, kind


def test_a_hostile_last_error_is_escaped_and_a_long_one_cut(
    serve: Callable[..., UI], schedules: Schedules, leader: Store
) -> None:
    schedules.create("hostile", "ui.job", every=60)
    failed_runs(leader, "hostile", [RunState.FAILED, RunState.FAILED], error=HOSTILE)
    assert watch(leader).opened == [("hostile", 2)]
    add_incident(leader, opened_ago=timedelta(hours=1), schedule_name="long", last_error="x" * 5000)
    ui = serve()
    for path in ("/incidents", "/schedules/hostile"):
        body = ui.request(path).body
        assert HOSTILE not in body, path
        assert html.escape(HOSTILE) in body, path
    listing = ui.request("/incidents").body
    assert "x" * 5000 not in listing
    assert "(5,000 characters in all)" in listing


def test_a_schedule_page_shows_its_monitor_settings_and_only_its_open_incidents(
    serve: Callable[..., UI], schedules: Schedules, leader: Store
) -> None:
    schedules.create("flaky", "ui.job", every=60, alert_after_failures=2, pause_after_failures=0)
    schedules.create("(cluster)", "ui.job", every=60)  # a name the stall incident goes by
    add_incident(
        leader, opened_ago=timedelta(0), schedule_name="(cluster)", kind=IncidentKind.STALL.value
    )
    ui = serve()
    quiet = ui.request("/schedules/flaky").body
    for label, text in monitor_settings(schedules.get("flaky").definition):
        assert f'<dt>{label}</dt><dd class="monitor">{text}</dd>' in quiet
    assert "2 failures in a row" in quiet
    assert "never" in quiet
    assert 'id="open-incidents"' not in quiet, "nothing while none is open"

    failed_runs(leader, "flaky", [RunState.FAILED, RunState.LOST], error="TimeoutError: db")
    assert watch(leader).opened == [("flaky", 2)]
    failing = ui.request("/schedules/flaky").body
    assert 'id="open-incidents"' in failing
    section = failing[failing.index('id="open-incidents"') : failing.index("</section>")]
    assert len(listed_ids(section, "schedule-incidents")) == 1
    assert '<span class="badge">failing</span>' in section
    assert "TimeoutError: db" in section
    assert '<a href="/incidents">' in section
    assert 'id="open-incidents"' not in ui.request("/schedules/%28cluster%29").body, (
        "the cluster's stall is not the incident of a schedule that shares its name"
    )

    failed_runs(leader, "flaky", [RunState.SUCCEEDED], error="")
    assert [name for name, _ in watch(leader).resolved] == ["flaky"]
    assert 'id="open-incidents"' not in ui.request("/schedules/flaky").body
    assert "TimeoutError: db" in ui.request("/incidents?all=1").body


def test_the_json_api_serves_the_incidents_as_the_cli_does(
    serve: Callable[..., UI], schedules: Schedules, leader: Store, app: Celery
) -> None:
    schedules.create("nightly", "ui.job", every=60)
    failed_runs(leader, "nightly", [RunState.FAILED, RunState.FAILED], error="boom")
    watch(leader)
    add_incident(
        leader,
        opened_ago=timedelta(hours=1),
        schedule_name="gone",
        resolved_at=leader.now(),
        resolution="the schedule was removed",
    )
    ui = serve()
    for query, flags in (("", []), ("?all=1", ["--all"])):
        served = ui.request("/api/incidents" + query).json()
        cli = json.loads(invoke(app, "incidents", "--json", *flags).stdout)
        assert served == {"incidents": cli}, query
    assert len(ui.request("/api/incidents?all=1").json()["incidents"]) == 2
    [only] = ui.request("/api/incidents?all=1&schedule=nightly").json()["incidents"]
    assert only["schedule"] == "nightly"
    assert ui.request("/api/incidents?schedule=gone&all=1").json() == {"incidents": []}
    assert ui.request("/api/incidents?limit=0").status == 400
