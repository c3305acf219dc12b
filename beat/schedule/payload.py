"""The args and kwargs a schedule may carry: plain JSON (args an array, kwargs an
object with text keys), at most ``MAX_JSON_DEPTH`` levels deep, ``MAX_PAYLOAD_BYTES``
in all, as the API encodes them.

:func:`check_payload` is applied where schedules are written (the API, so the CLI and
code schedules too); :func:`stored_payload` applies the same limits again where stored
rows are read (the claim, the schedule lists), to the text PostgreSQL gives of the
``jsonb`` columns: a row written with psql (10 MB of kwargs, args nested 1,500 deep,
which Python's ``json`` cannot even read) is quarantined alone and never published,
and the others go on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from beat.errors import InvalidSchedule

#: Largest JSON encoding of a schedule's args and kwargs together (they travel in every message).
MAX_PAYLOAD_BYTES: Final = 64 * 1024
#: Deepest nesting of args and kwargs (the list of args is level 1).
MAX_JSON_DEPTH: Final = 32
#: The most bytes one character of PostgreSQL's text of a ``jsonb`` value takes in the
#: API's encoding (``json.dumps``, ASCII only): an astral character becomes two ``\\u``
#: escapes, 12 bytes. Text shorter than the limit by this factor is within it.
_MOST_BYTES_PER_CHARACTER: Final = 12


def check_payload(
    args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` as they are stored (what JSON gives back: tuples become
    lists); InvalidSchedule naming the first problem."""
    if args is not None and (
        isinstance(args, str | bytes | Mapping) or not isinstance(args, Sequence)
    ):
        raise InvalidSchedule(f"args must be a JSON array, got {type(args).__name__}: {args!r:.80}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InvalidSchedule(
            f"kwargs must be a JSON object, got {type(kwargs).__name__}: {kwargs!r:.80}"
        )
    payload_args, payload_kwargs = list(args or ()), dict(kwargs or {})
    if any(not isinstance(key, str) for key in payload_kwargs):
        raise InvalidSchedule("kwargs keys must be strings")
    _check_json_tree([payload_args, payload_kwargs])
    try:
        encoded = json.dumps([payload_args, payload_kwargs], allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidSchedule(
            f"args and kwargs must be plain JSON (numbers, strings, lists, objects): {exc}"
        ) from exc
    _check_size(len(encoded.encode()))
    # Round-trip, so what is stored is exactly what JSON gives back (tuples become lists).
    decoded_args, decoded_kwargs = json.loads(encoded)
    return tuple(decoded_args), decoded_kwargs


def stored_payload(args_text: str, kwargs_text: str) -> tuple[list[Any], dict[str, Any]]:
    """The args and kwargs of a stored row, from PostgreSQL's text of its ``jsonb``
    columns, if the API would take them; InvalidSchedule naming the first problem.

    Text PostgreSQL stores is valid JSON of valid UTF-8 without NUL, so only the
    shape, the depth and the size are checked, each cheaply when it obviously holds
    (the claim reads every due row: thousands in a burst)."""
    args, kwargs = decoded_json(args_text, "args"), decoded_json(kwargs_text, "kwargs")
    if not isinstance(args, list):
        raise InvalidSchedule(f"args must be a JSON array, got {args_text:.80}")
    if not isinstance(kwargs, dict):
        raise InvalidSchedule(f"kwargs must be a JSON object, got {kwargs_text:.80}")
    # A level is an opening bracket: with no more brackets than levels allowed (strings
    # may hold some too), no value can be too deep.
    if sum(text.count("[") + text.count("{") for text in (args_text, kwargs_text)) > (
        MAX_JSON_DEPTH
    ):
        _check_json_tree([args, kwargs])
    if (len(args_text) + len(kwargs_text) + 3) * _MOST_BYTES_PER_CHARACTER > MAX_PAYLOAD_BYTES:
        _check_size(len(json.dumps([args, kwargs], separators=(",", ":")).encode()))
    return args, kwargs


def decoded_json(text: str, what: str) -> Any:
    """The value of PostgreSQL's text of a ``jsonb`` column; InvalidSchedule if Python's
    ``json`` cannot read it (nested too deep)."""
    try:
        return json_loads(text)
    except RecursionError:
        raise InvalidSchedule(
            f"{what} is nested more than {MAX_JSON_DEPTH} levels deep (more than Python's"
            " json reads): pass flatter data, or a reference (an ID) to it"
        ) from None
    except ValueError as exc:
        raise InvalidSchedule(f"{what} is not JSON ({exc}): {text:.80}") from None


def _check_size(size: int) -> None:
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidSchedule(
            f"args and kwargs take {size} bytes as JSON, over the {MAX_PAYLOAD_BYTES}-byte limit:"
            " pass a reference (an ID, a URL) instead of the data"
        )


def _check_json_tree(payload: list[Any]) -> None:
    """At most ``MAX_JSON_DEPTH`` levels (``json`` would raise RecursionError on a deep
    one, and a self-containing list has no end), and text that PostgreSQL stores: UTF-8
    without NUL. Walked without recursion."""
    pending: list[tuple[object, int]] = [(part, 1) for part in payload]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, str):
            _check_text(value)
            continue
        if isinstance(value, Mapping):
            children: list[object] = [*value.keys(), *value.values()]
        elif isinstance(value, list | tuple):
            children = list(value)
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            raise InvalidSchedule(
                f"args and kwargs are nested more than {MAX_JSON_DEPTH} levels deep:"
                " pass flatter data, or a reference (an ID) to it"
            )
        pending.extend((child, depth + 1) for child in children)


def _check_text(value: str) -> None:
    if "\x00" in value:
        raise InvalidSchedule(
            f"args and kwargs hold a NUL character (in {value!r:.60}), which PostgreSQL"
            " cannot store: remove it"
        )
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidSchedule(
            f"args and kwargs hold text that is not UTF-8 (a lone surrogate, in {value!r:.60}):"
            " fix its encoding"
        ) from None


_decode_json = json.JSONDecoder().raw_decode


def json_loads(data: str | bytes) -> Any:
    """``json.loads`` for the JSON PostgreSQL sends, a quarter of its cost: a claim reads
    a schedule's arguments, keyword arguments and options for each run. PostgreSQL
    writes no whitespace around a document, so the decoder is called directly; a
    document it does not end (anything else) goes through ``json.loads``, with its
    errors."""
    text = data.decode() if isinstance(data, bytes) else data
    try:
        value, end = _decode_json(text)
    except ValueError:
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value
