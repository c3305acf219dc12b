"""Real local receivers of notifications, for the tests: an HTTP server that records
each POST (a webhook's or Slack's), and an SMTP server (aiosmtpd) that records each
mail. Both listen on 127.0.0.1 on a free port, in threads of the test process."""

from __future__ import annotations

import email
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller


@dataclass
class Post:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class HttpReceiver:
    """What was posted, and how to answer: ``status`` for every POST, after ``delay``."""

    port: int = 0
    posts: list[Post] = field(default_factory=list)
    status: int = 200
    delay: float = 0.0
    #: A Location header to answer with (a redirect).
    location: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def received(self, path: str | None = None) -> list[Post]:
        with self.lock:
            return [post for post in self.posts if path is None or post.path == path]


@contextmanager
def http_receiver() -> Iterator[HttpReceiver]:
    receiver = HttpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            time.sleep(receiver.delay)
            with receiver.lock:
                receiver.posts.append(Post(self.path, dict(self.headers.items()), body))
            self.send_response(receiver.status)
            if receiver.location:
                self.send_header("Location", receiver.location)
            self.end_headers()

        def do_GET(self) -> None:
            with receiver.lock:
                receiver.posts.append(Post(self.path, dict(self.headers.items()), {}))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class SmtpReceiver:
    port: int = 0
    mails: list[Message] = field(default_factory=list)

    def url(self) -> str:
        return f"smtp://127.0.0.1:{self.port}"


class _Recorder:
    def __init__(self, receiver: SmtpReceiver) -> None:
        self.receiver = receiver

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.receiver.mails.append(email.message_from_bytes(envelope.content))
        return "250 Message accepted for delivery"


@contextmanager
def smtp_receiver() -> Iterator[SmtpReceiver]:
    receiver = SmtpReceiver(port=_free_port())
    controller = Controller(_Recorder(receiver), hostname="127.0.0.1", port=receiver.port)
    controller.start()
    try:
        yield receiver
    finally:
        controller.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
