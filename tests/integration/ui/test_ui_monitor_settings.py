"""A schedule's monitor settings through the UI's form, over HTTP against real
PostgreSQL: the run monitors and the channels typed as the CLI takes them, stored,
shown again on the edit page and the schedule page; a bad one refused beside its field
with the API's words, nothing written."""

from __future__ import annotations

import html
import re
from collections.abc import Callable

import pytest

from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.integration.helpers import table_rows
from tests.integration.ui import test_ui_http
from tests.integration.ui.test_ui_http import UI

pytestmark = pytest.mark.integration

app, serve, schedules = test_ui_http.app, test_ui_http.serve, test_ui_http.schedules

FORM = {
    "name": "exports",
    "task": "ui.job",
    "kind": "every",
    "timing": "1h",
    "args": "[]",
    "kwargs": "{}",
    "misfire_policy": "fire_once",
    "overlap_policy": "allow",
    "max_attempts": "3",
    "jitter": "0",
    "enabled": "on",
}


def error_of(body: str, field: str) -> str:
    found = re.search(rf'<span class="error" id="{field}-error">([^<]+)</span>', body)
    assert found is not None, body[:2000]
    return html.unescape(found[1])


def test_run_monitors_and_channels_typed_in_the_form_are_stored_and_shown_again(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    schedules.add_webhook("hook", "https://hooks.example.com/habeat")
    schedules.add_webhook("team", "https://hooks.example.com/team")
    ui = serve()
    typed = FORM | {
        "max_runtime": "10m",
        "revoke_after_max_runtime": "on",
        "late_after": "30",
        "missed_after": "2m",
        "channels": "team, hook",
    }

    created = ui.post_form("/new", typed)

    assert created.status == 303, created.body[:2000]
    definition = schedules.get("exports").definition
    assert definition.max_runtime_seconds == 600
    assert definition.revoke_after_max_runtime is True
    assert (definition.late_after_seconds, definition.missed_after_seconds) == (30, 120)
    assert definition.channels == ("team", "hook")
    edit = ui.request("/schedules/exports/edit").body
    assert 'name="max_runtime" value="600s"' in edit
    assert 'name="channels" value="team, hook"' in edit
    assert re.search(
        r'id="revoke_after_max_runtime" name="revoke_after_max_runtime"\s+checked', edit
    )
    page = ui.request("/schedules/exports").body
    assert "10m, then revoked" in page
    assert "team, hook" in page

    # As the edit page posts it: the revoke box unchecked, late after and channels emptied.
    cleared = FORM | {
        "max_runtime": "600s",
        "missed_after": "120s",
        "late_after": "",
        "channels": "",
    }
    saved = ui.post_form("/schedules/exports/edit", cleared)

    assert saved.status == 303, saved.body[:2000]
    definition = schedules.get("exports").definition
    assert (definition.max_runtime_seconds, definition.revoke_after_max_runtime) == (600, False)
    assert (definition.late_after_seconds, definition.channels) == (None, None)
    assert definition.missed_after_seconds == 120


@pytest.mark.parametrize(
    ("typed", "field", "says"),
    [
        ({"channels": "hook, nope"}, "channels", "no channel 'nope': add it first"),
        ({"channels": "two words"}, "channels", "channel name 'two words'"),
        ({"revoke_after_max_runtime": "on"}, "max_runtime", "needs a max_runtime"),
        ({"max_runtime": "0.5"}, "max_runtime", "max_runtime must be a number of seconds >= 1"),
        ({"late_after": "soon"}, "late_after", "not a duration"),
    ],
)
def test_a_bad_monitor_setting_is_refused_beside_its_field_and_nothing_is_written(
    serve: Callable[..., UI],
    schedules: Schedules,
    store: Store,
    typed: dict[str, str],
    field: str,
    says: str,
) -> None:
    schedules.add_webhook("hook", "https://hooks.example.com/habeat")
    ui = serve()
    before = table_rows(store)

    refused = ui.post_form("/new", FORM | typed)

    assert refused.status == 400
    assert says in error_of(refused.body, field)
    assert table_rows(store) == before
