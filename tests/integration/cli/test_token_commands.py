"""`celery -A app schedules tokens` against real PostgreSQL: a token is printed once and
kept as its hash, listed with its role, revoked for good."""

from __future__ import annotations

import pytest
import redis
from celery import Celery
from sqlalchemy import text

from app.factory import create_app
from beat.models import Role
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.integration.helpers import as_json, error_lines, invoke

pytestmark = pytest.mark.integration


@pytest.fixture
def app(test_env: SessionEnv, store: Store, redis_client: redis.Redis) -> Celery:
    return create_app(test_env.settings(lock_ttl=3.0, max_wait=0.2))


def test_a_token_is_shown_once_kept_as_its_hash_listed_and_revoked(
    app: Celery, store: Store
) -> None:
    made = invoke(app, "tokens", "create", "billing", "--role", "operator")
    token = made.stdout.strip()

    assert made.exit_code == 0, made.stderr
    assert token.startswith("habeat_")
    assert "shown this once" in made.stderr
    with store.engine.connect() as conn:
        stored = conn.execute(text("SELECT token_hash FROM beat_api_tokens")).scalar_one()
    assert token not in stored, "only the hash is kept"
    assert Schedules(store).token_bearer(token) == ("billing", Role.OPERATOR)
    [listed] = as_json(invoke(app, "tokens", "list", "--json"))
    assert (listed["name"], listed["role"], listed["revoked_at"]) == ("billing", "operator", None)

    assert invoke(app, "tokens", "revoke", "billing").stdout.strip() == "revoked billing"

    assert Schedules(store).token_bearer(token) is None
    assert "revoked" in invoke(app, "tokens", "list").stdout
    again = invoke(app, "tokens", "create", "billing", "--role", "admin")
    assert again.exit_code == 2
    assert "exists (or existed" in error_lines(again)[0]


def test_a_token_without_a_known_role_or_of_no_name_is_refused(app: Celery) -> None:
    assert invoke(app, "tokens", "create", "x", "--role", "root").exit_code == 2
    assert invoke(app, "tokens", "create", " x", "--role", "admin").exit_code == 2
    missing = invoke(app, "tokens", "revoke", "nobody")
    assert missing.exit_code == 2
    assert "tokens list" in error_lines(missing)[0]
