"""Celery's own schedule objects in ``beat_schedule``: a ``crontab()`` fires when
Celery's beat would fire it (Celery's ``crontab`` is the oracle), and the schedules
that cannot be followed exactly are refused in one line saying what to use."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab, schedule, solar
from hypothesis import assume, event, given, note
from hypothesis import strategies as st

from beat.errors import ConfigError
from beat.schedule import code as code_schedules
from beat.schedule.code import collect
from beat.schedule.timing import Cron, Every, next_fire_after
from tests.unit.schedule.test_timing import (
    PROPERTY_SETTINGS,
    START_INSTANTS,
    occurrences,
    transitions,
)

BERLIN = ZoneInfo("Europe/Berlin")
ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",  # moves by 30 minutes
    "Asia/Kathmandu",  # +05:45
    "America/Sao_Paulo",  # until 2019 its clocks skipped midnight
    "Africa/Casablanca",  # goes back for Ramadan
]


@functools.cache
def celery_app(zone: str) -> Celery:
    app = Celery("crontab-oracle", set_as_current=False)
    app.conf.timezone = zone
    return app


def celery_crontab(fields: dict[str, Any], zone: str, now: datetime) -> crontab:
    return crontab(**fields, app=celery_app(zone), nowfun=lambda: now)


def celery_next(fields: dict[str, Any], zone: str, last_run: datetime) -> tuple[datetime, datetime]:
    """When Celery's beat runs the entry next after it last ran at ``last_run`` (beat
    asks ``remaining_estimate(last_run_at)`` at that instant), and the naive wall time
    Celery aimed at."""
    oracle = celery_crontab(fields, zone, last_run)
    start, delta, _ = oracle.remaining_delta(last_run)
    return last_run + oracle.remaining_estimate(last_run), (start + delta).replace(tzinfo=None)


def beat_app(entry: dict[str, Any], zone: str = "UTC") -> Celery:
    app = Celery("code-schedules", set_as_current=False)
    app.conf.timezone = zone
    app.conf.beat_schedule = {"job": {"task": "tasks.demo.add", **entry}}
    return app


def our_trigger(fields: dict[str, Any], zone: str = "UTC") -> Cron:
    [(definition, _)] = collect(beat_app({"schedule": crontab(**fields)}, zone), default_tz="UTC")
    assert isinstance(definition.trigger, Cron)
    assert definition.timezone == zone
    return definition.trigger


def refusal(entry: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as refused:
        collect(beat_app(entry), default_tz="UTC")
    message = str(refused.value)
    assert "\n" not in message, "one line"
    assert message.startswith("beat_schedule['job']: ")
    return message


def local(instant: datetime, zone: ZoneInfo = BERLIN) -> str:
    moment = instant.astimezone(zone)
    return f"{moment:%a %d %b %H:%M} {moment.tzname()}"


# -- the findings --------------------------------------------------------------------------


def test_first_monday_idiom_fires_only_on_the_first_monday() -> None:
    fields = {"minute": 0, "hour": 9, "day_of_month": "1-7", "day_of_week": "mon"}
    trigger = our_trigger(fields, "Europe/Berlin")
    fires, after = [], datetime(2025, 1, 1, tzinfo=UTC)
    for _ in range(6):
        following = next_fire_after(trigger, BERLIN, after)
        assert following is not None
        fires.append(local(following))
        assert following == celery_next(fields, "Europe/Berlin", after)[0]
        after = following
    assert fires == [
        "Mon 06 Jan 09:00 CET",
        "Mon 03 Feb 09:00 CET",
        "Mon 03 Mar 09:00 CET",
        "Mon 07 Apr 09:00 CEST",
        "Mon 05 May 09:00 CEST",
        "Mon 02 Jun 09:00 CEST",
    ]
    assert trigger.describe() == "0 9 1-7 * 1 (day of month and day of week both match)"


def test_range_fields_are_accepted() -> None:
    trigger = our_trigger({"minute": range(0, 60, 20), "hour": {8, 9, 10, 17}})
    assert trigger == Cron(expression="*/20 8-10,17 * * *")
    after = datetime(2025, 3, 4, 10, 45, tzinfo=UTC)
    assert next_fire_after(trigger, ZoneInfo("UTC"), after) == datetime(
        2025, 3, 4, 17, 0, tzinfo=UTC
    )


@pytest.mark.parametrize(
    ("fields", "written"),
    [
        ({}, "* * * * *"),
        ({"minute": "*/15"}, "*/15 * * * *"),
        ({"minute": 0, "hour": "*/2"}, "0 */2 * * *"),
        ({"minute": 30, "hour": "2"}, "30 2 * * *"),
        ({"minute": [1, 2, 3, 5, 7, 8]}, "1-3,5,7,8 * * * *"),
        ({"minute": "5-50/15"}, "5-50/15 * * * *"),
        ({"day_of_week": "mon-fri"}, "* * * * 1-5"),
        ({"day_of_week": "sat-mon"}, "* * * * 0,1,6"),  # Celery: 0 is Sunday
        ({"month_of_year": "*/3", "day_of_month": 1}, "* * 1 */3 *"),
        ({"day_of_month": range(1, 32), "day_of_week": "sun"}, "* * * * 0"),
    ],
)
def test_a_crontab_is_written_in_cron_spelling(fields: dict[str, Any], written: str) -> None:
    trigger = our_trigger(fields)
    assert (trigger.expression, trigger.both_days) == (written, False)


def test_relative_intervals_are_refused_in_one_line() -> None:
    message = refusal({"schedule": schedule(timedelta(hours=1), relative=True)})
    assert message == (
        "beat_schedule['job']: relative=True is not supported (Celery rounds each run down"
        " to the hour, counting from when beat last ran); use crontab() for runs on the clock,"
        " e.g. crontab(minute=0), or remove relative=True"
    )
    # Celery applies an entry's own 'relative' to a number or a timedelta.
    assert "midnight" in refusal({"schedule": 86400, "relative": True})
    assert "minute='*/5'" in refusal({"schedule": timedelta(minutes=5), "relative": True})
    assert "remove relative=True" in refusal({"schedule": 30, "relative": True})


def test_intervals_without_relative_are_plain_intervals() -> None:
    for entry in (
        {"schedule": schedule(timedelta(minutes=5))},
        {"schedule": 300, "relative": False},
    ):
        [(definition, _)] = collect(beat_app(entry), default_tz="UTC")
        assert isinstance(definition.trigger, Every)
        assert definition.trigger.seconds == 300.0


def test_an_entrys_relative_does_not_apply_to_a_crontab() -> None:
    # Celery's maybe_schedule() applies it to numbers and timedeltas only.
    entry = {"schedule": crontab(minute=0), "relative": True}
    [(definition, _)] = collect(beat_app(entry), default_tz="UTC")
    assert definition.trigger == Cron(expression="0 * * * *")


def test_solar_is_refused_in_one_line() -> None:
    # Built without ephem, which this scheduler never needs: it refuses solar() first.
    sunrise = solar.__new__(solar)
    sunrise.event, sunrise.lat, sunrise.lon = "sunrise", 52.5, 13.4
    assert refusal({"schedule": sunrise}) == (
        "beat_schedule['job']: solar('sunrise', 52.5, 13.4) is not supported (beat computes no"
        " sunrise or sunset times); use crontab() at a fixed local time, e.g."
        " crontab(hour=7, minute=0), with 'tz' set to the place's zone"
    )


def test_other_schedule_types_are_refused_in_one_line() -> None:
    class Hourly:
        pass

    message = refusal({"schedule": Hourly()})
    assert "unsupported schedule of type" in message
    assert "Hourly; use crontab(), schedule(run_every), a number of seconds" in message

    class OwnZoneCrontab(crontab):  # like django-celery-beat's TzAwareCrontab
        def is_due(self, last_run_at: datetime) -> Any:
            return super().is_due(last_run_at)

    message = refusal({"schedule": OwnZoneCrontab(minute=0)})
    assert "changes how crontab() decides when it is due (is_due)" in message
    assert "use celery.schedules.crontab itself" in message


def test_a_crontab_subclass_that_keeps_the_timing_is_a_crontab() -> None:
    class Named(crontab):
        label = "nightly"

    [(definition, _)] = collect(beat_app({"schedule": Named(minute=0, hour=3)}), default_tz="UTC")
    assert definition.trigger == Cron(expression="0 3 * * *")


def test_a_changed_day_rule_changes_the_code_hash() -> None:
    """Code that meant "both" before this change was stored as "either": a new hash
    makes beat sync it again."""
    first_monday = crontab(minute=0, hour=9, day_of_month="1-7", day_of_week="mon")
    [(_, both)] = collect(beat_app({"schedule": first_monday}), default_tz="UTC")
    [(_, either)] = collect(beat_app({"schedule": "0 9 1-7 * 1"}), default_tz="UTC")
    assert both != either


# -- DST: where Celery's crontab differs from our rule, pinned on examples ------------------
#
# Celery computes the next matching wall time and reads it with fold=0 (the offset
# in force before a change), whatever the wall time is. Our rule: a skipped wall time
# runs once at the end of the gap; a repeated one once, at its first occurrence; an
# hour field with '*' runs in every real hour. The property test below checks that
# these are the only differences.


def test_dst_a_skipped_wall_time_runs_as_late_as_it_is_into_the_gap_under_celery() -> None:
    fields = {"minute": 30, "hour": 2}
    after = datetime(2024, 3, 30, 12, tzinfo=UTC)
    celery, wall = celery_next(fields, "Europe/Berlin", after)
    assert wall == datetime(2024, 3, 31, 2, 30)  # skipped: clocks go 02:00 -> 03:00
    assert local(celery) == "Sun 31 Mar 03:30 CEST"
    ours = next_fire_after(our_trigger(fields, "Europe/Berlin"), BERLIN, after)
    assert ours is not None
    assert local(ours) == "Sun 31 Mar 03:00 CEST", "the first instant after the gap"


def test_dst_celery_skips_the_second_pass_of_a_repeated_hour() -> None:
    fields = {"minute": "*/20"}
    after = datetime(2024, 10, 27, 0, 40, tzinfo=UTC)
    assert local(after) == "Sun 27 Oct 02:40 CEST"
    celery, _ = celery_next(fields, "Europe/Berlin", after)
    assert local(celery) == "Sun 27 Oct 03:00 CET"
    ours = next_fire_after(our_trigger(fields, "Europe/Berlin"), BERLIN, after)
    assert ours is not None
    assert local(ours) == "Sun 27 Oct 02:00 CET", "hour '*': every real hour, the repeated one too"


def test_dst_from_the_second_pass_celery_is_due_at_once_and_at_every_tick() -> None:
    fields = {"minute": 30, "hour": 2}
    after = datetime(2024, 10, 27, 1, 5, tzinfo=UTC)  # a beat (re)started then
    assert local(after) == "Sun 27 Oct 02:05 CET"
    celery, _ = celery_next(fields, "Europe/Berlin", after)
    assert local(celery) == "Sun 27 Oct 02:30 CEST", "an hour before 'now'"
    for tick in range(1, 4):  # beat runs it, records the run, asks again: due again
        last_run, now = after + timedelta(seconds=tick), after + timedelta(seconds=tick + 1)
        oracle = celery_crontab(fields, "Europe/Berlin", now)
        assert tuple(oracle.is_due(last_run)) == (True, 0), "due now, check again at once"
    last_run = datetime(2024, 10, 27, 1, 30, 1, tzinfo=UTC)  # 02:30:01 CET: over
    oracle = celery_crontab(fields, "Europe/Berlin", last_run)
    assert oracle.is_due(last_run)[0] is False
    ours = next_fire_after(our_trigger(fields, "Europe/Berlin"), BERLIN, after)
    assert ours is not None
    assert local(ours) == "Mon 28 Oct 02:30 CET", "02:30 ran at its first occurrence"


# -- the property: random crontab() objects, zones and instants ----------------------------

FIELD_RANGES = {
    "minute": (0, 59),
    "hour": (0, 23),
    "day_of_month": (1, 31),
    "month_of_year": (1, 12),
    "day_of_week": (0, 6),
}
MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


@st.composite
def celery_spec(
    draw: st.DrawFn, low: int, high: int, names: tuple[str, ...] = (), *, star: bool = True
) -> Any:
    """One crontab() field in any form Celery takes: a string it parses (values,
    names, ranges that may wrap, steps, lists), a number, a set, a list, a range();
    ``*`` too, unless ``star`` is false."""
    value = st.integers(low, high)
    first, last = draw(value), draw(value)
    step = draw(st.integers(1, max(1, (high - low) // 2)))

    def spelled(number: int) -> str:
        return names[number - low] if names and draw(st.booleans()) else str(number)

    shapes = ["int", "set", "list", "range", "string", "string", "string", "string"]
    shape = draw(st.sampled_from(["*", *shapes] if star else shapes))
    if shape == "*":
        return "*"
    if shape == "int":
        return first
    if shape == "set":
        return draw(st.sets(value, min_size=1, max_size=5))
    if shape == "list":
        return draw(st.lists(value, min_size=1, max_size=5))
    if shape == "range":
        return range(min(first, last), max(first, last) + 1, step)
    parts = draw(
        st.lists(
            st.sampled_from(["value", "range", "range/step", "*/step"]), min_size=1, max_size=3
        )
    )
    texts = {
        "value": spelled(first),
        "range": f"{spelled(first)}-{spelled(last)}",  # wraps around when last < first
        "range/step": f"{spelled(first)}-{spelled(last)}/{step}",
        "*/step": f"*/{step}",
    }
    return ",".join(texts[part] for part in parts)


@st.composite
def crontab_fields(draw: st.DrawFn) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "minute": draw(celery_spec(0, 59)),
        "hour": draw(st.one_of(celery_spec(0, 23), celery_spec(0, 4))),  # DST moves small hours
        "day_of_month": draw(celery_spec(1, 31)),
        "month_of_year": draw(celery_spec(1, 12, MONTH_NAMES)),
        "day_of_week": draw(celery_spec(0, 6, WEEKDAY_NAMES)),
    }
    if draw(st.booleans()):
        # The first-Monday idiom and its kin: both day fields restricted.
        fields["day_of_month"] = draw(celery_spec(1, 31, star=False))
        fields["day_of_week"] = draw(celery_spec(0, 6, WEEKDAY_NAMES, star=False))
    return fields


@st.composite
def zones_and_instants(draw: st.DrawFn) -> tuple[str, datetime]:
    """A zone, and an instant: anywhere, within two days of one of its changes of
    offset, or within three hours of one (where the DST rules apply)."""
    zone = draw(st.sampled_from(ZONES))
    changes = transitions(zone, draw(st.integers(2000, 2035)))
    around = draw(st.sampled_from([None, 2 * 24 * 60, 3 * 60]))
    if changes and around is not None:
        change: datetime = draw(st.sampled_from(changes))
        return zone, change + timedelta(seconds=draw(st.integers(-around * 60, around * 60)))
    return zone, draw(START_INSTANTS)


def celery_dst_difference(
    zone: ZoneInfo, after: datetime, wall: datetime, ours: datetime, celery: datetime, star: bool
) -> str | None:
    """Why Celery's next fire time differs from ours, if it is one of the documented
    DST differences (README, "Scheduling rules"); None if it is not."""
    real = occurrences(wall, zone)
    if not real:
        # A skipped wall time: Celery reads it with the offset from before the gap, so
        # it runs as long after the gap as it was into it. We run it at the gap's end
        # (specific hours) or not at all (hour '*').
        assert celery == wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
        return "skipped wall time"
    if celery <= after:
        # Asked from the second pass over a repeated period, Celery aims at the first
        # occurrence of a wall time still ahead on the clock, which has passed: its
        # beat runs the entry at once, and again at every tick until the clock shows
        # that wall time. We ran it at its first occurrence (specific hours) or run it
        # at its second (hour '*').
        assert after.astimezone(zone).fold == 1
        assert len(real) == 2
        assert celery == real[0]
        return "asked from the second pass"
    if star and ours.astimezone(zone).fold == 1:
        # Hour '*' runs in every real hour, the repeated one twice; Celery leaves the
        # first pass for the first wall time after the repeated period.
        assert ours < celery
        return "second pass of a repeated hour"
    return None


def check_against_celery(fields: dict[str, Any], zone_name: str, after: datetime) -> None:
    """Six fire times in turn, each asked of both from the same instant."""
    try:
        crontab(**fields)
    except ValueError:
        assume(False)  # Celery refuses it too: e.g. the 31st of February
    trigger = our_trigger(fields, zone_name)
    zone = ZoneInfo(zone_name)
    star = "*" in trigger.expression.split()[1]
    note(f"{trigger.describe()} in {zone_name}")
    for _ in range(6):
        ours = next_fire_after(trigger, zone, after)
        assert ours is not None
        celery, wall = celery_next(fields, zone_name, after)
        if ours != celery:
            why = celery_dst_difference(zone, after, wall, ours, celery, star)
            assert why is not None, f"after {after}: ours {ours}, Celery's {celery}"
            event(f"DST difference: {why}")
        after = ours


@PROPERTY_SETTINGS
@given(fields=crontab_fields(), zone_and_instant=zones_and_instants())
def test_a_crontab_fires_when_celerys_does(
    fields: dict[str, Any], zone_and_instant: tuple[str, datetime]
) -> None:
    check_against_celery(fields, *zone_and_instant)


# Random day fields rarely select the day of a change of offset: every day here.
ZONES_WITH_DST = [zone for zone in ZONES if zone not in ("UTC", "Asia/Kathmandu")]
DAILY_CRONTABS = st.fixed_dictionaries(
    {"minute": celery_spec(0, 59), "hour": st.one_of(celery_spec(0, 4), st.just("*"))}
)


@PROPERTY_SETTINGS
@given(
    fields=DAILY_CRONTABS,
    zone=st.sampled_from(ZONES_WITH_DST),
    year=st.integers(2000, 2035),
    pick=st.integers(0, 10),
    offset=st.integers(-3 * 3600, 3 * 3600),
)
def test_a_daily_crontab_fires_when_celerys_does_around_changes_of_offset(
    fields: dict[str, Any], zone: str, year: int, pick: int, offset: int
) -> None:
    changes = transitions(zone, year)
    assume(changes)
    check_against_celery(fields, zone, changes[pick % len(changes)] + timedelta(seconds=offset))


def test_the_oracle_tells_either_from_both() -> None:
    """Read with cron's "either" rule, the first-Monday idiom fires on other days, and
    the property test above would say so."""
    either = Cron(expression="0 9 1-7 * 1")
    after = datetime(2025, 1, 1, tzinfo=UTC)
    fields = {"minute": 0, "hour": 9, "day_of_month": "1-7", "day_of_week": "mon"}
    assert next_fire_after(either, ZoneInfo("UTC"), after) != celery_next(fields, "UTC", after)[0]


@pytest.mark.parametrize(
    ("tz", "zone"),
    [
        ("Europe/Berlin", "Europe/Berlin"),
        (":Asia/Tokyo", "Asia/Tokyo"),
        ("/usr/share/zoneinfo/America/New_York", "America/New_York"),
    ],
)
def test_the_hosts_zone_is_named_as_the_c_library_reads_tz(
    monkeypatch: pytest.MonkeyPatch, tz: str, zone: str
) -> None:
    """issue 36, finding 4: the zone of an app on local time is the host's, by name."""
    monkeypatch.setenv("TZ", tz)
    assert code_schedules.host_zone() == zone


def test_a_host_zone_without_an_iana_name_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "CET-1CEST")
    with pytest.raises(ConfigError, match="set the app's timezone"):
        code_schedules.host_zone()
