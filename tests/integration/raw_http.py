"""HTTP/1.1 spoken over a bare socket, for the UI's security tests: hostile request
lines (NUL, control characters, invalid UTF-8) that ``urllib`` refuses to send, and
requests whose body is held back to see whether the server answers before reading it."""

from __future__ import annotations

import contextlib
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

#: How long a test waits for an answer; a server that waits for a body never gives one.
ANSWER_TIMEOUT = 5.0


@dataclass(frozen=True)
class RawReply:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


class NoAnswer(AssertionError):
    """The server said nothing within ``ANSWER_TIMEOUT`` (it is still reading)."""


def request_bytes(
    method: bytes,
    target: bytes,
    host: str,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    *,
    content_length: int | None = None,
) -> bytes:
    """A request, ``Connection: close``; ``content_length`` announces more than ``body``."""
    lines = [method + b" " + target + b" HTTP/1.1", b"Host: " + host.encode()]
    lines += [f"{name}: {value}".encode() for name, value in (headers or {}).items()]
    length = len(body) if content_length is None else content_length
    if body or content_length is not None:
        lines.append(f"Content-Length: {length}".encode())
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def exchange(base: str, raw: bytes) -> RawReply:
    """Send ``raw`` to the server at ``base`` and read the whole answer; NoAnswer when it
    gives none in time."""
    parts = urlsplit(base)
    with socket.create_connection((parts.hostname, parts.port), timeout=ANSWER_TIMEOUT) as sock:
        # the server may answer and close before taking all: its answer is read below
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(raw)
        return read_reply(sock)


def read_reply(sock: socket.socket) -> RawReply:
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        if not received:
            raise NoAnswer(f"no answer within {ANSWER_TIMEOUT} s") from None
    except ConnectionResetError:
        pass
    return parse_reply(received)


def parse_reply(received: bytes) -> RawReply:
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    found = re.match(r"HTTP/1\.[01] (\d{3}) ?(.*)", lines[0])
    if found is None:
        raise AssertionError(f"not an HTTP answer: {received[:200]!r}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = _unchunked(body)
    return RawReply(int(found[1]), found[2], headers, body)


def _unchunked(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out, body = out + rest[:size], rest[size + 2 :]
    return out
