"""A real `celery -A app schedules ui` process and Debian's Chromium driven by
Playwright, for the browser tests. Screenshots go to ``build/screenshots``."""

from __future__ import annotations

import os
import shutil
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, Page, sync_playwright

from tests.conftest import not_installed
from tests.e2e.cluster import ROOT, Cluster, Process, wait_until

USER, PASSWORD = "admin", "s3cret-for-tests"
#: Where the screenshots of each page are saved (ignored by git).
SCREENSHOTS = ROOT / "build" / "screenshots"
#: Flower's address as the UI is told it (the link is checked, not followed).
FLOWER_URL = "http://127.0.0.1:5555"


def chromium_path() -> str:
    """Debian's Chromium (``apt-get install -y chromium``); Playwright's own browser
    download does not work offline."""
    found = os.environ.get("HABEAT_CHROMIUM") or shutil.which("chromium")
    if found is None:
        not_installed("Chromium is not installed: apt-get install -y chromium")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def status_of(url: str | urllib.request.Request) -> int:
    """The HTTP status ``url`` answers with; 0 while nothing listens."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            code: int = response.status
            return code
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code
    except (urllib.error.URLError, OSError):
        return 0


def start_ui(cluster: Cluster, *extra: str) -> tuple[Process, str]:
    """The UI on a free port with a password; waits until it answers (401 without it)."""
    port = free_port()
    process = cluster.start(
        "ui",
        "schedules",
        "ui",
        "--port",
        str(port),
        "--basic-auth",
        f"{USER}:{PASSWORD}",
        "--flower-url",
        FLOWER_URL,
        *extra,
    )
    base = f"http://127.0.0.1:{port}"
    wait_until(
        lambda: status_of(base + "/") == 401 or not process.alive(), timeout=30, interval=0.1
    )
    assert process.alive(), process.output()
    return process, base


@contextmanager
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield launched
        finally:
            launched.close()


def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
