"""``schedules tokens``: the API tokens of the write API (create, with a role; list;
revoke). A token is printed once, when it is made: only its hash is kept."""

from __future__ import annotations

import click
from celery.bin.base import CeleryCommand

from beat.cli.group import SchedulesGroup, _schedules, schedules
from beat.cli.options import _json_option
from beat.cli.output import _echo_json, _errors_as_exit_codes, _say, _show
from beat.models import Role
from beat.ops import rendering


@schedules.group(cls=SchedulesGroup)
def tokens() -> None:
    """Tokens of the write API (``Authorization: Bearer TOKEN``), each with a role:
    viewer (read), operator (and pause, resume, trigger, backfill), admin (and
    create, edit, restore, delete)."""


@tokens.command(cls=CeleryCommand)
@click.argument("name")
@click.option(
    "--role",
    type=click.Choice([role.value for role in Role]),
    required=True,
    help="what the token may do",
)
@_json_option
@click.pass_context
def create(ctx: click.Context, /, name: str, role: str, as_json: bool) -> None:
    """Make token NAME (the name the audit log shows): it is printed this once."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        token = manager.create_token(name, Role(role))
    if as_json:
        _echo_json({"name": name, "role": role, "token": token})
        return
    _say(token)
    _say(f"token {name} ({role}): shown this once; keep it in your secret store", err=True)


@tokens.command(name="list", cls=CeleryCommand)
@_json_option
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """Every token, revoked ones too, with its role and when it was last used."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        found = manager.tokens()
    documents = [
        {
            "name": token.name,
            "role": token.role.value,
            "created_at": rendering.iso(token.created_at),
            "created_by": token.created_by,
            "revoked_at": rendering.iso(token.revoked_at),
            "last_used_at": rendering.iso(token.last_used_at),
        }
        for token in found
    ]
    if as_json:
        _echo_json(documents)
        return
    if not found:
        _say("no tokens: `celery -A app schedules tokens create NAME --role operator`")
        return
    rows = [
        (
            token.name,
            token.role.value,
            rendering.time_text(token.created_at),
            token.created_by,
            "-" if token.last_used_at is None else rendering.time_text(token.last_used_at),
            "revoked " + rendering.time_text(token.revoked_at) if token.revoked_at else "active",
        )
        for token in found
    ]
    _show(rendering.table(("NAME", "ROLE", "CREATED (UTC)", "BY", "LAST USED", "STATE"), rows))


@tokens.command(cls=CeleryCommand)
@click.argument("name")
@_json_option
@click.pass_context
def revoke(ctx: click.Context, name: str, as_json: bool) -> None:
    """Revoke token NAME: its next request is refused (its name stays taken)."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        manager.revoke_token(name)
    if as_json:
        _echo_json({"revoked": name})
        return
    _say(f"revoked {name}")
