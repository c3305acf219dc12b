"""The UI's web server: settings, the Tornado application, and serving it.

Tornado is already installed with Flower, which Celery teams run next to their
workers; the UI adds no dependency. Pages are rendered on the server, charts are
inline SVG and the stylesheet is inlined: nothing is loaded from elsewhere, so
the UI works on a network with no way out, and its Content-Security-Policy
allows no script at all.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import tornado.web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from beat.models import Role
from beat.ops.schedules import Schedules
from beat.ui import base_handler, history_pages, json_api, pages, rest_api, run_pages
from beat.ui.security import FORM_BODY_LIMIT, check_exposure

#: Where the UI listens unless told otherwise (Flower's default is 5555).
DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_PORT = 5556
_HERE = Path(__file__).parent


@dataclass(frozen=True, kw_only=True)
class UISettings:
    """How the UI serves: where, to whom, and whether it may change anything."""

    address: str = DEFAULT_ADDRESS
    port: int = DEFAULT_PORT
    #: user → password for HTTP basic auth; empty: no password (loopback only).
    users: dict[str, str] = field(default_factory=dict)
    #: user → role (``--basic-auth user:password:role``); a user not here is an admin.
    roles: dict[str, Role] = field(default_factory=dict)
    #: Show everything, change nothing: every write is refused with 403.
    read_only: bool = False
    #: Flower's address (``http://localhost:5555``): each run links to its task page.
    flower_url: str | None = None
    #: The key form tokens are signed with (``beat.ui.security.FormTokens``): random
    #: per process, so a restart asks open forms to be reloaded. Give UIs behind one
    #: load balancer the same one.
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/"

    @property
    def flower_link(self) -> str:
        """Flower's address as every page links to it: without a ``user:password@`` it
        may carry (every viewer would read it; Flower asks for it itself)."""
        if not self.flower_url:
            return ""
        parts = urlsplit(self.flower_url)
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=host)).rstrip("/")


def make_application(
    schedules: Schedules,
    settings: UISettings,
    *,
    task_names: Callable[[], list[str]] = list,
) -> tornado.web.Application:
    """The UI over ``schedules``; ``task_names`` lists the tasks a new schedule may run
    (the app's registered tasks)."""
    context = base_handler.UIContext(
        schedules=schedules,
        settings=settings,
        task_names=task_names,
        stylesheet=(_HERE / "static" / "ui.css").read_text(),
    )
    routes: list[Any] = [
        *pages.routes(context),
        *history_pages.routes(context),
        *run_pages.routes(context),  # /runs/<run ID>: a run, a workflow run's steps
        *rest_api.routes(context),  # /api/schedules and /api/schedules/<name>, read and written
        *json_api.routes(context),
    ]
    return tornado.web.Application(
        routes,
        template_path=str(_HERE / "templates"),
        # writes carry a signed form token instead (base_handler.BaseHandler): Tornado's is a
        # cookie, which a page on another port of the host can plant
        xsrf_cookies=False,
        default_handler_class=pages.NotFoundHandler,
        default_handler_args={"context": context},
        compress_response=True,
    )


def http_server(application: tornado.web.Application) -> HTTPServer:
    """The server of ``application``, reading no body past ``FORM_BODY_LIMIT`` (each
    handler checks the password from the headers before it reads any)."""
    return HTTPServer(application, max_body_size=FORM_BODY_LIMIT)


def registered_tasks(app: Any) -> Callable[[], list[str]]:
    """The tasks of a Celery app a schedule may run (Celery's own are left out)."""

    def names() -> list[str]:
        app.loader.import_default_modules()
        return sorted(name for name in app.tasks if not name.startswith("celery."))

    return names


def serve(
    schedules: Schedules,
    settings: UISettings,
    *,
    task_names: Callable[[], list[str]] = list,
    ready: Callable[[str], None] = print,
) -> None:
    """Serve until SIGINT or SIGTERM. ConfigError (nothing served) when the address is
    reachable from other hosts and no password is set."""
    check_exposure(settings.address, settings.users)
    asyncio.run(_serve(schedules, settings, task_names, ready))


async def _serve(
    schedules: Schedules,
    settings: UISettings,
    task_names: Callable[[], list[str]],
    ready: Callable[[str], None],
) -> None:
    server = http_server(make_application(schedules, settings, task_names=task_names))
    server.listen(settings.port, settings.address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    mode = " (read-only)" if settings.read_only else ""
    ready(f"schedules UI on {settings.url}{mode}")
    await stop.wait()
    server.stop()
    await server.close_all_connections()


class BackgroundUI:
    """The UI served from a thread of its own on ``settings.address`` (port 0: a free
    one), for embedding in another program, tests and benchmarks::

        with BackgroundUI(schedules, UISettings(port=0)) as ui:
            urllib.request.urlopen(ui.url)
    """

    def __init__(
        self,
        schedules: Schedules,
        settings: UISettings,
        *,
        task_names: Callable[[], list[str]] = list,
    ) -> None:
        self._application = make_application(schedules, settings, task_names=task_names)
        self._settings = settings
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="schedules-ui", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.port = settings.port

    @property
    def url(self) -> str:
        return replace(self._settings, port=self.port).url

    def __enter__(self) -> BackgroundUI:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the schedules UI did not start within 10 s")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        server = http_server(self._application)
        sockets = bind_sockets(self._settings.port, self._settings.address)
        server.add_sockets(sockets)
        self.port = sockets[0].getsockname()[1]
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._started.set()
        await self._stop.wait()
        server.stop()
        await server.close_all_connections()
