"""``schedules ui``: serve the schedules UI (``beat.ui``, imported only by this
command: the others, run in every ``celery`` command's process, need no web server)."""

from __future__ import annotations

import re

import click

from beat.cli.group import _command, _schedules
from beat.cli.output import _errors_as_exit_codes, _fail, _say
from beat.errors import ConfigError
from beat.store.db import masked_url


@_command()
@click.option(
    "--address",
    default="127.0.0.1",
    envvar="HABEAT_UI_ADDRESS",
    show_default=True,
    help="address to listen on; other than loopback needs --basic-auth",
)
@click.option(
    "--port",
    type=click.IntRange(min=1, max=65535),
    default=5556,
    envvar="HABEAT_UI_PORT",
    show_default=True,
    help="port to listen on (Flower's is 5555)",
)
@click.option(
    "--basic-auth",
    envvar="HABEAT_UI_BASIC_AUTH",
    help="user:password pairs separated by commas, as Flower's, each may end in :viewer,"
    " :operator or :admin (the default) (HABEAT_UI_BASIC_AUTH)",
)
@click.option(
    "--read-only",
    is_flag=True,
    envvar="HABEAT_UI_READ_ONLY",
    help="show everything, change nothing",
)
@click.option(
    "--flower-url",
    envvar="HABEAT_UI_FLOWER_URL",
    help="Flower's address, e.g. http://localhost:5555: each run links to its task page",
)
@click.pass_context
def ui(
    ctx: click.Context,
    address: str,
    port: int,
    basic_auth: str | None,
    read_only: bool,
    flower_url: str | None,
) -> None:
    """Serve the schedules UI: schedules, runs, the cluster and plots, in a browser."""
    from beat.ui.security import check_exposure, parse_roles
    from beat.ui.server import UISettings, registered_tasks, serve

    with _errors_as_exit_codes():
        users = _users(basic_auth)
        roles = parse_roles(basic_auth)
        check_exposure(address, users)  # before connecting: nothing is served on a bad setup
        _check_flower_url(flower_url)
    manager = _schedules(ctx)
    settings = UISettings(
        address=address,
        port=port,
        users=users,
        roles=roles,
        read_only=read_only,
        flower_url=flower_url,
    )
    try:
        serve(
            manager,
            settings,
            task_names=registered_tasks(ctx.obj.app),
            ready=lambda line: _say(line, err=True),
        )
    except OSError as exc:
        _fail(f"cannot listen on {address}:{port} ({exc.strerror}): choose another --port", 1)


def _users(basic_auth: str | None) -> dict[str, str]:
    """The users of ``--basic-auth``; a malformed value is refused without a word of it:
    whatever part of it is quoted may be a password."""
    from beat.ui.security import parse_users

    try:
        return parse_users(basic_auth)
    except ConfigError:
        raise ConfigError(
            "--basic-auth (HABEAT_UI_BASIC_AUTH) takes user:password pairs separated by"
            " commas, each with a user and a password (the value is not shown: it holds"
            " passwords): give e.g. admin:s3cret"
        ) from None


def _check_flower_url(url: str | None) -> None:
    if url is not None and not re.match(r"^https?://[^\s/]+", url):
        raise ConfigError(
            f"--flower-url {masked_url(url)!r:.80} is not an http(s) address:"
            " give e.g. http://localhost:5555"
        )
