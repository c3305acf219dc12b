"""``schedules channels``: where the leader sends what happens to incidents (add a
webhook, a Slack incoming webhook or an email channel; list; remove)."""

from __future__ import annotations

import click
from celery.bin.base import CeleryCommand

from beat.cli.group import SchedulesGroup, _schedules, schedules
from beat.cli.options import _json_option
from beat.cli.output import _echo_json, _errors_as_exit_codes, _fail, _say, _show
from beat.models import Channel
from beat.ops import rendering
from beat.ops.incident_rendering import channel_document, channel_state_text


@schedules.group(cls=SchedulesGroup)
def channels() -> None:
    """Where incidents are notified: every channel gets every incident's notifications
    (opened, schedule paused, resolved), at least once, each with its ID."""


@channels.command(cls=CeleryCommand)
@click.argument("name")
@click.option("--webhook", "webhook", metavar="URL", help="POST each notification's JSON here")
@click.option("--slack", "slack", metavar="URL", help="a Slack incoming webhook's URL")
@click.option(
    "--email",
    "email",
    metavar="SMTP_URL",
    help="mail through this SMTP server: smtp://host:587 (?starttls=true), smtps://user:pw@host",
)
@click.option("--from", "sender", metavar="ADDRESS", help="the sender of the emails")
@click.option("--to", "to", metavar="ADDRESS", multiple=True, help="a recipient (repeatable)")
@_json_option
@click.pass_context
def add(
    ctx: click.Context,
    /,
    name: str,
    webhook: str | None,
    slack: str | None,
    email: str | None,
    sender: str | None,
    to: tuple[str, ...],
    as_json: bool,
) -> None:
    """Add channel NAME: one of --webhook, --slack or --email (with --from and --to)."""
    given = [option for option, value in (("--webhook", webhook), ("--slack", slack),
                                          ("--email", email)) if value]  # fmt: skip
    if len(given) != 1:
        _fail("give one of --webhook URL, --slack URL or --email SMTP_URL", 2)
    if email is None and (sender or to):
        _fail("--from and --to go with --email", 2)
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        if webhook:
            channel = manager.add_webhook(name, webhook)
        elif slack:
            channel = manager.add_slack(name, slack)
        else:
            assert email is not None
            channel = manager.add_email(name, email, sender=sender or "", to=to)
    if as_json:
        _echo_json(channel_document(channel))
        return
    _say(f"added channel {channel.name} ({channel.kind.value})")


@channels.command(name="list", cls=CeleryCommand)
@_json_option
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """The channels, by name (passwords in their targets hidden)."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        found = manager.channels()
    if as_json:
        _echo_json([channel_document(channel) for channel in found])
        return
    if not found:
        _say("no channels: incidents are not notified (add one with `schedules channels add`)")
        return
    columns = ("NAME", "KIND", "TARGET", "STATE")
    _show(rendering.table(columns, [_row(channel) for channel in found]))


@channels.command(cls=CeleryCommand)
@click.argument("name")
@click.pass_context
def remove(ctx: click.Context, name: str) -> None:
    """Remove channel NAME, and its notifications not sent yet."""
    manager = _schedules(ctx)
    with _errors_as_exit_codes():
        manager.remove_channel(name)
    _say(f"removed channel {name}")


def _row(channel: Channel) -> tuple[str, str, str, str]:
    document = channel_document(channel)
    return (channel.name, channel.kind.value, document["target"], channel_state_text(channel))
