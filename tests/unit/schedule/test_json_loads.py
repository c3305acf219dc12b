"""``beat.schedule.payload.json_loads`` against ``json.loads``, the oracle: the same value for every
document, the same error for every text that is not one."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from beat.schedule.payload import json_loads

documents = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def outcome(loads: Any, text: str | bytes) -> Any:
    try:
        return ("value", loads(text))
    except ValueError as exc:
        return ("error", type(exc), str(exc))


@given(documents, st.sampled_from([None, (",", ":"), (", ", ": ")]), st.booleans())
def test_a_document_reads_as_json_loads_reads_it(
    value: Any, separators: tuple[str, str] | None, as_bytes: bool
) -> None:
    text = json.dumps(value, separators=separators, ensure_ascii=False)
    raw = text.encode() if as_bytes else text
    assert outcome(json_loads, raw) == outcome(json.loads, raw)


@given(st.text(alphabet=' \t\n{}[]",:0123456789.eE+-truefalsn\\', max_size=20))
def test_any_text_reads_or_fails_as_json_loads_does(text: str) -> None:
    assert outcome(json_loads, text) == outcome(json.loads, text)
    assert outcome(json_loads, text.encode()) == outcome(json.loads, text.encode())


def test_whitespace_around_a_document_is_read_as_json_loads_reads_it() -> None:
    for text in (' {"a": 1}', "[1] ", "\n[]\n", "[1] x", ""):
        assert outcome(json_loads, text) == outcome(json.loads, text)
