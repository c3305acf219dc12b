"""A channel's target is checked before it is written: each refusal one line naming
the fix (``beat.notify.targets``)."""

from __future__ import annotations

import re

import pytest

from beat.errors import InvalidChannel
from beat.models import ChannelKind
from beat.notify.targets import check_channel, smtp_target


@pytest.mark.parametrize(
    ("name", "kind", "target", "says"),
    [
        ("ops", ChannelKind.WEBHOOK, "ftp://example.com/hook", "posts to an http(s) URL"),
        ("ops", ChannelKind.SLACK, "hooks.slack.com/services/x", "posts to an http(s) URL"),
        ("ops", ChannelKind.WEBHOOK, "https://example.com:70000/x", "port from 1 to 65535"),
        ("ops", ChannelKind.WEBHOOK, "https://example.com:0/x", "port from 1 to 65535"),
        ("ops", ChannelKind.EMAIL, "http://mail?from=a@b.c&to=d@e.f", "smtp:// or smtps://"),
        ("ops", ChannelKind.EMAIL, "smtp://mail:99999?from=a@b.c&to=d@e.f", "port from 1"),
        ("ops", ChannelKind.EMAIL, "smtp://mail?to=d@e.f", "one sender address"),
        ("ops", ChannelKind.EMAIL, "smtp://mail?from=a@b.c", "recipient addresses"),
        ("ops", ChannelKind.EMAIL, "smtp://mail?from=a@b.c&to=nobody", "recipient addresses"),
        ("", ChannelKind.WEBHOOK, "https://example.com/x", "use letters, digits"),
        ("-ops", ChannelKind.WEBHOOK, "https://example.com/x", "use letters, digits"),
        ("ops team", ChannelKind.WEBHOOK, "https://example.com/x", "use letters, digits"),
        ("ops", ChannelKind.WEBHOOK, "http://host/a b", "a space or a control character"),
        ("ops", ChannelKind.WEBHOOK, "http://host/a\x1b[31m", "a space or a control character"),
        (
            "ops",
            ChannelKind.EMAIL,
            "smtps://mail?from=a@b.c&to=d@e.f&starttls=true",
            "leave starttls out",
        ),
        ("ops", ChannelKind.EMAIL, "smtp://u:p@mail?from=a@b.c&to=d@e.f", "password in clear"),
        ("ops", ChannelKind.EMAIL, "smtp://mail?from=a@b.c&to=d@e.f&starttls=yes", "true or false"),
    ],
)
def test_a_channel_that_cannot_be_used_is_refused_naming_the_fix(
    name: str, kind: ChannelKind, target: str, says: str
) -> None:
    with pytest.raises(InvalidChannel, match=re.escape(says)) as refused:
        check_channel(name, kind, target)
    assert "\n" not in str(refused.value)


def test_a_password_is_not_repeated_in_a_refusal() -> None:
    with pytest.raises(InvalidChannel) as refused:
        check_channel("ops", ChannelKind.EMAIL, "smtps://me:hunter2@mail:99999?from=a@b.c&to=d@e.f")
    assert "hunter2" not in str(refused.value)


def test_an_smtp_target_names_its_server_sender_recipients_and_tls() -> None:
    target = smtp_target(
        "smtps://me%40corp:se%2Fcret@mail.example.com?from=beat%40example.com&to=a%40example.com,b%40example.com"
    )
    assert (target.host, target.port, target.tls, target.starttls) == (
        "mail.example.com", 465, True, False,
    )  # fmt: skip
    assert (target.username, target.password) == ("me@corp", "se/cret"), "percent-decoded"
    assert target.sender == "beat@example.com"
    assert target.recipients == ("a@example.com", "b@example.com")
    plain = smtp_target("smtp://localhost:2525?from=a@b.c&to=d@e.f&starttls=true")
    assert (plain.port, plain.tls, plain.starttls) == (2525, False, True)
