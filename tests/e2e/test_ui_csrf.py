"""Cross-port CSRF in a real browser (issue 29, finding 2): a page served from another
port of 127.0.0.1 (a dev server, a notebook: cookies are not isolated by port) plants
its own ``_xsrf`` cookie and posts the matching field to the UI the user is logged in
to. Chromium sends the user's credentials and, the two origins being same-site, the
SameSite=Strict cookies with it; the UI must refuse the write all the same."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.ui_browser import PASSWORD, USER, browser, screenshot, start_ui

pytestmark = pytest.mark.e2e

#: The token the attacking page chooses for both its cookie and its field.
PLANTED = "deadbeef" * 4


def attacking_page(target: str) -> bytes:
    """A page that posts "pause" to ``target`` as soon as it loads."""
    return f"""<!doctype html><title>a local dev server</title>
<form method="post" action="{target}"><input type="hidden" name="_xsrf" value="{PLANTED}"></form>
<script>document.forms[0].submit()</script>""".encode()


@contextmanager
def attacker(target: str) -> Iterator[str]:
    """The attacking page on a port of its own of 127.0.0.1; yields its URL."""
    page = attacking_page(target)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            # cookies are shared by every port of a host: this one reaches the UI
            self.send_header("Set-Cookie", f"_xsrf={PLANTED}; Path=/")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_on_another_port_cannot_pause_a_schedule_through_the_users_browser(
    cluster: Cluster, store: Store
) -> None:
    """issue 29, finding 2: before the fix (aad8ba0), Chromium paused the schedule."""
    schedules = Schedules(store)
    schedules.create("reports/nightly", "e2e.record", cron="30 2 * * *")
    process, base = start_ui(cluster)
    target = f"{base}/schedules/reports%2Fnightly/pause"
    answers: list[int] = []
    with browser() as launched, attacker(target) as attack_url:
        context = launched.new_context(
            http_credentials={"username": USER, "password": PASSWORD, "origin": base}
        )
        page = context.new_page()
        page.on(
            "response",
            lambda response: answers.append(response.status) if response.url == target else None,
        )
        page.goto(f"{base}/schedules/reports%2Fnightly")  # logged in, the form's cookie set
        assert page.get_by_role("button", name="Pause").is_visible()
        page.goto(attack_url)
        wait_until(lambda: any(status != 401 for status in answers), timeout=15, interval=0.1)
        page.wait_for_load_state()
        screenshot(page, "csrf-refused")
        context.close()
    assert schedules.get("reports/nightly").definition.enabled, (
        f"the page on another port paused the schedule (answers {answers})"
    )
    assert answers[-1] == 403, answers
    assert process.alive()
