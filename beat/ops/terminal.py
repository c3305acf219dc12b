"""Text as a terminal may show it: every character a terminal would act on (escape
sequences, bidi overrides, line separators) written as its escape. Everything the CLI
prints goes through it."""

from __future__ import annotations

import unicodedata

#: Unicode categories a terminal acts on rather than shows: controls (C0 with ESC, which
#: starts every escape sequence and OSC 52's clipboard write, DEL, C1), formats (bidi
#: overrides such as U+202E, zero-width characters), lone surrogates, and line and
#: paragraph separators.
_ACTED_ON = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def printable(text: str) -> str:
    """``text`` as a terminal may show it: each character it would act on written as its
    Python escape (``\\x1b``, ``\\n``, ``\\u202e``), the others as they are.
    Applied to its own result it changes nothing (that holds no such character)."""
    if text.isprintable():
        return text
    return "".join(_escaped(char) for char in text)


def _escaped(char: str) -> str:
    return repr(char)[1:-1] if unicodedata.category(char) in _ACTED_ON else char


def terminal_text(text: str) -> str:
    """Text of several lines as a terminal may show it: its line breaks kept (``\\n``,
    the layout), every other character a terminal acts on escaped. The CLI's last
    guard: the values inside were shown through :func:`printable` already."""
    return "\n".join(printable(line) for line in text.split("\n"))
