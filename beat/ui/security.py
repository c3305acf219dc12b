"""Who may use the UI: HTTP basic auth against the configured users, the rule that a
UI reachable from other hosts has a password, and what a write must carry.

A write (any method but GET, HEAD and OPTIONS) is refused unless it comes from the
UI's own origin (``Origin`` and ``Sec-Fetch-Site``, when the client sends them: a
browser always does) and carries a form token the server signed for the same user
(``FormTokens``). Cookies are not isolated by port, so a page on another port of the
same host could plant a cookie; the token is therefore no cookie at all. The threat
model is docs/guides/security.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import re
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from beat.errors import ConfigError
from beat.models import Role

#: How a token writes the time it was issued.
_HEX = re.compile(r"[0-9a-f]{1,16}")
#: The realm browsers show when they ask for a password.
REALM = "habeat schedules"
#: The largest request body read: a form's args and kwargs (64 KiB of JSON together,
#: ``beat.ops.schedules.MAX_PAYLOAD_BYTES``) percent-encoded (up to 3 bytes each), and the rest.
#: A larger one is refused (413) before it is read, and no body is read before the
#: password is checked.
FORM_BODY_LIMIT = 256 * 1024


def parse_users(text: str | None) -> dict[str, str]:
    """``user:password`` pairs separated by commas (as Flower's ``--basic-auth``), as
    {user: password}; ConfigError naming the fix for a malformed one. A pair may end
    in ``:viewer``, ``:operator`` or ``:admin`` (``parse_roles``), which is no part of
    the password."""
    return {user: password for user, (password, _) in _parse(text).items()}


def parse_roles(text: str | None) -> dict[str, Role]:
    """The role of each user of ``--basic-auth`` given one (``user:password:role``); a
    user without one is an admin, as every user was before roles."""
    return {user: role for user, (_, role) in _parse(text).items() if role is not None}


def _parse(text: str | None) -> dict[str, tuple[str, Role | None]]:
    users: dict[str, tuple[str, Role | None]] = {}
    for position, pair in enumerate((text or "").split(","), start=1):
        if not pair.strip():
            continue
        user, colon, password = pair.strip().partition(":")
        if not colon or not user or not password:
            # The pair is not repeated: it may be a password.
            raise ConfigError(
                "--basic-auth (HABEAT_UI_BASIC_AUTH) takes user:password pairs separated by"
                f" commas, and pair {position} has no user, no colon or no password:"
                " give e.g. admin:s3cret"
            )
        head, colon, last = password.rpartition(":")
        role = Role(last) if colon and head and last in ROLE_NAMES else None
        users[user] = (head if role is not None else password, role)
    return users


#: A user's name has no colon (basic auth splits at the first), so no user is named as
#: the audit log names others (``token:NAME``, ``system:REASON``, ``sql:USER``).
ROLE_NAMES = frozenset(role.value for role in Role)


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


#: The methods that change nothing; every other one is a write.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: ``Sec-Fetch-Site`` values a write may carry: the UI's own page, or the user typing.
OWN_SITES = frozenset({"same-origin", "none"})


def foreign_origin(headers: Mapping[str, str], host: str) -> str | None:
    """Why a write whose request ``headers`` are these comes from another origin than
    the UI at ``host`` (its ``Host`` header), or None when it may be its own.

    A browser sends ``Origin`` with every POST and ``Sec-Fetch-Site`` with every request
    (Chromium, Firefox, Safari): a page on another port of the same host is
    ``same-site``, not ``same-origin``. A client that sends neither (curl, a script) is
    no browser a page can drive; it still needs the password and the form token. The
    header is quoted with ``repr``: the reason is logged, and a header may hold escapes."""
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site.lower() not in OWN_SITES:
        return f"a write from another origin is refused (Sec-Fetch-Site: {site!r:.40})"
    origin = headers.get("Origin")
    if origin is not None and not _is_origin_of(origin, host):
        return f"a write from another origin is refused (Origin: {origin!r:.80})"
    return None


def _is_origin_of(origin: str, host: str) -> bool:
    """Whether ``origin`` names the server a request with ``Host: host`` reached. The
    scheme is not compared (a proxy that ends TLS hides it); ``Sec-Fetch-Site``,
    which a browser computes with the scheme, covers that."""
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    return (
        parts.scheme in {"http", "https"}
        and not parts.path
        and parts.netloc.lower() == host.lower()
    )


class FormTokens:
    """The token each form carries: the time it was issued and an HMAC of that time and
    the user it was handed to, under the server's secret. Nothing a client sends or
    stores chooses it, so a page that plants its own cookie or field gains nothing; a
    token handed to one user is worthless to another, and one older than ``lifetime``
    seconds or from another server (another secret) is refused."""

    def __init__(
        self, secret: bytes, *, lifetime: float = 86400.0, clock: Callable[[], float] = time.time
    ) -> None:
        self._secret = secret
        self._lifetime = lifetime
        self._clock = clock

    def issue(self, user: str) -> str:
        issued = int(self._clock())
        return f"{issued:x}.{self._signature(user, issued)}"

    def valid(self, token: str, user: str) -> bool:
        issued_text, _, signature = token.partition(".")
        if not _HEX.fullmatch(issued_text):  # one spelling per token: int() takes more
            return False
        issued = int(issued_text, 16)
        fresh = 0 <= self._clock() - issued <= self._lifetime
        expected = self._signature(user, issued)
        return fresh and hmac.compare_digest(signature.encode(), expected.encode())

    def _signature(self, user: str, issued: int) -> str:
        message = f"{user}\0{issued}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()
