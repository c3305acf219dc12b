"""The schedules UI's pages over HTTP, as a browser asks for them: the time from the
request to the last byte of the page (the facade's reads, the rendering, the
compression), served in-process by :class:`beat.ui.server.BackgroundUI`."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from urllib.parse import quote, urlencode

#: A read: returns the size of what it got (bytes of the page).
Reader = Callable[[], int]


def page_reads(
    base: str, *, busiest: str, quiet: str, deep_cursor: str | None
) -> list[tuple[str, Reader]]:
    """Each page of the UI worth timing at scale, as (name, reader)."""

    def get(path: str, **query: str) -> Reader:
        url = base.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")

        def read() -> int:
            with urllib.request.urlopen(url, timeout=120) as response:
                return len(response.read())

        return read

    busy = f"/schedules/{quote(busiest, safe='')}"
    return [
        ("GET / (first page)", get("/")),
        ("GET /?page=2000 (last page)", get("/", page="2000")),
        ("GET /?q=-00042 (search)", get("/", q="-00042")),
        ("GET /?paused=yes", get("/", paused="yes")),
        ("GET /?failing=yes", get("/", failing="yes")),
        (f"GET {busy}", get(busy)),
        (f"GET {busy}?before=… (oldest page)", get(busy, before=deep_cursor or "")),
        ("GET /schedules/<quiet one>", get(f"/schedules/{quote(quiet, safe='')}")),
        ("GET /cluster", get("/cluster")),
        ("GET /plots?window=1h", get("/plots", window="1h")),
        ("GET /plots?window=24h", get("/plots", window="24h")),
        ("GET /plots?window=7d", get("/plots", window="7d")),
        (f"GET /plots?window=7d&schedule={busiest}", get("/plots", window="7d", schedule=busiest)),
        ("GET /api/schedules", get("/api/schedules")),
    ]
