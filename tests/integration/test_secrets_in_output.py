"""No secret given in a URL or an option comes back in what beat and the CLI print:
a password holding ``@`` (redis-py reads the user information up to the last ``@``),
a ``sslpassword=`` query value, a malformed ``--basic-auth``.

(``tests/unit/ops/test_secrets.py`` holds the masking function to every URL form;
``tests/e2e/test_secrets.py`` a whole cluster behind a private Redis.)
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis
from celery import Celery
from celery.bin.celery import celery as celery_main
from click.testing import CliRunner, Result
from sqlalchemy.engine import make_url

from app.factory import create_app
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.integration.helpers import ROOT, celery_cli, error_lines, invoke

pytestmark = pytest.mark.integration

SECRET = "Zq7-ssl-secret"


def invoke_with_env(app: Celery, env: dict[str, str], *args: str) -> Result:
    """``invoke`` with environment variables set for the call."""
    return CliRunner(env=env).invoke(
        celery_main, ["-A", app, "schedules", *args], catch_exceptions=False
    )


def with_password(url: str, password: str) -> str:
    """``url`` with ``password`` written into it as a person would: unencoded."""
    parsed = make_url(url)
    user = parsed.username or "postgres"
    head, _, rest = url.partition("://")
    return f"{head}://{user}:{password}@{rest.split('@', 1)[-1]}"


def test_migrate_and_health_print_the_database_url_without_its_sslpassword(
    test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    """issue 29, finding 8: `schedules migrate` printed ``?sslpassword=...`` whole, and
    so did `schedules health` (and the UI's cluster page, which shows the same checks)."""
    url = f"{test_env.database_url}?sslpassword={SECRET}"
    app = create_app(test_env.settings(database_url=url))
    for args in (("migrate",), ("migrate", "--json"), ("health",), ("health", "--json")):
        done = invoke(app, *args)
        assert SECRET not in done.output, args
        assert "sslpassword=***" in done.stdout, args


@pytest.mark.parametrize(
    "given",
    [":UiPw-" + SECRET, "admin:ok," + SECRET, "UiPw-" + SECRET + ":"],
    ids=["no-user", "no-colon", "no-password"],
)
def test_a_malformed_basic_auth_is_refused_without_repeating_it(app: Celery, given: str) -> None:
    """issue 29, finding 8: `--basic-auth` quoted a malformed pair back (`got ':UiPw-…'`)."""
    for refused in (
        invoke(app, "ui", "--basic-auth", given),
        invoke_with_env(app, {"HABEAT_UI_BASIC_AUTH": given}, "ui"),
    ):
        assert refused.exit_code == 2
        assert SECRET not in refused.output
        [line] = error_lines(refused)
        assert "user:password" in line


def test_a_flower_url_with_credentials_is_refused_without_them(app: Celery) -> None:
    """issue 29, finding 8: an --flower-url that is not http(s) was quoted whole."""
    refused = invoke(app, "ui", "--flower-url", f"ftp://admin:{SECRET}@flower:5555")
    assert refused.exit_code == 2
    assert SECRET not in refused.output
    assert "ftp://admin:***@flower:5555" in error_lines(refused)[0]


def test_a_database_password_holding_an_at_sign_is_refused_masked(
    test_env: SessionEnv, store: Store
) -> None:
    """issue 29, finding 8: SQLAlchemy reads a password up to its first ``@`` and takes
    the rest for the host, which PostgreSQL's error then quoted (``failed to resolve host
    'Zq7-ssl-secret@127.0.0.1'``): the URL is refused, masked, with the fix."""
    url = with_password(test_env.database_url, f"pa@{SECRET}")
    done = celery_cli(test_env, "list", DATABASE_URL=url)
    assert done.returncode == 2, done.stderr
    assert SECRET not in done.stdout + done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("Error: DATABASE_URL: its password holds an '@'")
    assert line.endswith("write each '@' in the password as %40")


def test_the_beat_banner_masks_a_redis_password_holding_an_at_sign(
    test_env: SessionEnv, store: Store, tmp_path: Path
) -> None:
    """issue 29, finding 8: with ``redis://:pa@ss@host`` (redis-py's password: ``pa@ss``)
    the banner showed ``redis://:***@ss@host``."""
    lease_url = f"redis://:pa@{SECRET}@127.0.0.1:6379/14"
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "app", "beat", "-l", "info", "--pidfile=",
         "-s", str(tmp_path / "beat-schedule")],
        cwd=ROOT,
        env=test_env.process_env(REDIS_URL=lease_url, HABEAT_REDIS_URL=lease_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    assert beat.stdout is not None
    shown: list[str] = []
    banner_seen = threading.Event()

    def read() -> None:
        assert beat.stdout is not None
        for line in beat.stdout:
            shown.append(line)
            if "leader lease ->" in line:
                banner_seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        banner_seen.wait(timeout=60)
    finally:
        beat.terminate()
        beat.wait(timeout=30)
        reader.join(timeout=10)
        beat.stdout.close()
    output = "".join(shown)
    assert banner_seen.is_set(), output
    assert SECRET not in output
    assert "leader lease -> redis://:***@127.0.0.1:6379/14" in output


@pytest.fixture
def app(test_env: SessionEnv, store: Store, redis_client: redis.Redis) -> Celery:
    return create_app(test_env.settings())
