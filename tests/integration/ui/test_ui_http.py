"""The schedules UI over HTTP, in-process against real PostgreSQL and Redis: who may
see and change what (basic auth, CSRF, read-only, exposure), the JSON API, the
form's refusals, and errors a user can act on. The browser tests
(``tests/e2e/test_ui.py``) drive the same pages in Chromium."""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from celery import Celery

from app.factory import create_app
from beat.config import BeatConfig
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.ui.server import BackgroundUI, UISettings, registered_tasks
from tests.conftest import SessionEnv
from tests.integration.helpers import error_lines, invoke, table_rows

pytestmark = pytest.mark.integration

USER, PASSWORD = "ops", "correct horse"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: str

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class UI:
    base: str
    authorization: str | None = None

    def request(
        self,
        path: str,
        *,
        form: dict[str, str] | None = None,
        authorization: str | None = "default",
        cookie: str | None = None,
        host: str | None = None,
    ) -> Reply:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        request = urllib.request.Request(self.base + path, data=data)
        chosen = self.authorization if authorization == "default" else authorization
        if chosen is not None:
            request.add_header("Authorization", chosen)
        if cookie is not None:
            request.add_header("Cookie", cookie)
        if host is not None:
            request.add_header("Host", host)
        opener = urllib.request.build_opener(_NoRedirect())
        try:
            with opener.open(request, timeout=10) as response:
                return Reply(response.status, _headers(response.headers), response.read().decode())
        except urllib.error.HTTPError as exc:
            with exc:
                return Reply(exc.code, _headers(exc.headers), exc.read().decode())

    def token(self) -> tuple[str, str]:
        """The ``_xsrf`` field and cookie a form page hands out."""
        page = self.request("/new")
        found = re.search(r'name="_xsrf" value="([^"]+)"', page.body)
        assert found is not None, page.body[:500]
        return found[1], page.headers.get("set-cookie", "").split(";")[0]

    def post_form(
        self, path: str, form: dict[str, str], token: tuple[str, str] | None = None
    ) -> Reply:
        """A POST as the page's own form sends it: with the ``_xsrf`` field and cookie."""
        field, cookie = token or self.token()
        return self.request(path, form=form | {"_xsrf": field}, cookie=cookie)


def _headers(message: Any) -> dict[str, str]:
    """Header names in lower case: HTTP does not tell "WWW-Authenticate" from
    "Www-Authenticate"."""
    return {name.lower(): value for name, value in message.items()}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def app(test_env: SessionEnv, store: Store, redis_client: redis.Redis) -> Celery:
    celery_app = create_app(test_env.settings(lock_ttl=3.0))

    @celery_app.task(name="ui.job", shared=False)  # type: ignore[untyped-decorator]
    def job(label: str = "") -> str:
        return label

    return celery_app


@pytest.fixture
def serve(app: Celery, store: Store) -> Iterator[Callable[..., UI]]:
    """``serve(**settings)``: the UI in a thread of its own, on a free port."""
    with ExitStack() as servers:

        def start(**settings: Any) -> UI:
            schedules = Schedules(store, app=app, config=BeatConfig.from_celery_conf(app.conf))
            chosen = UISettings(port=0, **settings)
            ui = servers.enter_context(
                BackgroundUI(schedules, chosen, task_names=registered_tasks(app))
            )
            users = chosen.users
            authorization = basic(*next(iter(users.items()))) if users else None
            return UI(ui.url.rstrip("/"), authorization)

        yield start


@pytest.fixture
def schedules(app: Celery, store: Store) -> Schedules:
    return Schedules(store, app=app)


def test_every_page_and_api_needs_the_password(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    schedules.create("guarded", "ui.job", every=60)
    ui = serve(users={USER: PASSWORD})
    for path in (
        "/",
        "/schedules/guarded",
        "/new",
        "/cluster",
        "/plots",
        "/incidents",
        "/api/schedules",
        "/api/cluster",
        "/api/incidents",
        "/no-such-page",
    ):
        refused = ui.request(path, authorization=None)
        assert refused.status == 401, path
        assert refused.headers["www-authenticate"].startswith("Basic realm=")
        assert "guarded" not in refused.body
        assert ui.request(path, authorization=basic(USER, "wrong")).status == 401, path
        assert ui.request(path, authorization=basic("intruder", PASSWORD)).status == 401, path
    assert ui.request("/").status == 200
    assert ui.request("/api/schedules").status == 200


def test_without_a_password_a_page_asked_for_by_another_host_name_is_refused(
    serve: Callable[..., UI], schedules: Schedules, store: Store
) -> None:
    """DNS rebinding: a web page points its own name at 127.0.0.1 and the browser sends
    that name as Host; the UI without a password serves loopback names only."""
    schedules.create("local", "ui.job", every=60)
    ui = serve()
    assert ui.request("/schedules/local").status == 200
    rebound = ui.request("/schedules/local", host="attacker.example:5556")
    assert rebound.status == 403
    assert "ui.job" not in rebound.body, "nothing of the schedule is shown"
    assert ui.request("/api/schedules", host="attacker.example").status == 403
    guarded = serve(users={USER: PASSWORD})
    assert guarded.request("/schedules/local", host="ui.example.org").status == 200, (
        "with a password, any name may reach it (a proxy, a DNS name)"
    )


def test_a_write_without_the_csrf_token_is_refused_and_changes_nothing(
    serve: Callable[..., UI], schedules: Schedules, store: Store
) -> None:
    schedules.create("target", "ui.job", every=60)
    ui = serve(users={USER: PASSWORD})
    before = table_rows(store)
    for action in ("pause", "trigger", "delete"):
        assert ui.request(f"/schedules/target/{action}", form={}).status == 403
    forged = {"name": "forged", "task": "ui.job", "kind": "every", "timing": "60"}
    assert ui.request("/new", form=forged).status == 403
    assert table_rows(store) == before
    assert ui.post_form("/schedules/target/pause", {}).status == 303, "with the token it works"
    assert not schedules.get("target").definition.enabled


def test_read_only_shows_everything_and_refuses_every_write(
    serve: Callable[..., UI], schedules: Schedules, store: Store
) -> None:
    schedules.create("watched", "ui.job", every=60)
    writable = serve(users={USER: PASSWORD})
    ui = serve(users={USER: PASSWORD}, read_only=True)
    page = ui.request("/schedules/watched")
    assert page.status == 200
    assert "read-only" in page.body
    for button in ("Pause", "Trigger now", "Edit", 'href="/new"'):
        assert button not in page.body
    assert ui.request("/new").status == 403
    assert ui.request("/schedules/watched/edit").status == 403
    before = table_rows(store)
    valid_token = writable.token()  # a token is not tied to a server: read-only must refuse it
    for action in ("pause", "trigger", "delete"):
        assert ui.post_form(f"/schedules/watched/{action}", {}, valid_token).status == 403
    assert table_rows(store) == before


def test_a_bad_cron_is_shown_beside_its_field_and_nothing_is_written(
    serve: Callable[..., UI], schedules: Schedules, store: Store
) -> None:
    schedules.create("nightly", "ui.job", cron="30 2 * * *", kwargs={"label": "a"})
    ui = serve(users={USER: PASSWORD})
    before = table_rows(store)
    form = {
        "task": "ui.job",
        "kind": "cron",
        "timing": "30 25 * * *",
        "tz": "UTC",
        "args": "[]",
        "kwargs": '{"label": "b"}',
        "misfire_policy": "fire_once",
        "overlap_policy": "allow",
        "max_attempts": "3",
        "jitter": "0",
        "enabled": "on",
    }
    refused = ui.post_form("/schedules/nightly/edit", form)
    assert refused.status == 400
    error = re.search(r'<span class="error" id="timing-error">([^<]+)</span>', refused.body)
    assert error is not None, refused.body
    assert "25" in error[1]
    assert 'value="30 25 * * *"' in refused.body, "what was typed is shown again"
    assert table_rows(store) == before

    bad_json = ui.post_form(
        "/schedules/nightly/edit", form | {"timing": "0 3 * * *", "kwargs": "{"}
    )
    assert bad_json.status == 400
    assert 'id="kwargs-error"' in bad_json.body
    assert table_rows(store) == before

    saved = ui.post_form("/schedules/nightly/edit", form | {"timing": "0 3 * * *"})
    assert saved.status == 303
    changed = schedules.get("nightly").definition
    assert changed.trigger.expression == "0 3 * * *"  # type: ignore[union-attr]
    assert changed.kwargs == {"label": "b"}


def test_a_new_schedule_is_validated_like_the_cli(
    serve: Callable[..., UI], schedules: Schedules, store: Store
) -> None:
    ui = serve()
    form = {
        "name": "fresh",
        "task": "ui.job",
        "kind": "every",
        "timing": "10m",
        "args": "[]",
        "kwargs": "{}",
        "misfire_policy": "fire_once",
        "overlap_policy": "allow",
        "max_attempts": "3",
        "jitter": "0",
        "enabled": "on",
    }
    unknown = ui.post_form("/new", form | {"task": "no.such.task"})
    assert unknown.status == 400
    assert re.search(r'id="task-error">[^<]*not registered', unknown.body), unknown.body
    zone = ui.post_form("/new", form | {"tz": "Europe/Berlin"})
    assert zone.status == 400, "an interval has no zone, as in the CLI"
    assert 'id="tz-error"' in zone.body
    assert schedules.list() == []
    created = ui.post_form("/new", form)
    assert created.status == 303
    assert created.headers["location"] == "/schedules/fresh?done=created"
    assert schedules.get("fresh").definition.trigger.seconds == 600  # type: ignore[union-attr]
    duplicate = ui.post_form("/new", form)
    assert duplicate.status == 400
    assert 'id="name-error"' in duplicate.body


def test_a_name_with_a_slash_has_its_own_page_and_actions(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    schedules.create("reports/daily", "ui.job", every=60)
    ui = serve()
    page = ui.request("/schedules/reports%2Fdaily")
    assert page.status == 200
    assert 'action="/schedules/reports%2Fdaily/pause"' in page.body
    assert ui.post_form("/schedules/reports%2Fdaily/pause", {}).status == 303
    assert not schedules.get("reports/daily").definition.enabled


def test_an_unknown_schedule_is_404_with_what_to_do(serve: Callable[..., UI]) -> None:
    ui = serve()
    missing = ui.request("/schedules/nope")
    assert missing.status == 404
    assert "schedules list" in missing.body
    api = ui.request("/api/schedules/nope")
    assert api.status == 404
    assert "nope" in api.json()["error"]


def test_the_json_api_serves_the_documents_of_the_cli(
    serve: Callable[..., UI], schedules: Schedules, app: Celery
) -> None:
    schedules.create("documented", "ui.job", cron="0 9 * * 1-5", tz="Europe/Berlin")
    run = schedules.trigger_run("documented")
    ui = serve()
    shown = ui.request("/api/schedules/documented").json()
    cli = json.loads(invoke(app, "show", "documented", "--json").stdout)
    assert {k: v for k, v in shown.items() if k != "upcoming"} == {
        k: v for k, v in cli.items() if k != "upcoming"
    }
    assert len(shown["upcoming"]) == 10
    assert shown["upcoming"][:5] == cli["upcoming"]
    listed = ui.request("/api/schedules?q=document").json()
    assert listed["total"] == 1
    assert listed["schedules"][0]["name"] == "documented"
    runs = ui.request("/api/schedules/documented/runs").json()
    assert [r["id"] for r in runs["runs"]] == [str(run.id)]
    assert ui.request(f"/api/runs/{run.id}").json()["state"] == "pending"
    assert ui.request("/api/schedules?limit=0").status == 400
    assert ui.request("/api/stats?window=2y").status == 400
    assert ui.request("/api/runs/not-a-uuid").status == 400


def test_the_ui_refuses_to_serve_other_hosts_without_a_password(app: Celery) -> None:
    exposed = invoke(app, "ui", "--address", "0.0.0.0", "--port", "1")
    assert exposed.exit_code == 2
    assert error_lines(exposed) == [
        "Error: refusing to listen on 0.0.0.0 without a password: give --basic-auth"
        " user:password (or HABEAT_UI_BASIC_AUTH), or listen on 127.0.0.1"
    ]
    malformed = invoke(app, "ui", "--basic-auth", "admin")
    assert malformed.exit_code == 2
    assert "user:password" in error_lines(malformed)[0]
    flower = invoke(app, "ui", "--flower-url", "localhost:5555")
    assert flower.exit_code == 2
    assert "http://localhost:5555" in error_lines(flower)[0]


def test_a_trigger_posted_twice_queues_one_run(
    serve: Callable[..., UI], schedules: Schedules, store: Store
) -> None:
    schedules.create("once-please", "ui.job", every=3600)
    schedules.create("other", "ui.job", every=3600)
    ui = serve()
    page = ui.request("/schedules/once-please")
    run_id = re.search(r'name="run_id" value="([0-9a-f-]{36})"', page.body)
    assert run_id is not None, "the trigger form carries the run ID it will queue"
    token = ui.token()
    for _ in range(3):  # a double click, then a resent request
        posted = ui.post_form("/schedules/once-please/trigger", {"run_id": run_id[1]}, token)
        assert posted.status == 303
    assert [str(run.id) for run in schedules.runs("once-please")] == [run_id[1]]
    stolen = ui.post_form("/schedules/other/trigger", {"run_id": run_id[1]}, token)
    assert stolen.status == 400, "another schedule's run ID is refused"
    assert schedules.runs("other") == []
    assert ui.post_form("/schedules/other/trigger", {"run_id": "x"}, token).status == 400
    fresh = re.search(
        r'name="run_id" value="([0-9a-f-]{36})"', ui.request("/schedules/once-please").body
    )
    assert fresh is not None
    assert fresh[1] != run_id[1], "each page offers a new run"


def test_postgres_unreachable_is_a_503_that_says_so_on_pages_and_api(app: Celery) -> None:
    closed = Store.connect("postgresql+psycopg://postgres@127.0.0.1:1/habeat_nowhere")
    try:
        with BackgroundUI(Schedules(closed, app=app), UISettings(port=0)) as server:
            ui = UI(server.url.rstrip("/"))
            page = ui.request("/schedules/any")
            assert page.status == 503
            assert "PostgreSQL at" in page.body
            assert "is unreachable" in page.body
            api = ui.request("/api/schedules")
            assert api.status == 503
            assert "is unreachable" in api.json()["error"]
    finally:
        closed.dispose()


def test_the_cluster_page_lists_the_consumers_that_do_not_record_runs(
    serve: Callable[..., UI], store: Store
) -> None:
    """issue 38, finding 1: what the leader found about a worker without this package on
    beat's queue is on the cluster page, in its table and in the health table."""
    assert store.take_leadership(1, "leader")
    store.record_consumers(1, [("celery", "celery@old-image")], forget_after=3600)
    page = serve().request("/cluster")
    assert page.status == 200
    table = page.body[page.body.index('id="unrecorded-consumers"') :]
    assert "celery@old-image" in table[: table.index("</table>")]
    assert "consuming" in table[: table.index("</table>")]
    health = page.body[page.body.index('id="health"') :]
    assert "queue celery is consumed by celery@old-image" in health[: health.index("</table>")]


def test_a_name_with_spaces_from_celerys_docs_syncs_and_travels_every_path(
    serve: Callable[..., UI], schedules: Schedules, app: Celery
) -> None:
    """issue 36, finding 1: a beat_schedule entry named 'add every 10' (Celery's docs) is
    synced as written; the CLI takes it as one argument, the UI links it percent-encoded,
    its form creates one with the name kept exactly, and its pages act on it."""
    name = "add every 10"
    app.conf.beat_schedule = {name: {"task": "ui.job", "schedule": 10.0, "args": ("x",)}}
    synced = invoke(app, "sync")
    assert synced.exit_code == 0, synced.stderr
    shown = invoke(app, "show", name, "--json")
    assert shown.exit_code == 0, shown.stderr
    assert json.loads(shown.stdout)["name"] == name
    ui = serve()
    listing = ui.request("/")
    assert 'href="/schedules/add%20every%2010"' in listing.body
    page = ui.request("/schedules/add%20every%2010")
    assert page.status == 200
    assert 'action="/schedules/add%20every%2010/pause"' in page.body
    assert 'href="/plots?schedule=add+every+10"' in page.body
    assert ui.request("/plots?schedule=add+every+10").status == 200
    assert ui.request("/api/schedules/add%20every%2010").json()["name"] == name
    assert ui.post_form("/schedules/add%20every%2010/pause", {}).status == 303
    assert not schedules.get(name).definition.enabled
    form = {
        "name": " 1 sec queue probe #2? ",
        "task": "ui.job",
        "kind": "every",
        "timing": "10m",
        "misfire_policy": "fire_once",
        "overlap_policy": "allow",
        "max_attempts": "3",
        "jitter": "0",
        "enabled": "on",
    }
    created = ui.post_form("/new", form)
    assert created.status == 303, created.body
    location = "/schedules/%201%20sec%20queue%20probe%20%232%3F%20?done=created"
    assert created.headers["location"] == location
    assert ui.request(location).status == 200
    assert schedules.get(" 1 sec queue probe #2? ").definition.enabled
