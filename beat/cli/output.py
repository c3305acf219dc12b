"""What reaches the terminal: one line, a rendered text or a JSON document, each escaped,
and an error as one line on stderr with its exit code."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click

from beat.errors import (
    ChannelNotFound,
    ConfigError,
    HABeatError,
    InvalidChannel,
    InvalidSchedule,
    ScheduleExists,
    ScheduleNotFound,
)
from beat.ops import terminal

#: Errors that mean "your input is wrong" (exit 2); every other error exits 1.
INPUT_ERRORS = (
    InvalidSchedule,
    ScheduleExists,
    ScheduleNotFound,
    ConfigError,
    InvalidChannel,
    ChannelNotFound,
)


def _say(line: str, *, err: bool = False) -> None:
    """Print one line: whatever it quotes (a name, an error from a worker or a driver)
    is escaped, line breaks too, so it stays one line and runs nothing on the terminal."""
    click.echo(terminal.printable(line), err=err)


def _show(text: str) -> None:
    """Print text of several lines made by :mod:`beat.ops.rendering` (or a JSON document):
    its lines kept, any character a terminal acts on escaped."""
    click.echo(terminal.terminal_text(text))


def _fail(message: str, code: int) -> NoReturn:
    _say(f"Error: {message}", err=True)
    sys.exit(code)


@contextmanager
def _errors_as_exit_codes() -> Iterator[None]:
    try:
        yield
    except INPUT_ERRORS as exc:
        _fail(str(exc), 2)
    except HABeatError as exc:
        _fail(str(exc), 1)


def _echo_json(document: Any) -> None:
    _show(json.dumps(document, indent=2))
