"""The UI's pure parts: who is let in, the form read into API arguments, timing in
words, and the charts."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from beat.errors import ConfigError
from beat.models import MisfirePolicy, Origin, OverlapPolicy, Role, Schedule, ScheduleDefinition
from beat.schedule import timing
from beat.ui import charts, forms, wording
from beat.ui.security import (
    authorised,
    check_exposure,
    is_local_host_header,
    is_loopback,
    parse_roles,
    parse_users,
)
from beat.ui.server import UISettings

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# -- security -------------------------------------------------------------------------


def test_only_a_configured_user_with_its_own_password_is_let_in() -> None:
    users = {"ops": "one", "dev": "two:with:colons"}
    assert authorised(header("ops", "one"), users) == "ops"
    assert authorised(header("dev", "two:with:colons"), users) == "dev"
    assert authorised(header("ops", "two:with:colons"), users) is None, "another's password"
    assert authorised(header("ops", "on"), users) is None
    assert authorised(header("ops", ""), users) is None
    assert authorised(None, users) is None
    assert authorised("Bearer abc", users) is None
    assert authorised("Basic !!!not-base64", users) is None
    assert authorised("Basic " + base64.b64encode(b"\xff\xfe").decode(), users) is None


@given(st.text(min_size=1), st.text(min_size=1))
def test_no_credentials_are_let_in_when_no_user_matches(user: str, password: str) -> None:
    users = {"ops": "secret"}
    expected = "ops" if (user, password) == ("ops", "secret") else None
    assert authorised(header(user, password), users) == expected


def test_users_are_read_like_flowers_basic_auth() -> None:
    assert parse_users("a:1, b:2:3") == {"a": "1", "b": "2:3"}
    assert parse_users(None) == {}
    assert parse_users("") == {}
    for bad in ("admin", "admin:", ":pw"):
        with pytest.raises(ConfigError, match="user:password"):
            parse_users(bad)


def test_a_user_s_role_ends_its_pair_and_is_no_part_of_its_password() -> None:
    text = "ops:pw:operator, eve:pw:viewer, root:a:b:admin, old:pw, odd:pw:chef"
    assert parse_users(text) == {
        "ops": "pw",
        "eve": "pw",
        "root": "a:b",
        "old": "pw",
        "odd": "pw:chef",
    }
    assert parse_roles(text) == {"ops": Role.OPERATOR, "eve": Role.VIEWER, "root": Role.ADMIN}
    assert parse_users("only:admin") == {"only": "admin"}, "a password alone is never a role"


def test_a_malformed_pair_is_refused_without_repeating_it() -> None:
    """issue 29, finding 8: the refusal named the pair (``got ':UiPw-…'``)."""
    with pytest.raises(ConfigError) as refused:
        parse_users("ops:fine,:UiPw-secret")
    assert "UiPw-secret" not in str(refused.value)
    assert "pair 2" in str(refused.value)


@pytest.mark.parametrize(
    ("given", "link"),
    [
        (None, ""),
        ("http://localhost:5555/", "http://localhost:5555"),
        ("https://admin:pa@ss@flower.example:5555/flower/", "https://flower.example:5555/flower"),
    ],
)
def test_pages_link_to_flower_without_its_credentials(given: str | None, link: str) -> None:
    """issue 29, finding 8: every page's Flower link carried ``user:password@``."""
    assert UISettings(flower_url=given).flower_link == link


def test_other_hosts_are_served_only_with_a_password() -> None:
    for address in ("127.0.0.1", "127.1.2.3", "::1", "localhost"):
        assert is_loopback(address)
        check_exposure(address, {})
    for address in ("0.0.0.0", "::", "10.0.0.5", "example.org"):
        assert not is_loopback(address)
        with pytest.raises(ConfigError, match="refusing to listen"):
            check_exposure(address, {})
        check_exposure(address, {"ops": "pw"})


def test_without_a_password_only_loopback_host_names_are_served() -> None:
    for host in ("localhost", "localhost:5556", "127.0.0.1:5556", "[::1]:5556", "[::1]"):
        assert is_local_host_header(host), host
    for host in (
        None,
        "",
        "evil.example:5556",
        "10.0.0.2:5556",
        "[2001:db8::1]:80",
        "localhost.evil",
    ):
        assert not is_local_host_header(host), host


# -- timing in words --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("* * * * *", "every minute"),
        ("*/15 * * * *", "every 15 minutes"),
        ("*/1 * * * *", "every minute"),
        ("0 */1 * * *", "every hour at minute 0"),
        ("7 * * * *", "every hour at minute 7"),
        ("5 */2 * * *", "every 2 hours at minute 5"),
        ("30 2 * * *", "every day at 02:30 (Europe/Berlin)"),
        ("0 9 * * 1-5", "at 09:00 on Monday to Friday (Europe/Berlin)"),
        ("0 9 * * mon,wed", "at 09:00 on Monday and Wednesday (Europe/Berlin)"),
        ("0 9 * * 0", "at 09:00 on Sunday (Europe/Berlin)"),
        ("0 0 1 * *", "at 00:00 on day 1 of every month (Europe/Berlin)"),
        ("*/5 * * * * *", "every 5 seconds"),
        ("0 0 1 1 *", None),
        ("0 9-17 * * *", None),
        ("0 9 1 * 1", None),
    ],
)
def test_common_crons_are_put_in_words_and_others_are_not(
    expression: str, words: str | None
) -> None:
    assert wording.in_words(timing.parse_cron(expression), "Europe/Berlin") == words


def test_intervals_and_one_offs_in_words() -> None:
    assert wording.in_words(timing.every(5400, anchor=NOW), "UTC") == "every 1 hour 30 minutes"
    assert wording.in_words(timing.every(1, anchor=NOW), "UTC") == "every 1 second"
    assert wording.in_words(timing.every(2.5, anchor=NOW), "UTC") == "every 2.5 seconds"
    assert wording.in_words(timing.once(NOW), "UTC") == "once"


# -- the form ---------------------------------------------------------------------------


def stored(trigger: timing.Trigger, **fields: object) -> Schedule:
    values: dict[str, object] = {
        "name": "job",
        "task": "tasks.job",
        "trigger": trigger,
        "timezone": "Europe/Berlin",
        "args": (1,),
        "kwargs": {"k": "v"},
        "options": {},
        "enabled": True,
        "misfire_policy": MisfirePolicy.FIRE_ONCE,
        "max_attempts": 3,
        "origin": Origin.API,
        "overlap_policy": OverlapPolicy.ALLOW,
        "jitter_seconds": 0.0,
    } | fields
    definition = ScheduleDefinition(**values)  # type: ignore[arg-type]
    return Schedule(
        id=1,
        definition=definition,
        next_fire_at=NOW,
        last_fire_at=None,
        created_at=NOW,
        updated_at=NOW,
    )


def test_an_unchanged_form_changes_nothing() -> None:
    for trigger in (timing.parse_cron("30 2 * * *"), timing.every(90, anchor=NOW)):
        current = stored(
            trigger, timezone="UTC" if isinstance(trigger, timing.Every) else "Europe/Berlin"
        )
        form = forms.submitted(forms.form_of(current).values)
        assert forms.update_arguments(form, current) == {}
        assert form.ok


def test_only_the_changed_fields_are_sent_and_a_new_zone_resends_the_timing() -> None:
    current = stored(timing.parse_cron("30 2 * * *"))
    values = forms.form_of(current).values | {"args": "[2]", "enabled": ""}
    form = forms.submitted(values)
    assert forms.update_arguments(form, current) == {"args": [2], "enabled": False}
    rezoned = forms.submitted(forms.form_of(current).values | {"tz": "Asia/Tokyo"})
    assert forms.update_arguments(rezoned, current) == {"cron": "30 2 * * *", "tz": "Asia/Tokyo"}


def test_fields_are_read_with_the_clis_parsers_and_errors_stay_beside_them() -> None:
    values = forms.blank_form({"default_tz": "UTC"}).values | {
        "kind": "every",
        "timing": "1h30m",
        "tz": "",
        "jitter": "5m",
        "args": "[1",
        "max_runs": "three",
        "start_at": "tomorrow",
    }
    form = forms.submitted(values)
    fields = forms.creation_arguments(form, "UTC")
    assert fields["every"] == 5400
    assert fields["jitter"] == 300
    assert set(form.errors) == {"args", "max_runs", "start_at"}
    assert "JSON array" in form.errors["args"]
    assert "ISO 8601" in form.errors["start_at"]


def test_a_wall_time_is_read_in_the_zone_given() -> None:
    values = forms.blank_form({}).values | {
        "kind": "at",
        "timing": "2027-03-28T02:30",
        "tz": "Europe/Berlin",
    }
    form = forms.submitted(values)
    forms.creation_arguments(form, "UTC")
    assert "does not exist in Europe/Berlin" in form.errors["timing"], "the clocks skip 02:30"
    fine = forms.submitted(values | {"timing": "2027-03-28T09:00"})
    fields = forms.creation_arguments(fine, "UTC")
    assert fields["at"] == datetime(2027, 3, 28, 7, 0, tzinfo=UTC)


def test_the_failing_monitor_s_thresholds_are_read_kept_and_cleared_to_the_default() -> None:
    current = stored(timing.parse_cron("30 2 * * *"), alert_after_failures=2)
    assert forms.form_of(current).values["alert_after_failures"] == "2"
    assert forms.form_of(current).values["pause_after_failures"] == ""
    paused_at_five = forms.form_of(current).values | {"pause_after_failures": "5"}
    assert forms.update_arguments(forms.submitted(paused_at_five), current) == {
        "pause_after_failures": 5
    }
    cleared = forms.form_of(current).values | {"alert_after_failures": ""}
    assert forms.update_arguments(forms.submitted(cleared), current) == {
        "alert_after_failures": None
    }
    typo = forms.submitted(forms.form_of(current).values | {"pause_after_failures": "5x"})
    forms.update_arguments(typo, current)
    assert set(typo.errors) == {"pause_after_failures"}


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ("schedule name 'a\\tb' has control characters: use printable text", "name"),
        ("task 'x' is not registered with the Celery app 'app'", "task"),
        ("cron '61 * * * *': minute 61 is out of range", "timing"),
        ("unknown time zone 'Mars/Base'", "tz"),
        ("an interval counts elapsed seconds and has no time zone: leave tz (--tz) out", "tz"),
        ("jitter 90s is longer than its interval 60s", "jitter"),
        ("max_attempts must be a whole number from 1 to 2147483647, got 0", "max_attempts"),
        ("end_at 2027-01-01T00:00:00+00:00 is not after start_at", "end_at"),
        ("pause_after_failures must be from 0 (never) to 100, got 500", "pause_after_failures"),
        ("A schedule with this name exists already: pick another name or update it.", "name"),
        ("something else entirely", ""),
    ],
)
def test_an_api_error_is_put_beside_the_field_it_is_about(message: str, field: str) -> None:
    assert forms.field_of_error(message) == field


# -- charts -----------------------------------------------------------------------------


def test_a_sparkline_has_a_point_per_published_run_and_gaps_for_the_others() -> None:
    svg = charts.sparkline([0.01, 0.02, None, 0.5, 0.03])
    assert svg.count("<polyline") == 2
    assert "max 500 ms" in svg
    assert "no runs published" in charts.sparkline([None, None])


def test_chart_labels_are_escaped() -> None:
    svg = charts.stacked_bars(
        [{"succeeded": 2.0}], ["<script>"], order=["succeeded"], colours={}, unit="runs & more"
    )
    assert "<script>" not in svg
    assert "&lt;script&gt;" in svg
    assert "runs &amp; more" in svg
    line = charts.line_chart({"p50": [0.1, None, 0.3]}, ["a", "b", "c"], colours={}, unit="s")
    assert line.count("<polyline") == 2, "a missing bucket breaks the line"
    assert re.search(r"<svg[^>]*viewBox", line)
