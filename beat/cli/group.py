"""The ``schedules`` command group: usage errors on one line, arguments that must be
UTF-8, the decorator that adds a command to the group, and the schedules of the app
that each command opens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

import click
from celery.bin.base import CeleryCommand

from beat.cli.output import _errors_as_exit_codes
from beat.models import ChangeEntry
from beat.ops import terminal
from beat.ops.schedules import Schedules


class OneLineUsageError(click.ClickException):
    """A usage error printed as the one ``Error:`` line docs/reference/cli.md promises (click's own
    takes four: usage, a hint, a blank line, the error)."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"Error: {terminal.printable(self.format_message())}", file=file, err=True)


@contextmanager
def _usage_errors_on_one_line() -> Iterator[None]:
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise  # `schedules` alone: the help is what was asked for
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "schedules"
        raise OneLineUsageError(f"{exc.format_message()} (see `{where} --help`)") from None


def _check_utf8(args: list[str]) -> None:
    """Refuse an argument that is not UTF-8 (Python reads each byte it cannot decode as a
    lone surrogate, which no database, page or terminal can take). Its place is named,
    not its text: it may be a password."""
    for place, arg in enumerate(args, start=1):
        if not _is_utf8(arg):
            raise OneLineUsageError(
                f"argument {place} of `schedules` is not UTF-8 text (a byte the locale"
                " could not read): give it in UTF-8"
            )


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class SchedulesGroup(click.Group):
    """The ``schedules`` group: its usage errors, and those of every sub-command (their
    arguments are parsed while the group is invoked), are one line with exit code 2;
    an argument that is not UTF-8 is one of them."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        _check_utf8(args)
        with _usage_errors_on_one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _usage_errors_on_one_line():
            return super().invoke(ctx)


@click.group(cls=SchedulesGroup)
@click.pass_context
def schedules(ctx: click.Context) -> None:
    """Operate the highly-available beat: schedules (in PostgreSQL), runs, leader, health."""


def _command(**kwargs: Any) -> Callable[[Callable[..., Any]], click.Command]:
    return schedules.command(cls=CeleryCommand, **kwargs)


def _schedules(ctx: click.Context, *, check_schema: bool = True) -> Schedules:
    """The schedules of the app; refuses (exit 1) a database whose schema is not current.

    The store's connections are closed when the command ends.
    """
    with _errors_as_exit_codes():
        manager = Schedules.for_app(ctx.obj.app).acting_as(ChangeEntry.CLI)
        ctx.call_on_close(manager.close)
        if check_schema:
            manager.check_schema()
        return manager
