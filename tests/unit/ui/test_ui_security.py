"""The UI's form tokens and origin rule (``beat.ui.security``), without a server
(issue 29, finding 2); ``tests/integration/ui/test_ui_security.py`` holds them over HTTP."""

from __future__ import annotations

import asyncio

import pytest
import tornado.web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from beat.models import Role
from beat.ui.base_handler import BaseHandler, UIContext, signed_form
from beat.ui.security import FormTokens, foreign_origin
from beat.ui.server import UISettings

SECRET = b"k" * 32


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_token_is_valid_for_its_user_until_it_expires() -> None:
    clock = Clock(1_000_000.0)
    tokens = FormTokens(SECRET, lifetime=3600, clock=clock)
    token = tokens.issue("ops")
    assert tokens.valid(token, "ops")
    assert not tokens.valid(token, "viewer"), "bound to its user"
    assert not tokens.valid(token, ""), "not to the password-less user either"
    assert not FormTokens(b"x" * 32, clock=clock).valid(token, "ops"), "bound to its secret"
    clock.now += 3601
    assert not tokens.valid(token, "ops"), "expired"


@pytest.mark.parametrize(
    "forged", ["", ".", "deadbeef", "zz.00", "1.é", "f" * 200 + ".00", "-1.ab", "\x00"]
)
def test_a_forged_token_is_refused_without_raising(forged: str) -> None:
    assert not FormTokens(SECRET).valid(forged, "ops")


def test_a_token_moved_in_time_is_refused() -> None:
    clock = Clock(1_000_000.0)
    tokens = FormTokens(SECRET, clock=clock)
    issued, _, signature = tokens.issue("ops").partition(".")
    later = f"{int(issued, 16) + 1:x}.{signature}"
    assert not tokens.valid(later, "ops")


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ({}, False),
        ({"Origin": "http://127.0.0.1:5556"}, False),
        ({"Origin": "https://127.0.0.1:5556", "Sec-Fetch-Site": "same-origin"}, False),
        ({"Sec-Fetch-Site": "none"}, False),
        ({"Origin": "http://127.0.0.1:8888"}, True),
        ({"Origin": "http://127.0.0.1:5556", "Sec-Fetch-Site": "same-site"}, True),
        ({"Origin": "http://localhost:5556"}, True),
        ({"Origin": "null"}, True),
        ({"Origin": "http://127.0.0.1:5556/path"}, True),
        ({"Origin": "http://["}, True),
        ({"Origin": "file://127.0.0.1:5556"}, True),
        ({"Sec-Fetch-Site": "cross-site"}, True),
    ],
)
def test_a_write_from_another_origin_is_named_as_such(
    headers: dict[str, str], refused: bool
) -> None:
    reason = foreign_origin(headers, "127.0.0.1:5556")
    assert (reason is not None) == refused, reason
    if reason is not None:
        assert "another origin" in reason


class Unmarked(BaseHandler):
    """A write a developer forgot to mark ``signed_form``."""

    async def post(self) -> None:
        self.finish("written")


class Marked(BaseHandler):
    @signed_form(Role.OPERATOR)
    async def post(self) -> None:
        self.finish("written")


def test_a_write_that_does_not_check_its_token_is_refused() -> None:
    """issue 29, finding 2: a new POST handler cannot forget the form token."""
    settings = UISettings(port=0)
    context = UIContext(schedules=None, settings=settings, task_names=list, stylesheet="")  # type: ignore[arg-type]
    application = tornado.web.Application(
        [(r"/unmarked", Unmarked, {"context": context}), (r"/marked", Marked, {"context": context})]
    )
    token = FormTokens(settings.secret).issue("")

    async def post(path: str, body: str) -> int:
        sockets = bind_sockets(0, "127.0.0.1")
        server = HTTPServer(application)
        server.add_sockets(sockets)
        port = sockets[0].getsockname()[1]
        client = AsyncHTTPClient()
        try:
            response = await client.fetch(
                f"http://127.0.0.1:{port}{path}", method="POST", body=body, raise_error=False
            )
            return response.code
        finally:
            server.stop()
            client.close()

    assert asyncio.run(post("/unmarked", f"_xsrf={token}")) == 405
    assert asyncio.run(post("/marked", f"_xsrf={token}")) == 200
    assert asyncio.run(post("/marked", "_xsrf=deadbeef")) == 403


def test_a_token_has_one_spelling() -> None:
    """``int(text, 16)`` also reads `` 1f``, ``+1f``, ``0x1f`` and ``1_f``: each is refused."""
    tokens = FormTokens(secret=b"k" * 32, clock=lambda: 0x1F)
    good = tokens.issue("ops")
    assert tokens.valid(good, "ops")
    issued, _, signature = good.partition(".")
    for spelling in (f" {issued}", f"+{issued}", f"0x{issued}", f"{issued[:1]}_{issued[1:]}"):
        assert not tokens.valid(f"{spelling}.{signature}", "ops"), spelling
