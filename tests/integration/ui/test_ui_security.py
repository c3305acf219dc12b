"""The UI's defences over HTTP, in-process against real PostgreSQL and Redis: writes
from another origin, tokens the client chose or another user was given, bodies sent
without credentials or past the cap, and inputs PostgreSQL cannot hold. The browser
half of the CSRF defence is ``tests/e2e/test_ui_csrf.py``; the fuzz pass over every
route is ``tests/integration/ui/test_ui_fuzz.py``."""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable

import pytest

from beat.ops.schedules import Schedules
from beat.ui.server import FORM_BODY_LIMIT
from tests.integration.raw_http import NoAnswer, RawReply, exchange, request_bytes
from tests.integration.ui import test_ui_http
from tests.integration.ui.test_ui_http import PASSWORD, UI, USER, basic

pytestmark = pytest.mark.integration

#: The UI's fixtures, shared with the tests of its pages.
app, serve, schedules = test_ui_http.app, test_ui_http.serve, test_ui_http.schedules


def _host(ui: UI) -> str:
    return urllib.parse.urlsplit(ui.base).netloc


def _browser_token(ui: UI) -> tuple[dict[str, str], dict[str, str]]:
    """The form field and the cookie (if any) a browser holds after opening a form."""
    field, cookie = ui.token()
    return {"_xsrf": field}, ({"Cookie": cookie} if cookie else {})


def _post(
    ui: UI,
    path: str,
    fields: dict[str, str],
    headers: dict[str, str] | None = None,
    *,
    authorization: str | None = "default",
) -> RawReply:
    chosen = ui.authorization if authorization == "default" else authorization
    sent = {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})}
    if chosen is not None:
        sent["Authorization"] = chosen
    body = urllib.parse.urlencode(fields).encode()
    return exchange(ui.base, request_bytes(b"POST", path.encode(), _host(ui), sent, body))


def test_a_write_from_another_origin_is_refused_even_with_a_valid_token(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    """issue 29, finding 2: a page on another port of the same host is another origin;
    its POST is refused by Origin and Sec-Fetch-Site before the token is looked at."""
    schedules.create("target", "ui.job", every=60)
    ui = serve(users={USER: PASSWORD})
    token, cookie = _browser_token(ui)
    foreign = {
        "another port": {"Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "same-site"},
        "another host": {"Origin": "http://attacker.example", "Sec-Fetch-Site": "cross-site"},
        "an opaque origin": {"Origin": "null"},
        "a foreign Sec-Fetch-Site alone": {"Sec-Fetch-Site": "same-site"},
        "a foreign Origin alone": {"Origin": "http://localhost:1"},
    }
    for label, headers in foreign.items():
        refused = _post(ui, "/schedules/target/pause", token, headers | cookie)
        assert refused.status == 403, (label, refused.status, refused.text[:300])
        assert "origin" in refused.text.lower(), label
    assert schedules.get("target").definition.enabled, "nothing was paused"
    own = {"Origin": ui.base, "Sec-Fetch-Site": "same-origin"}
    assert _post(ui, "/schedules/target/pause", token, own | cookie).status == 303
    assert not schedules.get("target").definition.enabled


def test_without_a_password_a_write_from_another_port_is_refused(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    """issue 29, finding 2: a UI on loopback without a password trusts the host's users,
    not the pages their browsers open."""
    schedules.create("target", "ui.job", every=60)
    ui = serve()
    token, cookie = _browser_token(ui)
    another_port = {"Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "same-site"}
    assert _post(ui, "/schedules/target/pause", token, another_port | cookie).status == 403
    assert schedules.get("target").definition.enabled
    assert _post(ui, "/schedules/target/pause", token, cookie).status == 303, "as curl does"


def test_a_token_pair_the_client_chose_is_refused(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    """issue 29, finding 2: a double-submit pair (a cookie and a field of the client's
    choosing, as a page on another port can plant) is no token: the UI signs its own."""
    schedules.create("target", "ui.job", every=60)
    ui = serve(users={USER: PASSWORD})
    chosen = "deadbeefdeadbeefdeadbeefdeadbeef"
    planted = _post(ui, "/schedules/target/pause", {"_xsrf": chosen}, {"Cookie": f"_xsrf={chosen}"})
    assert planted.status == 403, planted.status
    assert schedules.get("target").definition.enabled


def test_a_token_given_to_one_user_is_refused_for_another(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    """issue 29, finding 2: the token is bound to the user it was handed to."""
    schedules.create("target", "ui.job", every=60)
    ui = serve(users={USER: PASSWORD, "viewer": "another password"})
    viewer = UI(ui.base, basic("viewer", "another password"))
    token, cookie = _browser_token(viewer)
    refused = _post(ui, "/schedules/target/pause", token, cookie)
    assert refused.status == 403, refused.status
    assert "token" in refused.text.lower()
    assert schedules.get("target").definition.enabled
    token, cookie = _browser_token(ui)
    assert _post(ui, "/schedules/target/pause", token, cookie).status == 303


def test_a_token_from_another_server_is_refused(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    """issue 29, finding 2: tokens are signed with the server's own secret."""
    schedules.create("target", "ui.job", every=60)
    ui = serve(users={USER: PASSWORD})
    other = serve(users={USER: PASSWORD})
    token, cookie = _browser_token(other)
    assert _post(ui, "/schedules/target/pause", token, cookie).status == 403
    assert schedules.get("target").definition.enabled


def _held_back(ui: UI, path: str, announced: int, authorization: str | None) -> RawReply:
    """A POST that announces ``announced`` bytes of body and sends none of them."""
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if authorization is not None:
        headers["Authorization"] = authorization
    raw = request_bytes(b"POST", path.encode(), _host(ui), headers, content_length=announced)
    return exchange(ui.base, raw)


def test_a_body_without_credentials_is_refused_before_it_is_read(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    """issue 29, finding 3: credentials are checked from the headers; the server
    answers 401 while the body is still to come (before: it waited to read it all)."""
    schedules.create("target", "ui.job", every=60)
    ui = serve(users={USER: PASSWORD})
    for path in ("/schedules/target/pause", "/new", "/no-such-page", "/api/schedules"):
        for announced in (1000, 60 * 1024 * 1024):
            try:
                reply = _held_back(ui, path, announced, authorization=None)
            except NoAnswer:
                pytest.fail(f"{path} with {announced} bytes announced waited for the body")
            assert reply.status == 401, (path, announced, reply.status)
    wrong = basic(USER, "wrong")
    assert _held_back(ui, "/new", 1000, wrong).status == 401


def test_a_body_past_the_cap_is_refused_unread_with_its_limit(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    """issue 29, finding 3: with credentials, a body larger than a form needs is refused
    with 413 naming the cap, before it is read."""
    schedules.create("target", "ui.job", every=60)
    ui = serve(users={USER: PASSWORD})
    try:
        reply = _held_back(ui, "/new", FORM_BODY_LIMIT + 1, ui.authorization)
    except NoAnswer:
        pytest.fail("a body past the cap was waited for")
    assert reply.status == 413, reply.status
    assert f"{FORM_BODY_LIMIT // 1024} KiB" in reply.text
    for length in ("\xb2", "-1", "1e9"):  # numbers Python reads, HTTP does not
        headers = {"Authorization": basic(USER, PASSWORD), "Content-Length": length}
        raw = request_bytes(b"POST", b"/new", _host(ui), headers)
        assert 400 <= exchange(ui.base, raw).status < 500, length


def test_a_chunked_body_past_the_cap_is_cut_off(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    """issue 29, finding 3: a body without Content-Length is counted as it arrives."""
    schedules.create("target", "ui.job", every=60)
    ui = serve(users={USER: PASSWORD})
    chunk = b"x" * 65536
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(8)) + b"0\r\n\r\n"
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "Transfer-Encoding": "chunked",
        "Authorization": basic(USER, PASSWORD),
    }
    raw = request_bytes(b"POST", b"/new", _host(ui), headers) + chunks
    reply = exchange(ui.base, raw)
    assert reply.status in (400, 413), reply.status
    assert schedules.page(limit=10).total == 1, "nothing was created"


#: Inputs PostgreSQL cannot take (a NUL in a path; Tornado makes a query's control
#: characters spaces) or the API refuses (a search past 255 characters): (method,
#: path, status).
UNFIT_INPUTS = [
    ("GET", "/?q=" + "x" * 256, 400),
    ("GET", "/api/schedules?q=" + "x" * 256, 400),
    ("GET", "/schedules/%00", 404),
    ("GET", "/schedules/a%00b/edit", 404),
    ("GET", "/api/schedules/%00", 404),
    ("GET", "/api/schedules/%00/runs", 404),
    ("GET", "/schedules/" + "n" * 300, 404),
    ("GET", "/schedules/present?before=" + "9" * 30, 400),
    ("GET", "/api/schedules/present/runs?before=%00", 400),
    ("POST", "/schedules/%00/pause", 404),
    ("POST", "/schedules/%00/edit", 404),
]


@pytest.mark.parametrize(("method", "path", "status"), UNFIT_INPUTS)
def test_an_input_the_database_cannot_hold_is_a_4xx_with_its_reason(
    serve: Callable[..., UI],
    schedules: Schedules,
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    status: int,
) -> None:
    """issue 29, finding 5: never a 500, never a traceback in the log."""
    schedules.create("present", "ui.job", every=60)
    ui = serve(users={USER: PASSWORD})
    if method == "POST":
        token, cookie = _browser_token(ui)
        reply = _post(ui, path, token, cookie)
    else:
        headers = {"Authorization": basic(USER, PASSWORD)}
        reply = exchange(ui.base, request_bytes(b"GET", path.encode(), _host(ui), headers))
    assert reply.status == status, (reply.status, reply.text[:300])
    assert "Internal Server Error" not in reply.text
    assert reply.text.strip(), "the answer says why"
    tracebacks = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not tracebacks, [r.getMessage() for r in tracebacks]
