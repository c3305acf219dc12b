"""A fuzz pass over every HTTP route and method of the UI, in-process against real
PostgreSQL and Redis (issue 29): hostile path segments (NUL, control characters, very
long, percent-encoded junk, invalid UTF-8, raw bytes in the request line), hostile
queries, bodies and headers, with and without credentials, tokens and origins.

The properties: never a 5xx, never a traceback or an error in the server's log, and
never a write without both the password and the form's signed token.

CI runs ``EXAMPLES`` requests, the same ones each time (``derandomize``). A long run
draws new ones::

    HABEAT_FUZZ_EXAMPLES=20000 pytest tests/integration/ui/test_ui_fuzz.py \
        --hypothesis-seed=20261205 --timeout=0 -s
"""

from __future__ import annotations

import logging
import os
import re
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from beat.ops.schedules import Schedules
from tests.integration.raw_http import NoAnswer, exchange, request_bytes
from tests.integration.ui import test_ui_http
from tests.integration.ui.test_ui_http import PASSWORD, UI, USER, basic

pytestmark = pytest.mark.integration

#: The UI's fixtures, shared with the tests of its pages.
app, serve, schedules = test_ui_http.app, test_ui_http.serve, test_ui_http.schedules

LONG_RUN = int(os.environ.get("HABEAT_FUZZ_EXAMPLES", "0"))
#: Requests per run in CI (about 20 s on a busy 2-core machine).
EXAMPLES = 3000
FUZZ = settings(
    max_examples=LONG_RUN or EXAMPLES,
    derandomize=not LONG_RUN,
    database=None,
    deadline=None,
    # one UI serves every example: a request leaves nothing another depends on
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: Names present in the store, so that some requests reach a real schedule.
PRESENT = ("fuzz/daily", "with space", "naïve ☃")
#: Methods, the ones the UI serves more often than the others.
METHODS = ("GET", "GET", "GET", "POST", "POST", "POST", "POST", "HEAD", "PUT", "DELETE")
METHODS += ("PATCH", "OPTIONS", "TRACE", "GÉT", "")
#: Every route, a ``{}`` where a path segment goes.
ROUTES = (
    "/",
    "/new",
    "/schedules/{}",
    "/schedules/{}/edit",
    "/schedules/{}/pause",
    "/schedules/{}/resume",
    "/schedules/{}/trigger",
    "/schedules/{}/delete",
    "/schedules/{}/history",
    "/schedules/{}/restore",
    "/schedules/{}/{}",
    "/cluster",
    "/plots",
    "/incidents",
    "/api/schedules",
    "/api/schedules/{}",
    "/api/schedules/{}/runs",
    "/api/schedules/{}/changes",
    "/api/changes",
    "/api/runs/{}",
    "/api/cluster",
    "/api/stats",
    "/api/incidents",
    "/static/{}",
    "/{}",
    "/{}/{}/{}",
)
PARAMETERS = (
    "q",
    "paused",
    "failing",
    "origin",
    "page",
    "offset",
    "limit",
    "before",
    "window",
    "schedule",
    "all",
    "done",
    "_xsrf",
)
FIELDS = (
    "_xsrf",
    "name",
    "task",
    "kind",
    "timing",
    "tz",
    "args",
    "kwargs",
    "queue",
    "misfire_policy",
    "overlap_policy",
    "max_attempts",
    "jitter",
    "start_at",
    "end_at",
    "max_runs",
    "alert_after_failures",
    "pause_after_failures",
    "failure_states",
    "max_runtime",
    "late_after",
    "missed_after",
    "channels",
    "revoke_after_max_runtime",
    "enabled",
    "run_id",
    "note",
    "version",
)

# -- values ---------------------------------------------------------------------------------

any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
control_text = st.text(st.characters(max_codepoint=0x1F), min_size=1, max_size=8)
long_text = st.integers(200, 6000).map(lambda n: "x" * n)
tricky_text = st.sampled_from(
    [
        "",
        "..",
        "%",
        "%zz",
        "%00",
        "\x00",
        "a\x00b",
        "%ff%fe",
        "/",
        "\\",
        "'; DROP TABLE beat_schedules; --",
        "<script>alert(1)</script>",
        "\u202e\u0000\ufffd",
        "1e309",
        "NaN",
        "-1",
        "2026-13-45T99:99",
        "00000000-0000-0000-0000-000000000000",
        "{}",
        "[",
    ]
)
text_value = st.one_of(any_text, control_text, long_text, tricky_text, st.sampled_from(PRESENT))


@st.composite
def path_segment(draw: st.DrawFn) -> bytes:
    """A segment as it goes on the wire: percent-encoded text, percent-encoded bytes
    (invalid UTF-8 among them), junk escapes, or raw bytes no client should send."""
    kind = draw(st.sampled_from(["text", "text", "text", "bytes", "junk", "raw"]))
    if kind == "text":
        return urllib.parse.quote(draw(text_value), safe="", errors="surrogatepass").encode()
    if kind == "bytes":
        return urllib.parse.quote_from_bytes(draw(st.binary(max_size=40)), safe="").encode()
    if kind == "junk":
        return draw(st.sampled_from([b"%", b"%zz", b"%%00", b"%c3%28", b"%ed%a0%80", b"%e2%82"]))
    raw = draw(st.binary(min_size=1, max_size=10))
    return raw.replace(b"\r", b"").replace(b"\n", b"") or b"\x00"


@st.composite
def target(draw: st.DrawFn) -> bytes:
    route = draw(st.sampled_from(ROUTES))
    segments = [draw(path_segment()) for _ in range(route.count("{}"))]
    path = route.encode().replace(b"{}", b"%s") % tuple(segments)
    chosen = draw(st.lists(st.tuples(st.sampled_from(PARAMETERS), text_value), max_size=4))
    if not chosen:
        return path
    return path + b"?" + urllib.parse.urlencode(chosen, errors="surrogatepass").encode()


@dataclass(frozen=True)
class Credentials:
    label: str
    header: str | None


CREDENTIALS = (
    *[Credentials("right", basic(USER, PASSWORD))] * 6,
    Credentials("none", None),
    Credentials("wrong password", basic(USER, "wrong")),
    Credentials("unknown user", basic("intruder", PASSWORD)),
    Credentials("not base64", "Basic %%%"),
    Credentials("not basic", "Bearer abc"),
    Credentials("not UTF-8", "Basic /w=="),
)


@st.composite
def body(draw: st.DrawFn, token: str) -> tuple[bytes, str | None]:
    """A form (with the right token, a wrong one or none) or bytes of any kind."""
    kind = draw(st.sampled_from(["none", "form", "form", "bytes", "multipart"]))
    if kind == "none":
        return b"", None
    if kind == "bytes":
        content_type = draw(st.sampled_from(["application/x-www-form-urlencoded", "text/plain"]))
        return draw(st.binary(max_size=400)), content_type
    fields = dict(draw(st.lists(st.tuples(st.sampled_from(FIELDS), text_value), max_size=8)))
    fields["_xsrf"] = draw(st.sampled_from([token, token, token, "", "deadbeef", token + "0"]))
    if kind == "multipart":
        boundary = "fuzzboundary"
        parts = [
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
            for name, value in fields.items()
        ]
        encoded = ("".join(parts) + f"--{boundary}--\r\n").encode("utf-8", "surrogatepass")
        return encoded, f"multipart/form-data; boundary={boundary}"
    encoded = urllib.parse.urlencode(fields, encoding="utf-8", errors="surrogatepass")
    return encoded.encode(), "application/x-www-form-urlencoded"


# -- the pass -------------------------------------------------------------------------------


def _form_token(ui: UI) -> str:
    page = ui.request("/new")
    found = re.search(r'name="_xsrf" value="([^"]+)"', page.body)
    assert found is not None, page.body[:300]
    return found[1]


def _problems(records: list[logging.LogRecord]) -> list[str]:
    """Log lines that are a traceback or an error (Tornado logs every 5xx as one)."""
    return [r.getMessage()[:300] for r in records if r.exc_info or r.levelno >= logging.ERROR]


def test_every_route_and_method_survives_hostile_requests(
    serve: Callable[..., UI],
    schedules: Schedules,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """issue 29, fuzz pass: no 5xx, no traceback; a write needs the password and the
    signed token."""
    for name in PRESENT:
        schedules.create(name, "ui.job", every=60)
    ui = serve(users={USER: PASSWORD})
    host = urllib.parse.urlsplit(ui.base).netloc
    token = _form_token(ui)
    origins = (None, None, ui.base, ui.base, "http://127.0.0.1:1", "null", "http://[", "\x7f")
    sites = (None, None, "same-origin", "same-origin", "same-site", "cross-site", "none", "j")
    statuses: Counter[int] = Counter()

    @FUZZ
    @given(
        method=st.sampled_from(METHODS),
        path=target(),
        credentials=st.sampled_from(CREDENTIALS),
        origin=st.sampled_from(origins),
        site=st.sampled_from(sites),
        sent=body(token),
        from_its_page=st.booleans(),
    )
    def one_request(
        method: str,
        path: bytes,
        credentials: Credentials,
        origin: str | None,
        site: str | None,
        sent: tuple[bytes, str | None],
        from_its_page: bool,
    ) -> None:
        if from_its_page:  # half the requests come from the user's browser on the UI
            credentials, origin, site = CREDENTIALS[0], ui.base, "same-origin"
        payload, content_type = sent
        headers = {
            name: value
            for name, value in (
                ("Authorization", credentials.header),
                ("Origin", origin),
                ("Sec-Fetch-Site", site),
                ("Content-Type", content_type),
            )
            if value is not None
        }
        first_record = len(caplog.records)
        raw = request_bytes(method.encode(), path, host, headers, payload)
        try:
            reply = exchange(ui.base, raw)
        except NoAnswer:
            pytest.fail(f"no answer to {raw[:300]!r}")
        statuses[reply.status] += 1
        event(f"{reply.status} with credentials {credentials.label}")
        assert reply.status < 500, (raw[:300], reply.status, reply.text[:300])
        if credentials.label != "right":
            assert reply.status in (400, 401, 405), (raw[:300], reply.status)
        if reply.status == 303:  # a write was done: it had all it needs
            assert token.encode() in payload, raw[:300]
            assert origin in (None, ui.base), raw[:300]
            assert site in (None, "same-origin", "none"), raw[:300]
        assert not _problems(caplog.records[first_record:]), raw[:300]

    with caplog.at_level(logging.INFO):
        one_request()
    print(f"\nUI fuzz pass: {statuses.total()} requests, by status {sorted(statuses.items())}")
