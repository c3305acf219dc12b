"""A REST body read as the Python API's keyword arguments: types checked per field,
times and durations read as the CLI reads them, exactly one timing, a PUT's resets."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from beat.ui.rest_input import (
    FIELDS,
    PUT_RESETS,
    BodyProblem,
    change_arguments,
    creation_arguments,
    replacement_arguments,
)


def test_a_create_body_becomes_the_python_api_s_arguments() -> None:
    body = {
        "name": "nightly",
        "task": "tasks.report",
        "every": "1h30m",
        "start_at": "2027-01-31T09:00",
        "tz": "Europe/Berlin",
        "jitter": 5,
    }
    name, task, fields = creation_arguments(body, "UTC")
    assert (name, task) == ("nightly", "tasks.report")
    assert fields["every"] == 5400.0
    assert fields["jitter"] == 5.0
    assert fields["start_at"] == datetime(2027, 1, 31, 8, 0, tzinfo=UTC), "read in its zone"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"task": "t", "cron": "* * * * *"}, "name"),
        ({"name": "n", "cron": "* * * * *"}, "task"),
        ({"name": "n", "task": "t"}, "cron"),
        ({"name": "n", "task": "t", "cron": "* * * * *", "every": 60}, "every"),
        ({"name": "n", "task": "t", "cron": 5}, "cron"),
        ({"name": "n", "task": "t", "cron": "* * * * *", "max_attempts": True}, "max_attempts"),
        ({"name": "n", "task": "t", "cron": "* * * * *", "args": "[]"}, "args"),
        ({"name": "n", "task": "t", "cron": "* * * * *", "every": None}, "every"),
        ({"name": "n", "task": "t", "cron": "* * * * *", "enabled": None}, "enabled"),
        ({"name": "n", "task": "t", "at": "soon"}, "at"),
        ({"name": "n", "task": "t", "every": "often"}, "every"),
        ({"name": "n", "task": "t", "cron": "* * * * *", "sneaky": 1}, "sneaky"),
    ],
)
def test_a_bad_field_is_named(body: dict[str, Any], field: str) -> None:
    with pytest.raises(BodyProblem) as refused:
        creation_arguments(body, "UTC")
    assert refused.value.field == field


def test_a_put_gives_every_field_it_leaves_out_its_default_and_renames_nothing() -> None:
    given_fields = {"task": "t", "cron": "0 3 * * *", "max_attempts": 5}
    changes = replacement_arguments(given_fields, "nightly", "UTC", {"misfire_policy": "skip"})
    assert changes["max_attempts"] == 5
    assert changes["args"] == []
    assert changes["channels"] is None
    assert changes["misfire_policy"] == "skip", "the cluster's default"
    assert set(PUT_RESETS) <= set(changes)
    with pytest.raises(BodyProblem, match="cannot rename"):
        replacement_arguments(given_fields | {"name": "other"}, "nightly", "UTC", {})


def test_a_patch_changes_only_what_it_gives() -> None:
    assert change_arguments({"max_attempts": 2}, "nightly", "UTC") == {"max_attempts": 2}
    with pytest.raises(BodyProblem, match="changes nothing"):
        change_arguments({}, "nightly", "UTC")


@given(
    st.dictionaries(
        st.sampled_from(sorted(FIELDS)),
        st.none()
        | st.booleans()
        | st.integers()
        | st.text(max_size=5)
        | st.lists(st.integers(), max_size=2),
    )
)
def test_any_body_is_read_or_refused_naming_a_field_of_it_never_anything_else(
    body: dict[str, Any],
) -> None:
    problem = None
    try:
        creation_arguments(body, "UTC")
    except BodyProblem as refused:
        problem = refused
    assert problem is None or problem.field in {"", *FIELDS}
