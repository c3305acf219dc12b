"""The schedules UI and its JSON API, served for real, over rows written with psql:
each bad row is shown with its problem, never hides the others, and a page shows a
glimpse of a big value, not all of it. Issue 29, findings 1, 4 and 6."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable

import pytest

from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.integration.store.test_rows_written_with_psql import (
    INFINITE_TIMES,
    NEVER_FIRING,
    OVERSIZED,
    insert_rows,
)
from tests.integration.ui.test_ui_http import UI, app, serve  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration

BAD_ROWS = {
    "end-infinity": INFINITE_TIMES["end-infinity"],
    "once-at-infinity": INFINITE_TIMES["once-at-infinity"],
    **NEVER_FIRING,
    "kwargs-10mb": OVERSIZED["kwargs-10mb"],
    "args-1500-deep": OVERSIZED["args-1500-deep"],
}
PROBLEMS = {
    "end-infinity": "end_at = infinity cannot be read",
    "once-at-infinity": "run_at = infinity cannot be read",
    "cron-february-30": "it never fires",
    "every-infinity": "invalid interval inf",
    "every-1e300": "longer than a datetime can span",
    "zone-on-mars": "unknown time zone",
    "kwargs-10mb": "over the 65536-byte limit",
    "args-1500-deep": "nested more than 32 levels",
}


def page_of(name: str) -> str:
    return "/schedules/" + urllib.parse.quote(name, safe="")


def test_the_list_and_each_page_show_a_bad_row_with_its_problem(
    serve: Callable[..., UI],  # noqa: F811 (the fixture imported above)
    store: Store,
) -> None:
    """Issue 29, findings 1 and 4: on a0b959d `/` and `/api/schedules` answered 500
    (timestamp too large; invalid cron expression: it never fires), and so did the
    page of the schedule in the zone on Mars (unknown time zone)."""
    Schedules(store).create("good", "ui.job", every=60, allow_unregistered=True)
    insert_rows(store, BAD_ROWS)
    ui = serve()

    listing = ui.request("/")
    documents = ui.request("/api/schedules?limit=500")

    assert listing.status == 200, listing.body[-2000:]
    assert documents.status == 200, documents.body[-2000:]
    by_name = {document["name"]: document for document in documents.json()["schedules"]}
    assert set(by_name) == {"good", *BAD_ROWS}
    assert by_name["good"]["problem"] is None
    assert by_name["good"]["next_fire_at"] is not None
    for name, problem in PROBLEMS.items():
        assert problem in by_name[name]["problem"], name
        assert problem in listing.body, name
    assert len(listing.body) < 100_000, "the list shows a glimpse of the 10 MB row"
    assert len(documents.body) < 100_000, "so does the JSON API"

    for name, problem in PROBLEMS.items():
        page = ui.request(page_of(name))
        document = ui.request("/api" + page_of(name))
        assert page.status == 200, (name, page.body[-2000:])
        assert document.status == 200, (name, document.body[-2000:])
        assert problem in page.body, name
        assert problem in document.json()["problem"], name
        assert document.json()["upcoming"] == []
        assert len(page.body) < 100_000, name
        assert len(document.body) < 100_000, name
        edit = ui.request(page_of(name) + "/edit")
        assert edit.status == 400, (name, edit.status)
        assert "fix its row, or remove it" in edit.body


def test_a_page_shows_a_glimpse_of_big_args(
    serve: Callable[..., UI],  # noqa: F811 (the fixture imported above)
    store: Store,
) -> None:
    """Issue 29, finding 6: on a0b959d a schedule's page served its args whole."""
    Schedules(store).create("big", "ui.job", every=60, args=["x" * 60_000], allow_unregistered=True)
    ui = serve()

    page = ui.request(page_of("big"))

    assert page.status == 200
    assert "characters in all" in page.body
    assert len(page.body) < 20_000, len(page.body)
