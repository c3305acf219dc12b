"""The write API over real HTTP, in-process against real PostgreSQL and Redis: each
operation, its problem documents, ETags and If-Match, idempotent creates and triggers,
API tokens and roles, and the audit log's record of each write."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import text

from beat.models import ChangeAction, ChangeEntry, Role
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.ui.security import FormTokens
from tests.integration.helpers import run_rows, table_rows
from tests.integration.ui import test_ui_http
from tests.integration.ui.test_ui_http import PASSWORD, UI, USER

pytestmark = pytest.mark.integration

#: The UI's fixtures, shared with the tests of its pages.
app, serve, schedules = test_ui_http.app, test_ui_http.serve, test_ui_http.schedules

NIGHTLY = {"name": "nightly", "task": "ui.job", "cron": "30 2 * * *", "tz": "Europe/Berlin"}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    document: Any


def call(
    ui: UI,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str | None = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> Answer:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(ui.base + path, data=data, method=method)
    if data is not None and raw is None:
        request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    elif ui.authorization is not None:
        request.add_header("Authorization", ui.authorization)
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
            found = {key.lower(): value for key, value in response.headers.items()}
            return Answer(response.status, found, json.loads(text) if text else None)
    except urllib.error.HTTPError as exc:
        with exc:
            text = exc.read().decode()
            found = {key.lower(): value for key, value in exc.headers.items()}
            return Answer(exc.code, found, json.loads(text) if text else None)


@pytest.fixture
def api(serve: Callable[..., UI]) -> UI:
    return serve(users={USER: PASSWORD})


def test_a_schedule_is_created_read_changed_and_deleted(api: UI, schedules: Schedules) -> None:
    created = call(api, "POST", "/api/schedules", NIGHTLY | {"kwargs": {"label": "x"}})
    assert created.status == 201, created.document
    assert created.headers["location"] == "/api/schedules/nightly"
    assert created.document["schedule"] == "cron 30 2 * * *"
    assert created.document["version"] == 1
    read = call(api, "GET", "/api/schedules/nightly")
    assert read.headers["etag"] == created.headers["etag"]

    patched = call(api, "PATCH", "/api/schedules/nightly", {"max_attempts": 5})
    assert patched.status == 200, patched.document
    assert (patched.document["max_attempts"], patched.document["kwargs"]) == (5, {"label": "x"})
    replaced = call(api, "PUT", "/api/schedules/nightly", {"task": "ui.job", "every": "10m"})
    assert replaced.status == 200, replaced.document
    assert replaced.document["schedule"] == "every 600s"
    assert (replaced.document["max_attempts"], replaced.document["kwargs"]) == (3, {})

    assert call(api, "DELETE", "/api/schedules/nightly", {}).status == 204
    assert call(api, "GET", "/api/schedules/nightly").status == 404
    log = list(reversed(schedules.audit("nightly")))
    assert [change.action for change in log] == [
        ChangeAction.CREATE,
        ChangeAction.UPDATE,
        ChangeAction.UPDATE,
        ChangeAction.DELETE,
    ]
    assert {(c.actor, c.entry, c.address) for c in log} == {(USER, ChangeEntry.API, "127.0.0.1")}


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (NIGHTLY | {"cron": "61 2 * * *"}, 422, "cron"),
        (NIGHTLY | {"colour": "red"}, 422, "colour"),
        (NIGHTLY | {"every": 60}, 422, "every"),
        ({"task": "ui.job", "cron": "* * * * *"}, 422, "name"),
        (NIGHTLY | {"args": {"not": "a list"}}, 422, "args"),
        (NIGHTLY | {"max_attempts": "three"}, 422, "max_attempts"),
        (NIGHTLY | {"tz": "Mars/Olympus"}, 422, "tz"),
        (NIGHTLY | {"task": "no.such.task"}, 422, "task"),
        ([1, 2], 400, None),
    ],
)
def test_a_refused_create_is_a_problem_naming_its_field_and_writes_nothing(
    api: UI, store: Store, body: Any, status: int, field: str | None
) -> None:
    before = table_rows(store)

    refused = call(api, "POST", "/api/schedules", body)

    assert refused.status == status, refused.document
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert refused.document["status"] == status
    assert refused.document.get("field") == field
    assert refused.document["detail"]
    assert table_rows(store) == before


def test_a_body_that_is_not_json_or_says_it_is_not_is_refused(api: UI, store: Store) -> None:
    before = table_rows(store)
    not_json = call(
        api, "POST", "/api/schedules", raw=b"{oops", headers={"Content-Type": "application/json"}
    )
    as_form = call(
        api,
        "POST",
        "/api/schedules",
        raw=b"name=x&task=ui.job",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert (not_json.status, as_form.status) == (400, 415)
    assert call(api, "POST", "/api/schedules", NIGHTLY).status == 201
    assert call(api, "POST", "/api/schedules", NIGHTLY).status == 409
    assert len(table_rows(store)) == len(before) + 1


def test_a_stale_if_match_is_refused_with_412_and_the_current_etag(
    api: UI, schedules: Schedules
) -> None:
    first = call(api, "POST", "/api/schedules", NIGHTLY)
    tag = first.headers["etag"]
    moved = call(
        api, "PATCH", "/api/schedules/nightly", {"max_attempts": 4}, headers={"If-Match": tag}
    )
    assert moved.status == 200

    stale = call(
        api, "PATCH", "/api/schedules/nightly", {"max_attempts": 9}, headers={"If-Match": tag}
    )
    gone = call(api, "DELETE", "/api/schedules/nightly", {}, headers={"If-Match": tag})

    assert (stale.status, gone.status) == (412, 412)
    assert stale.document["current_etag"] == moved.headers["etag"]
    assert "schedules audit nightly" in stale.document["detail"]
    assert schedules.get("nightly").definition.max_attempts == 4, "nothing overwritten"
    fresh = call(
        api, "DELETE", "/api/schedules/nightly", {}, headers={"If-Match": moved.headers["etag"]}
    )
    assert fresh.status == 204


def test_a_retried_create_with_its_idempotency_key_makes_one_schedule(
    api: UI, store: Store
) -> None:
    key = {"Idempotency-Key": "create-nightly-1"}
    first = call(api, "POST", "/api/schedules", NIGHTLY, headers=key)
    again = call(api, "POST", "/api/schedules", NIGHTLY, headers=key)
    other = call(api, "POST", "/api/schedules", NIGHTLY | {"name": "other"}, headers=key)

    assert (first.status, again.status) == (201, 200)
    assert again.document == first.document
    assert other.status == 409
    assert "another request" in other.document["detail"]
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM beat_schedules")).scalar_one() == 1


def test_a_retried_trigger_with_its_idempotency_key_queues_one_run(api: UI, store: Store) -> None:
    call(api, "POST", "/api/schedules", NIGHTLY)
    key = {"Idempotency-Key": "run-it-now"}

    first = call(api, "POST", "/api/schedules/nightly/trigger", {}, headers=key)
    again = call(api, "POST", "/api/schedules/nightly/trigger", {}, headers=key)
    unkeyed = call(api, "POST", "/api/schedules/nightly/trigger", {})

    assert (first.status, again.status, unkeyed.status) == (202, 202, 202)
    assert first.document["id"] == again.document["id"] != unkeyed.document["id"]
    assert len([row for row in run_rows(store) if row.schedule_name == "nightly"]) == 2


def test_pause_with_a_note_resume_backfill_and_restore(api: UI, schedules: Schedules) -> None:
    call(api, "POST", "/api/schedules", NIGHTLY)
    call(api, "PATCH", "/api/schedules/nightly", {"cron": "0 4 * * *"})

    paused = call(api, "POST", "/api/schedules/nightly/pause", {"note": "deploying"})
    resumed = call(api, "POST", "/api/schedules/nightly/resume", {})
    restored = call(api, "POST", "/api/schedules/nightly/restore", {"version": 1})
    window = {"from": "2026-01-01T00:00:00+00:00", "to": "2026-01-01T00:00:00+00:00"}
    backfilled = call(api, "POST", "/api/schedules/nightly/backfill", window)

    assert (paused.document["enabled"], paused.document["disabled_reason"]) == (False, "deploying")
    assert resumed.document["enabled"] is True
    assert restored.document["schedule"] == "cron 30 2 * * *"
    assert backfilled.status in (202, 422), (
        backfilled.document
    )  # a window past retention is refused
    assert schedules.audit("nightly")[0].action in (ChangeAction.RESTORE, ChangeAction.BACKFILL)


@pytest.mark.parametrize(
    ("role", "read", "pause", "create", "delete"),
    [
        (Role.VIEWER, 200, 403, 403, 403),
        (Role.OPERATOR, 200, 200, 403, 403),
        (Role.ADMIN, 200, 200, 201, 204),
    ],
)
def test_each_role_is_allowed_what_it_may_and_refused_the_rest(
    serve: Callable[..., UI],
    schedules: Schedules,
    role: Role,
    read: int,
    pause: int,
    create: int,
    delete: int,
) -> None:
    schedules.create("target", "ui.job", every=60)
    token = schedules.create_token(f"{role.value}-bot", role)
    ui = serve(users={USER: PASSWORD})

    assert call(ui, "GET", "/api/schedules/target", token=token).status == read
    assert call(ui, "POST", "/api/schedules/target/pause", token=token).status == pause
    made = call(ui, "POST", "/api/schedules", NIGHTLY, token=token)
    assert made.status == create
    assert call(ui, "DELETE", "/api/schedules/target", token=token).status == delete
    if pause == 200:
        change = next(c for c in schedules.audit("target") if c.action is ChangeAction.PAUSE)
        assert (change.actor, change.entry) == (f"token:{role.value}-bot", ChangeEntry.API)


def test_a_revoked_token_is_refused_at_once_and_a_token_in_the_query_never_counts(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    token = schedules.create_token("deploy-bot", Role.OPERATOR)
    ui = serve(users={USER: PASSWORD})
    assert call(ui, "GET", "/api/schedules", token=token).status == 200

    schedules.revoke_token("deploy-bot")

    assert call(ui, "GET", "/api/schedules", token=token).status == 401
    anonymous = UI(ui.base, None)
    assert call(anonymous, "GET", f"/api/schedules?token={token}").status == 401
    assert call(anonymous, "GET", f"/api/schedules?access_token={token}").status == 401
    assert call(ui, "GET", "/api/schedules", token="habeat_not-a-token").status == 401


def test_a_ui_user_s_role_limits_the_pages_forms_too(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    schedules.create("target", "ui.job", every=60)
    secret = b"s" * 32
    ui = serve(users={"viewer": "v-pass"}, roles={"viewer": Role.VIEWER}, secret=secret)
    form_token = (FormTokens(secret).issue("viewer"), "")

    page = ui.request("/schedules/target")

    assert page.status == 200
    assert "Pause" not in page.body, "no button it may not use"
    assert 'href="/new"' not in page.body
    assert ui.post_form("/schedules/target/pause", {}, form_token).status == 403
    assert ui.request("/new").status == 403
    assert call(ui, "PATCH", "/api/schedules/target", {"every": 30}).status == 403
    assert schedules.get("target").definition.enabled


def test_if_match_is_strong_single_and_checked_by_every_write_that_takes_it(
    api: UI, schedules: Schedules
) -> None:
    """A review's findings: a weak tag matched, a list never did, trigger and backfill
    ignored If-Match, and a restore that created a removed schedule passed it by."""
    tag = call(api, "POST", "/api/schedules", NIGHTLY).headers["etag"]
    current = call(api, "PATCH", "/api/schedules/nightly", {"max_attempts": 4}).headers["etag"]
    stale = {"If-Match": tag}

    assert (
        call(
            api,
            "PATCH",
            "/api/schedules/nightly",
            {"max_attempts": 6},
            headers={"If-Match": "W/" + current},
        ).status
        == 412
    )
    assert (
        call(
            api,
            "PATCH",
            "/api/schedules/nightly",
            {"max_attempts": 5},
            headers={"If-Match": f"{tag}, {tag}"},
        ).status
        == 400
    )
    assert call(api, "POST", "/api/schedules/nightly/trigger", {}, headers=stale).status == 412
    assert schedules.runs("nightly") == []
    call(api, "DELETE", "/api/schedules/nightly", {})
    assert (
        call(api, "POST", "/api/schedules/nightly/restore", {"version": 1}, headers=stale).status
        == 412
    )
    assert call(api, "POST", "/api/schedules/nightly/restore", {"version": 1}).status == 200


def test_every_answer_under_api_is_a_problem_document(api: UI) -> None:
    for path in ("/api", "/api/", "/api/nothing/here", "/api/schedules/x/y/z"):
        answer = call(api, "GET", path)
        assert answer.status == 404, path
        assert answer.headers["content-type"].startswith("application/problem+json"), path


def test_a_tampered_version_in_the_edit_form_is_no_server_error(
    serve: Callable[..., UI], schedules: Schedules
) -> None:
    schedules.create("target", "ui.job", every=60)
    ui = serve(users={USER: PASSWORD})
    form = {
        "kind": "every",
        "timing": "90",
        "task": "ui.job",
        "tz": "",
        "args": "[]",
        "kwargs": "{}",
    }
    for version in ("x.y", "1.notanumber", "../.."):
        answer = ui.post_form("/schedules/target/edit", form | {"version": version})
        assert answer.status == 409, version
    assert schedules.get("target").definition.trigger.seconds == 60  # type: ignore[union-attr]
