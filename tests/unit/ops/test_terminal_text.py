"""``beat.ops.terminal.printable``, through which the CLI prints everything: nothing a
terminal acts on survives it, printable text passes unchanged, and a table keeps one
line a row whatever its cells hold (issue 29, finding 7)."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from beat.ops.rendering import table
from beat.ops.terminal import printable, terminal_text

ACTED_ON = {"Cc", "Cf", "Cs", "Zl", "Zp"}
any_text = st.text(st.characters(codec=None, exclude_categories=()))


def acted_on(text: str) -> set[str]:
    return {char for char in text if unicodedata.category(char) in ACTED_ON}


@given(any_text)
def test_nothing_a_terminal_acts_on_survives(text: str) -> None:
    shown = printable(text)
    assert acted_on(shown) == set()
    assert printable(shown) == shown


@given(st.text(st.characters(exclude_categories=("Cc", "Cf", "Cs", "Zl", "Zp"))))
def test_text_a_terminal_shows_passes_unchanged(text: str) -> None:
    assert printable(text) == text


def test_escapes_read_as_python_writes_them() -> None:
    assert printable("a\x1b]52;c;eA==\x07b\n\u202e\x9b\x7f\udcff") == (
        "a\\x1b]52;c;eA==\\x07b\\n\\u202e\\x9b\\x7f\\udcff"
    )


@given(st.lists(st.tuples(any_text, any_text), max_size=5))
def test_a_table_keeps_one_line_a_row(rows: list[tuple[str, str]]) -> None:
    shown = terminal_text(table(("A", "B"), rows))
    assert acted_on(shown.replace("\n", "")) == set()
    assert len(shown.split("\n")) == 1 + len(rows)
