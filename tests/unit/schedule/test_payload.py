"""The limits on args and kwargs hold alike where schedules are written
(``check_payload``) and where stored rows are read (``stored_payload``, from
PostgreSQL's text of the ``jsonb`` columns): a row the API took is never quarantined,
and a row it would refuse never fires. Issue 29, finding 6."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beat.errors import InvalidSchedule
from beat.schedule.payload import MAX_JSON_DEPTH, MAX_PAYLOAD_BYTES, check_payload, stored_payload

# Text of every plane: an astral character takes 12 bytes in the API's encoding.
TEXT = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"))
SCALARS = st.none() | st.booleans() | st.integers() | TEXT
JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=40,
)


def postgres_text(value: Any) -> str:
    """How PostgreSQL writes a ``jsonb`` value: ``", "`` and ``": "``, characters kept."""
    return json.dumps(value, ensure_ascii=False)


def refusal(check: Any, *arguments: Any) -> str | None:
    try:
        check(*arguments)
    except InvalidSchedule as exc:
        return str(exc).split(":")[0]
    return None


@settings(max_examples=300, deadline=None)
@given(args=st.lists(JSON, max_size=6), kwargs=st.dictionaries(TEXT, JSON, max_size=6))
def test_a_stored_payload_is_refused_exactly_when_the_api_refuses_it(
    args: list[Any], kwargs: dict[str, Any]
) -> None:
    written = refusal(check_payload, args, kwargs)
    read = refusal(stored_payload, postgres_text(args), postgres_text(kwargs))
    assert read == written


@pytest.mark.parametrize("character", ["x", "é", "😀"])
def test_the_size_limit_holds_at_its_byte_whatever_the_characters(character: str) -> None:
    escaped = len(json.dumps(character)) - 2  # the bytes one takes in the API's encoding
    within = (MAX_PAYLOAD_BYTES - len('[[""],{}]')) // escaped  # the most that fit
    args = [character * within]
    assert stored_payload(postgres_text(args), "{}")[0] == args
    with pytest.raises(InvalidSchedule, match="over the 65536-byte limit"):
        stored_payload(postgres_text([character * (within + 1)]), "{}")


def test_a_stored_payload_nested_past_the_limit_or_pythons_json_is_refused() -> None:
    def nested(depth: int) -> str:
        return "[" * depth + "]" * depth

    assert stored_payload(nested(MAX_JSON_DEPTH), "{}")
    with pytest.raises(InvalidSchedule, match="nested more than 32 levels"):
        stored_payload(nested(MAX_JSON_DEPTH + 1), "{}")
    with pytest.raises(InvalidSchedule, match="nested more than 32 levels"):
        stored_payload(nested(5000), "{}")  # json.loads raises RecursionError


def test_stored_args_that_are_no_array_or_kwargs_no_object_are_refused() -> None:
    with pytest.raises(InvalidSchedule, match="args must be a JSON array"):
        stored_payload('{"a": 1}', "{}")
    with pytest.raises(InvalidSchedule, match="kwargs must be a JSON object"):
        stored_payload("[]", "[1]")
