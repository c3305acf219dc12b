"""Envelopes cut at their per-run values (``beat.publish.redis_envelopes``): a stamp rendered
with any values is the document kombu's JSON encoder writes with those values in it."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kombu.utils import json as kombu_json

from beat.publish.redis_envelopes import Path, Stamp, cut, encode

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
#: What a run stamps: strings (IDs, reprs, times), integers (retries, attempt), None.
stamped_values = st.one_of(st.none(), st.integers(-(2**70), 2**70), st.text())
keys = st.text(min_size=1, max_size=12)
sections = st.dictionaries(keys, scalars, min_size=1, max_size=8)


@st.composite
def envelopes_and_paths(draw: st.DrawFn) -> tuple[dict[str, Any], list[Path]]:
    """An envelope laid out as kombu's (top-level fields, headers, properties) and some
    of its fields to stamp."""
    envelope: dict[str, Any] = {
        "body": draw(st.text()),
        "content-encoding": "utf-8",
        "headers": draw(sections),
        "properties": draw(sections),
    }
    candidates: list[Path] = [("body",), ("content-encoding",)]
    candidates += [("headers", name) for name in envelope["headers"]]
    candidates += [("properties", name) for name in envelope["properties"]]
    paths = draw(st.lists(st.sampled_from(candidates), min_size=1, unique=True))
    return envelope, paths


def with_values(envelope: dict[str, Any], values: dict[Path, Any]) -> dict[str, Any]:
    copied = json.loads(json.dumps(envelope))
    for path, value in values.items():
        holder = copied
        for name in path[:-1]:
            holder = holder[name]
        holder[path[-1]] = value
    return copied


@given(envelopes_and_paths(), st.data())
def test_a_stamp_renders_what_kombu_encodes_with_the_values_in_place(
    drawn: tuple[dict[str, Any], list[Path]], data: st.DataObject
) -> None:
    envelope, paths = drawn
    stamp = cut(kombu_json.dumps(envelope), paths)
    assert stamp is not None
    values = {path: data.draw(stamped_values) for path in paths}

    assert stamp.render(values) == kombu_json.dumps(with_values(envelope, values))


@given(stamped_values)
def test_a_value_is_encoded_as_kombu_encodes_it(value: Any) -> None:
    assert encode(value) == kombu_json.dumps(value)


def test_a_stamp_renders_nothing_for_values_not_exactly_its_own() -> None:
    envelope = {"body": "b", "headers": {"id": "x"}, "properties": {"delivery_tag": "t"}}
    stamp = cut(kombu_json.dumps(envelope), [("body",), ("headers", "id")])
    assert isinstance(stamp, Stamp)

    assert stamp.render({("body",): "c"}) is None
    assert stamp.render({("body",): "c", ("headers", "other"): "y"}) is None
    assert stamp.render({("body",): "c", ("headers", "id"): "y", ("x",): 1}) is None
    assert stamp.render({("body",): "c", ("headers", "id"): "y"}) == kombu_json.dumps(
        {"body": "c", "headers": {"id": "y"}, "properties": {"delivery_tag": "t"}}
    )


def test_no_stamp_for_a_field_the_envelope_lacks_or_a_document_that_is_not_json() -> None:
    document = kombu_json.dumps({"body": "b", "headers": {"id": "x"}})
    assert cut(document, [("headers", "missing")]) is None
    assert cut(document, [("properties", "delivery_tag")]) is None
    assert cut(document, [("body", "inside")]) is None
    assert cut("not json", [("body",)]) is None
