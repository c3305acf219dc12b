"""Who may use the UI: HTTP basic auth against the configured users, and the rule
that a UI reachable from other hosts has a password.

Writes are also protected against cross-site requests (Tornado's ``_xsrf`` token,
checked on every POST: ``beat.ui.server``) and refused in read-only mode.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from collections.abc import Mapping

from beat.errors import ConfigError

#: The realm browsers show when they ask for a password.
REALM = "habeat schedules"


def parse_users(text: str | None) -> dict[str, str]:
    """``user:password`` pairs separated by commas (as Flower's ``--basic-auth``), as
    {user: password}; ConfigError naming the fix for a malformed one."""
    users: dict[str, str] = {}
    for pair in (text or "").split(","):
        if not pair.strip():
            continue
        user, colon, password = pair.strip().partition(":")
        if not colon or not user or not password:
            raise ConfigError(
                "--basic-auth (HABEAT_UI_BASIC_AUTH) takes user:password pairs separated by"
                f" commas, got {user or pair.strip()!r:.40}…: give e.g. admin:s3cret"
            )
        users[user] = password
    return users


def is_loopback(address: str) -> bool:
    """Whether only this host can reach ``address`` (``localhost``, 127.0.0.0/8, ::1)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name that may resolve to anything


def check_exposure(address: str, users: Mapping[str, str]) -> None:
    """Refuse to serve other hosts without a password: the UI can trigger any job."""
    if users or is_loopback(address):
        return
    raise ConfigError(
        f"refusing to listen on {address} without a password: give --basic-auth"
        " user:password (or HABEAT_UI_BASIC_AUTH), or listen on 127.0.0.1"
    )


def is_local_host_header(host: str | None) -> bool:
    """Whether a request's ``Host`` names this machine's loopback (``localhost``,
    ``127.0.0.1:5556``, ``[::1]:5556``). A UI without a password accepts no other:
    a web page a browser on this machine opens could otherwise point its own name at
    127.0.0.1 (DNS rebinding) and use the UI as if it were the user."""
    if not host:
        return False
    if host.startswith("["):  # [::1]:5556
        name = host[1 : host.find("]")] if "]" in host else ""
    else:
        name = host.rsplit(":", 1)[0]
    return is_loopback(name)


def authorised(header: str | None, users: Mapping[str, str]) -> str | None:
    """The user an ``Authorization: Basic`` header proves, or None. Every configured
    user is compared in constant time, so the time taken tells nothing of which
    user or how much of a password was right."""
    if not header or not header.startswith("Basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, _, password = decoded.partition(":")
    found = None
    for known_user, known_password in users.items():
        same_user = hmac.compare_digest(user.encode(), known_user.encode())
        same_password = hmac.compare_digest(password.encode(), known_password.encode())
        if same_user and same_password:
            found = known_user
    return found
