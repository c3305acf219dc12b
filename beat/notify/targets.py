"""A channel's target, checked before it is written: an http(s) URL for a webhook or a
Slack incoming webhook; for email, an SMTP server's URL (``smtp://`` or ``smtps://``,
with a user and password if it wants them) with the sender and the recipients in its
query (``?from=scheduler@example.com&to=ops@example.com``). Each refusal is one line
naming the fix."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from beat.errors import InvalidChannel
from beat.limits import CHANNEL_NAME, MAX_CHANNEL_NAME_LENGTH
from beat.models import ChannelKind

#: Longest channel target.
MAX_TARGET_LENGTH = 2000
#: An address as SMTP takes it: something@domain, no spaces or angle brackets.
_ADDRESS = re.compile(r"[^@\s<>,;]+@[^@\s<>,;]+")
SMTP_SCHEMES = {"smtp": 25, "smtps": 465}


@dataclass(frozen=True, kw_only=True, slots=True)
class SmtpTarget:
    host: str
    port: int
    #: Implicit TLS (smtps), or STARTTLS asked for (``starttls=true``).
    tls: bool
    starttls: bool
    username: str | None
    password: str | None
    sender: str
    recipients: tuple[str, ...]


def check_channel(name: str, kind: ChannelKind, target: str) -> None:
    """Refuse a channel that cannot be used, naming the fix (InvalidChannel)."""
    if any(character.isspace() or not character.isprintable() for character in target):
        raise InvalidChannel(
            f"the target of {name:.100} holds a space or a control character: percent-encode"
            " it (%20)"
        )
    if not CHANNEL_NAME.fullmatch(name) or len(name) > MAX_CHANNEL_NAME_LENGTH:
        raise InvalidChannel(
            f"channel name {name!r:.120}: use letters, digits, '.', '_' and '-' (at most"
            f" {MAX_CHANNEL_NAME_LENGTH}), starting with a letter or digit"
        )
    if len(target) > MAX_TARGET_LENGTH:
        raise InvalidChannel(f"the target of {name} is over {MAX_TARGET_LENGTH} characters")
    if kind is ChannelKind.EMAIL:
        smtp_target(target)
    else:
        http_target(target, kind)


def http_target(url: str, kind: ChannelKind) -> str:
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise InvalidChannel(
            f"a {kind.value} channel posts to an http(s) URL, got {_shown(url)}:"
            " give one such as https://hooks.example.com/habeat"
        )
    _port(url)
    return url


def smtp_target(url: str) -> SmtpTarget:
    """The SMTP server, sender and recipients of an email channel's target."""
    parts = urlsplit(url)
    if parts.scheme not in SMTP_SCHEMES or not parts.hostname:
        raise InvalidChannel(
            f"an email channel sends through an smtp:// or smtps:// URL, got {_shown(url)}:"
            " give one such as smtp://mail.example.com:587?from=a@example.com&to=b@example.com"
        )
    query = parse_qs(parts.query)
    senders = query.get("from", [])
    recipients = tuple(address for value in query.get("to", []) for address in value.split(","))
    if len(senders) != 1 or not _ADDRESS.fullmatch(senders[0]):
        raise InvalidChannel("an email channel needs one sender address (--from a@example.com)")
    if not recipients or not all(_ADDRESS.fullmatch(address) for address in recipients):
        raise InvalidChannel(
            "an email channel needs recipient addresses (--to ops@example.com, repeatable)"
        )
    tls = parts.scheme == "smtps"
    starttls = _starttls(query.get("starttls", ["false"]))
    if tls and starttls:
        raise InvalidChannel(
            "smtps:// is TLS from the start: leave starttls out, or use smtp:// with it"
        )
    if parts.username and not (tls or starttls):
        raise InvalidChannel(
            "a login over smtp:// would send the password in clear: use smtps://, or add"
            " ?starttls=true"
        )
    return SmtpTarget(
        host=parts.hostname,
        port=_port(url) or SMTP_SCHEMES[parts.scheme],
        tls=tls,
        starttls=starttls,
        username=None if parts.username is None else unquote(parts.username),
        password=None if parts.password is None else unquote(parts.password),
        sender=senders[0],
        recipients=recipients,
    )


def _starttls(values: list[str]) -> bool:
    if len(values) != 1 or values[0].lower() not in {"true", "false"}:
        raise InvalidChannel("starttls takes true or false (?starttls=true)")
    return values[0].lower() == "true"


def _port(url: str) -> int | None:
    """The URL's port, if it gives one; refused unless from 1 to 65535."""
    try:
        port = urlsplit(url).port
    except ValueError:
        port = -1  # not a number, or past 65535
    if port is not None and not 1 <= port <= 65535:
        raise InvalidChannel(
            f"the port of {_shown(url)} is out of range: give a port from 1 to 65535"
        )
    return port


def _shown(url: str) -> str:
    """A URL for an error: without its password."""
    parts = urlsplit(url)
    if parts.password:
        url = url.replace(f":{parts.password}@", ":***@", 1)
    return repr(url[:200])
