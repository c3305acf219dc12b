"""How a setting's text is read and its value checked: the parsers of environment
variables' text and the checks of values (from ``app.conf`` or a variable) that the
settings table (``beat.config``) declares for each setting."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TypeVar

from beat.limits import MAX_FAILURE_THRESHOLD

T = TypeVar("T")
#: Turns an environment variable's text into a setting's value, or raises ``Refused``.
Parser = Callable[[str], T]
#: Says why a setting's value is refused (what to set instead), or None if it is fine.
Check = Callable[[T], str | None]


class Refused(ValueError):
    """A parser's refusal: the text that follows ``VARIABLE='text'`` in the error."""


# -- parsers: the text of an environment variable, as the setting's type --------------


def parse_text(raw: str) -> str:
    """A string setting takes the variable's text as it is."""
    return raw


def parse_number(raw: str) -> float:
    """A number (durations are seconds)."""
    try:
        return float(raw)
    except ValueError:
        raise Refused("is not a number: set it to a number") from None


def parse_whole_number(raw: str) -> int:
    """A count: a number without a fractional part (``1e3`` and ``5.0`` are fine)."""
    value = parse_number(raw)
    if not value.is_integer():
        raise Refused("must be a whole number")
    return int(value)


#: The words a switch takes, in an environment variable.
SWITCH_WORDS = {"true": True, "on": True, "yes": True, "1": True}
SWITCH_WORDS |= {"false": False, "off": False, "no": False, "0": False}


def parse_switch(raw: str) -> bool:
    """On or off: ``true``/``false`` (or ``on``/``off``, ``yes``/``no``, ``1``/``0``)."""
    try:
        return SWITCH_WORDS[raw.strip().lower()]
    except KeyError:
        raise Refused("must be true or false") from None


#: What a port setting must be, said by its parser and by its check.
PORT_REFUSAL = "must be a TCP port from 1 to 65535, or 0 or unset for none"


def parse_port(raw: str) -> int | None:
    """A TCP port; 0 means none (the range is the check's: app.conf is checked too)."""
    try:
        value = parse_whole_number(raw)
    except Refused:
        raise Refused(PORT_REFUSAL) from None
    return value or None


# -- checks: why a value is refused, whichever source it came from ---------------------


def a_switch(value: bool) -> str | None:
    """app.conf's value as it is: the text ``"false"`` would read as on."""
    return None if isinstance(value, bool) else "must be True or False"


def at_least(low: float, unit: str = "") -> Check[float]:
    reason = f"must be at least {low:g}{unit}"
    return lambda value: reason if value < low else None


def failure_threshold(value: float) -> str | None:
    if not 0 <= value <= MAX_FAILURE_THRESHOLD:
        return f"must be from 0 (never) to {MAX_FAILURE_THRESHOLD} failures in a row"
    return None


def positive(value: float) -> str | None:
    return "must be positive" if value <= 0 else None


def not_empty(value: str) -> str | None:
    return "must not be empty" if not value else None


def one_of(kind: type[Enum]) -> Check[str]:
    choices = [member.value for member in kind]
    reason = "use one of " + ", ".join(choices)
    return lambda value: reason if value not in choices else None


def tcp_port(value: int | None) -> str | None:
    return PORT_REFUSAL if value is not None and not 0 <= value <= 65535 else None


def claim_window(value: float) -> str | None:
    return "use 0 (off) to 30 seconds" if not 0 <= value <= 30 else None


def kept_messages(value: int) -> str | None:
    return "must be 0 (keep none) or more" if value < 0 else None
