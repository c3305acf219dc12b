"""Adoption by an existing project: the wheel, installed into a fresh venv, runs
a plain Celery project (its own ``app.py`` and ``tasks.py``) and a Django project
(``examples/``) with their own ``beat_schedule``, and shadows none of their modules."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
import redis
from sqlalchemy.engine import make_url

from tests.conftest import ADMIN_DATABASE_URL, REDIS_TEST_URL

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: Seconds a started project gets to fire and run its every-2-s schedule three times.
FIRE_TIMEOUT = 60.0


@dataclass(frozen=True)
class FreshVenv:
    python: Path
    celery: Path
    site_packages: Path
    wheel: Path


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> FreshVenv:
    """The project's wheel, built from this checkout, in a venv of its own (with Django)."""
    where = tmp_path_factory.mktemp("adoption")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(where), str(ROOT)])
    (wheel,) = where.glob("celery_habeat-*.whl")
    venv = where / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", str(wheel), "django>=4.2,<6"])
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        env=_isolated_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return FreshVenv(python, venv / "bin" / "celery", Path(site), wheel)


@dataclass
class Project:
    """A copy of an example project with a database and Redis keys of its own."""

    name: str  # the -A argument
    directory: Path
    env: dict[str, str]
    database: str
    venv: FreshVenv

    def celery(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.venv.celery), "-A", self.name, *args],
            cwd=self.directory,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        with (self.directory / f"{args[0]}.log").open("wb") as log:
            return subprocess.Popen(
                [str(self.venv.celery), "-A", self.name, *args, "-l", "info"],
                cwd=self.directory,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def pings(self) -> list[str]:
        log = self.directory / "ping.log"
        return log.read_text().splitlines() if log.exists() else []

    def run_states(self) -> dict[str, int]:
        with psycopg.connect(self.env["SCHEDULES_DATABASE_URL"]) as conn:
            rows = conn.execute("SELECT state, count(*) FROM beat_runs GROUP BY state").fetchall()
        return {state: count for state, count in rows}

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-6000:]}"
            for log in sorted(self.directory.glob("*.log"))
        )


def _project(venv: FreshVenv, example: str, name: str, tmp_path: Path) -> Iterator[Project]:
    directory = tmp_path / example
    shutil.copytree(EXAMPLES / example, directory)
    database = f"habeat_adopt_{uuid.uuid4().hex[:10]}"
    admin = make_url(ADMIN_DATABASE_URL).set(drivername="postgresql")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    prefix = f"habeat-adopt-{uuid.uuid4().hex[:8]}"
    env = _isolated_env() | {
        "SCHEDULES_DATABASE_URL": admin.set(database=database).render_as_string(
            hide_password=False
        ),
        "BROKER_URL": REDIS_TEST_URL,
        # The lease's keys, apart from every other test's (an environment fallback).
        "HABEAT_KEY_PREFIX": prefix,
        "PING_LOG": str(directory / "ping.log"),
        "PYTHONUNBUFFERED": "1",
    }
    project = Project(name, directory, env, database, venv)
    try:
        yield project
    finally:
        _delete_broker_keys(prefix)
        with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _delete_broker_keys(lease_prefix: str) -> None:
    """The example projects use the broker's default keys on the tests' Redis DB."""
    client = redis.Redis.from_url(REDIS_TEST_URL)
    patterns = (f"{lease_prefix}*", "celery", "_kombu.binding*", "unacked*", "habeat.dead*")
    for pattern in patterns:
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
    client.close()


@pytest.fixture
def plain_project(fresh_venv: FreshVenv, tmp_path: Path) -> Iterator[Project]:
    yield from _project(fresh_venv, "celery_project", "app", tmp_path)


@pytest.fixture
def django_project(fresh_venv: FreshVenv, tmp_path: Path) -> Iterator[Project]:
    yield from _project(fresh_venv, "django_project", "proj", tmp_path)


def test_the_wheel_installs_one_package_and_shadows_no_project_module(
    fresh_venv: FreshVenv, plain_project: Project
) -> None:
    with zipfile.ZipFile(fresh_venv.wheel) as wheel:
        top_level = {name.split("/")[0] for name in wheel.namelist()}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"beat"}
    for generic in ("app", "tasks"):
        assert not (fresh_venv.site_packages / generic).exists()
        assert not (fresh_venv.site_packages / f"{generic}.py").exists()
    imported = subprocess.run(
        [str(fresh_venv.python), "-c", "import app, tasks; print(app.__file__, tasks.__file__)"],
        cwd=plain_project.directory,
        env=plain_project.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert [Path(path).parent for path in imported] == [plain_project.directory] * 2


def test_a_plain_celery_project_syncs_and_fires_its_beat_schedule(plain_project: Project) -> None:
    _migrate_run_and_check(plain_project, beat_args=("beat", "-S", "ha"))


def test_a_django_project_configured_in_its_settings(django_project: Project) -> None:
    # beat_scheduler comes from CELERY_BEAT_SCHEDULER, the database from
    # CELERY_HABEAT_DATABASE_URL: `celery -A proj beat` needs no option.
    listed = _migrate_run_and_check(django_project, beat_args=("beat",))
    zones = {schedule["name"]: schedule["timezone"] for schedule in listed}
    assert zones["close-day"] == "Europe/Berlin"  # CELERY_TIMEZONE, as Celery's beat reads it


def test_an_app_that_names_no_database_is_told_which_setting_to_add(
    plain_project: Project,
) -> None:
    plain_project.env.pop("SCHEDULES_DATABASE_URL")
    (plain_project.directory / "app.py").write_text(
        (plain_project.directory / "app.py")
        .read_text()
        .replace("habeat_database_url=os.environ.get(", "unused=os.environ.get(")
    )
    listed = plain_project.celery("schedules", "list")
    assert listed.returncode == 2, listed.stderr
    (line,) = listed.stderr.strip().splitlines()
    assert "habeat_database_url" in line
    assert "HABEAT_DATABASE_URL" in line

    beat = plain_project.celery("beat", "-S", "ha")
    assert beat.returncode == 2, beat.stderr
    (line,) = [line for line in beat.stderr.splitlines() if "beat cannot start" in line]
    assert "habeat_database_url" in line
    assert "Traceback" not in beat.stderr


def _migrate_run_and_check(project: Project, *, beat_args: tuple[str, ...]) -> list[dict[str, str]]:
    migrated = project.celery("schedules", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    worker = project.start("worker", "-c", "1")
    beat = project.start(*beat_args)
    try:
        deadline = time.monotonic() + FIRE_TIMEOUT
        while time.monotonic() < deadline:
            if len(project.pings()) >= 3 and project.run_states().get("succeeded", 0) >= 3:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the project's schedule did not run 3 times\n{project.logs()}")
        listed = project.celery("schedules", "list", "--json")
    finally:
        for process in (beat, worker):
            process.terminate()
        for process in (beat, worker):
            process.wait(timeout=30)
    assert listed.returncode == 0, listed.stderr
    schedules: list[dict[str, str]] = json.loads(listed.stdout)
    names = {schedule["name"] for schedule in schedules}
    assert "ping-every-2s" in names
    # Each delivery of a plain task ran once: one line per run ID.
    pings = project.pings()
    assert len(pings) == len({line.split()[1] for line in pings})
    assert all(line.startswith("interval ") for line in pings)
    _first_monday_fires_on_a_monday_in_days_1_to_7(schedules)
    return schedules


def _first_monday_fires_on_a_monday_in_days_1_to_7(schedules: list[dict[str, str]]) -> None:
    for schedule in schedules:
        if schedule["name"] == "report-first-monday":
            fire = datetime.fromisoformat(schedule["next_fire_at"])
            assert (fire.weekday(), fire.day <= 7) == (0, True), fire


def _isolated_env() -> dict[str, str]:
    """This environment without what points into this checkout or configures its app: the
    fresh venv must see only the wheel (PYTHONPATH would show it the checkout)."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("HABEAT_", "CELERY_", "DATABASE_URL", "REDIS_URL", "PYTHONPATH"))
    }


def _run(command: list[str]) -> None:
    done = subprocess.run(command, env=_isolated_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_wheel_builds_without_a_warning_and_holds_every_module_and_its_data(
    tmp_path: Path,
) -> None:
    """Every sub-package is listed (a forgotten one would be left out of the wheel, or
    only warned of), and the UI's templates and stylesheet and the migrations' template
    travel as data."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        env=_isolated_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    output = built.stdout + built.stderr
    for warning in ("would be ignored", "is absent from the `packages`", "SetuptoolsDeprecation"):
        assert warning not in output
    (wheel,) = tmp_path.glob("celery_habeat-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
    source = ROOT / "beat"
    expected = {
        path.relative_to(ROOT).as_posix()
        for pattern in ("**/*.py", "ui/templates/*.html", "ui/static/*.css", "**/*.mako")
        for path in source.glob(pattern)
        if "__pycache__" not in path.parts
    } | {"beat/py.typed"}
    assert expected - shipped == set()
