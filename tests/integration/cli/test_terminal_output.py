"""What ``celery -A app schedules ...`` prints holds no raw control character, whatever
the database holds: a worker's error, a task's arguments, a schedule's name written
with psql. An escape sequence printed raw is run by the operator's terminal (OSC 52
sets the clipboard, CSI rewrites the screen, U+202E reorders the line), so every
value is shown escaped (``\\x1b``), and a newline inside a value stays inside its cell.

The real command line runs as a subprocess for the regression tests; the fuzz tests
at the end draw the values with hypothesis and run every command in-process (the
same ones each run, ``derandomize``; ``HABEAT_FUZZ_EXAMPLES`` for a longer run, as in
``test_fuzz_input``).
"""

from __future__ import annotations

import json
import os
import unicodedata
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import Result
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from app.factory import create_app
from beat.lease.holder import lock_key
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.integration.helpers import celery_cli, invoke

pytestmark = pytest.mark.integration

#: What a hostile worker result or psql row carries: OSC 52 (set the clipboard to a
#: command), CSI (clear the screen), C1 CSI, a bidi override, a newline and DEL.
OSC52 = "\x1b]52;c;cm0gLXJmIH4K\x07"
CLEAR = "\x1b[2J\x1b[H"
HOSTILE_NAME = f"nightly{OSC52}{CLEAR}\u202eevil"
HOSTILE_TASK = "tasks.demo.add\x1b[31m\x9b2J"
HOSTILE_ERROR = f"boom{OSC52}\nsecond line{CLEAR}\x7f"
HOSTILE_WORKER = "w1@host\x1b[8m\u2028"
HOSTILE_KWARGS = {f"k{OSC52}": f"v{CLEAR}\u202e"}
HOSTILE_REASON = f"quarantined by psql{CLEAR}"


def raw_controls(output: str) -> list[str]:
    """The characters a terminal would act on rather than show: control (C0 but the
    newlines the tool writes, DEL, C1), format (bidi overrides, zero-width), line and
    paragraph separators, lone surrogates."""
    found = {
        char
        for char in output
        if char != "\n" and unicodedata.category(char) in {"Cc", "Cf", "Cs", "Zl", "Zp"}
    }
    return sorted(repr(char) for char in found)


@dataclass(frozen=True)
class Hostile:
    """One schedule, its failed run and its leader, as psql and a hostile worker leave
    them; and a schedule in code."""

    name: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    reason: str
    quarantined: bool
    error: str
    worker: str
    holder: str
    code_name: str
    code_task: str


def write_hostile(store: Store, client: redis.Redis, prefix: str, row: Hostile) -> None:
    """Empty tables, then ``row``'s schedule, run and leader (PostgreSQL and Redis)."""
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "TRUNCATE beat_runs, beat_schedules, beat_leader, beat_incidents,"
                " beat_notifications, beat_channels RESTART IDENTITY"
            )
        )
        conn.execute(
            text(
                "INSERT INTO beat_schedules (name, task, trigger_kind, every_seconds, anchor_at,"
                " next_fire_at, args, kwargs, quarantined_at, disabled_reason)"
                " VALUES (:name, :task, 'every', 60, now(), now() + interval '1 minute',"
                " CAST(:args AS jsonb), CAST(:kwargs AS jsonb),"
                " CASE WHEN :quarantined THEN now() END, :reason)"
            ),
            {
                "name": row.name,
                "task": row.task,
                "args": json.dumps(row.args),
                "kwargs": json.dumps(row.kwargs),
                "quarantined": row.quarantined,
                "reason": row.reason,
            },
        )
        conn.execute(
            text(
                "INSERT INTO beat_runs (id, schedule_id, schedule_name, task, args, kwargs,"
                " fire_at, state, attempt, worker, error, reason, finished_at)"
                " SELECT :id, id, name, task, args, kwargs, now() - interval '1 minute',"
                " 'failed', 1, :worker, :error, :error, now() FROM beat_schedules"
            ),
            {"id": uuid.uuid4(), "worker": row.worker, "error": row.error},
        )
        conn.execute(
            text(
                "INSERT INTO beat_incidents (schedule_id, schedule_name, kind, epoch, failures,"
                " last_error, resolution, resolved_at)"
                " SELECT id, name, 'failing', 7, 3, :error, :reason, now() FROM beat_schedules"
            ),
            {"error": row.error, "reason": row.reason},
        )
        conn.execute(
            text(
                "INSERT INTO beat_channels (name, kind, target) VALUES (:name, 'email', :target)"
                " ON CONFLICT DO NOTHING"
            ),
            {"name": row.name, "target": f"smtp://{row.worker}:{row.error}@mail?to={row.name}"},
        )
        conn.execute(
            text("INSERT INTO beat_leader (name, epoch, holder) VALUES (:prefix, 7, :holder)"),
            {"prefix": prefix, "holder": row.holder},
        )
    client.set(lock_key(prefix), row.holder, px=60_000)


#: All of them in one schedule, its failed run and its leader.
HOSTILE = Hostile(
    name=HOSTILE_NAME,
    task=HOSTILE_TASK,
    args=[OSC52],
    kwargs=HOSTILE_KWARGS,
    reason=HOSTILE_REASON,
    quarantined=True,
    error=HOSTILE_ERROR,
    worker=HOSTILE_WORKER,
    holder=HOSTILE_WORKER,
    code_name=HOSTILE_NAME,
    code_task=HOSTILE_TASK,
)


def test_show_runs_and_list_print_hostile_bytes_escaped(
    test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    """issue 29, finding 7: a name, a task, an error, a worker, kwargs and a quarantine
    reason holding OSC 52, CSI, C1, DEL, U+2028 and U+202E reach the terminal escaped."""
    write_hostile(store, redis_client, test_env.key_prefix, HOSTILE)
    for args in (("show", HOSTILE_NAME), ("runs",), ("runs", HOSTILE_NAME), ("list",)):
        done = celery_cli(test_env, *args)
        assert done.returncode == 0, done.stderr
        assert raw_controls(done.stdout + done.stderr) == [], args
        assert "\\x1b]52;c;" in done.stdout, "the value is shown, escaped"


def test_a_newline_in_a_value_stays_in_its_row(
    test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    """issue 29, finding 7: a worker's name with U+2028 and an error with a newline are
    one row of the runs table (the error cell shows a traceback's lines joined)."""
    write_hostile(store, redis_client, test_env.key_prefix, HOSTILE)
    done = celery_cli(test_env, "runs")
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.startswith("RUN ID")
    assert len(rows) == 1, rows
    assert "w1@host\\x1b[8m\\u2028" in rows[0]
    assert "boom\\x1b]52;c;cm0gLXJmIH4K\\x07 second line" in rows[0]


def test_the_json_documents_escape_every_control_character(
    test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    """issue 29, finding 7: ``--json`` prints escapes too (and the values, whole)."""
    write_hostile(store, redis_client, test_env.key_prefix, HOSTILE)
    shown = celery_cli(test_env, "show", HOSTILE_NAME, "--json")
    runs = celery_cli(test_env, "runs", "--json")
    for done in (shown, runs):
        assert done.returncode == 0, done.stderr
        assert raw_controls(done.stdout + done.stderr) == []
    document: dict[str, Any] = json.loads(shown.stdout)
    assert (document["name"], document["kwargs"]) == (HOSTILE_NAME, HOSTILE_KWARGS)
    assert json.loads(runs.stdout)[0]["error"] == HOSTILE_ERROR


def test_an_argument_that_is_not_utf8_is_refused_in_one_line(
    test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    """issue 29, finding 7 (found by the fuzz below): a byte that is not UTF-8 in a name
    (Python reads it as a lone surrogate) reached the driver, which printed a traceback
    (``UnicodeEncodeError: ... surrogates not allowed``)."""
    done = celery_cli(test_env, "show", "nightly\udcff")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("Error: argument 2 of `schedules` is not UTF-8 text")
    assert len(done.stderr.splitlines()) == 1


# -- fuzz: every command, values drawn ---------------------------------------------------------

LONG_RUN = int(os.environ.get("HABEAT_FUZZ_EXAMPLES", "0"))


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=LONG_RUN or examples,
        derandomize=not LONG_RUN,
        database=None,
        deadline=None,
        # One store and app serve every example; each example starts from empty tables.
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


#: What terminals act on, and what a hostile value would carry: single characters
#: (C0, DEL, C1, bidi, zero-width, separators) and whole sequences.
ACTED_ON = [chr(code) for code in [*range(1, 32), *range(127, 160)]] + [
    "\u061c", "\u200b", "\u200d", "\u200e", "\u200f", "\u2028", "\u2029", "\u202a",
    "\u202e", "\u2066", "\u2069", "\ufeff", "\U000e0041",
]  # fmt: skip
SEQUENCES = [OSC52, CLEAR, "\x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\", "\x9b31m",
             "\x1bP+q544e\x1b\\", "\x1b[6n", "\x1b]0;title\x07", "\r\x1b[K"]  # fmt: skip


def stored(*, min_size: int = 0) -> st.SearchStrategy[str]:
    """Text PostgreSQL stores (no NUL, no lone surrogate), rich in what terminals act on."""
    return st.lists(
        st.one_of(
            st.sampled_from(ACTED_ON),
            st.sampled_from(SEQUENCES),
            st.characters(codec="utf-8", exclude_characters="\x00"),
            st.text("abc:/@._- ", max_size=4),
        ),
        min_size=min_size,
        max_size=8,
    ).map("".join)


stored_text = stored()
#: What a command line can carry besides: lone surrogates (bytes that are not UTF-8,
#: as Python decodes them from argv).
typed_text = st.one_of(
    stored_text, st.tuples(stored_text, st.sampled_from(["\udc80", "\udcff"])).map("".join)
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), stored_text),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(stored_text, inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def hostile_rows(draw: st.DrawFn) -> Hostile:
    name = draw(stored(min_size=1))
    return Hostile(
        name=name,
        task=draw(st.one_of(st.just("tasks.demo.add"), stored_text)),
        args=draw(st.lists(json_values, max_size=3)),
        kwargs=draw(st.dictionaries(stored_text, json_values, max_size=3)),
        reason=draw(stored_text),
        quarantined=draw(st.booleans()),
        error=draw(stored_text),
        worker=draw(stored_text),
        holder=draw(stored(min_size=1)),
        code_name=draw(st.one_of(st.just(name), stored(min_size=1))),
        code_task=draw(st.one_of(st.just("tasks.demo.add"), stored_text)),
    )


def assert_terminal_safe(
    result: Result, command: tuple[str, ...], *, rows: int | None = None
) -> None:
    """A command's output: our exit codes, no traceback, nothing a terminal acts on;
    a table of ``rows`` rows has as many lines, whatever the values hold."""
    event(f"{' '.join(command[:2])}: exit {result.exit_code}")
    assert result.exit_code in (0, 1, 2), result.output
    assert raw_controls(result.stdout + result.stderr) == [], result.output
    if rows is not None:
        assert len(result.stdout.splitlines()) == 1 + rows, result.stdout


@pytest.fixture
def fuzz_app(test_env: SessionEnv, store: Store, redis_client: redis.Redis) -> Iterator[Celery]:
    app = create_app(test_env.settings())
    yield app
    app.conf.beat_schedule = {}


#: Commands run on each example, in this order (``remove`` last); ``{name}`` is the
#: schedule's name. ``runs`` and ``list`` come first, while there is one run and one row.
COMMANDS: list[tuple[str, ...]] = [
    ("show", "--", "{name}"),
    ("show", "--json", "--", "{name}"),
    ("list", "--json"),
    ("runs", "--json", "--", "{name}"),
    ("leader",),
    ("leader", "--json"),
    ("health",),
    ("health", "--json"),
    ("incidents", "--all"),
    ("incidents", "--all", "--json"),
    ("channels", "list"),
    ("channels", "list", "--json"),
    ("sync",),
    ("pause", "--", "{name}"),
    ("resume", "--", "{name}"),
    ("update", "--every", "120", "--", "{name}"),
    ("trigger", "--", "{name}"),
    ("backfill", "--from", "{hour_ago}", "--to", "{now}", "--json", "--", "{name}"),
    ("prune", "--older-than", "1d"),
    ("remove", "--", "{name}"),
]


@fuzz_settings(25)
@given(row=hostile_rows())
def test_no_command_prints_what_a_terminal_acts_on(
    row: Hostile,
    fuzz_app: Celery,
    test_env: SessionEnv,
    store: Store,
    redis_client: redis.Redis,
) -> None:
    """issue 29, finding 7 (fuzz): whatever a schedule's name, task, arguments, quarantine
    reason, its run's error and worker, the leader's name and a code schedule's name
    hold, every command's text and JSON hold no character a terminal acts on, and the
    tables keep one line a row."""
    write_hostile(store, redis_client, test_env.key_prefix, row)
    fuzz_app.conf.beat_schedule = {row.code_name: {"task": row.code_task, "schedule": 60.0}}
    for table in (("list",), ("runs",), ("runs", "--", row.name)):
        assert_terminal_safe(invoke(fuzz_app, *table), table, rows=1)
    now = datetime.now(UTC)
    values = {
        "name": row.name,
        "now": now.isoformat(),
        "hour_ago": (now - timedelta(hours=1)).isoformat(),
    }
    for command in COMMANDS:
        result = invoke(fuzz_app, *(part.format(**values) for part in command))
        assert_terminal_safe(result, command)


#: Commands whose arguments are what a person typed (and not found, or not valid).
TYPED: list[tuple[str, ...]] = [
    ("show", "{x}"),
    ("runs", "{x}"),
    ("runs", "--state", "{x}"),
    ("runs", "--since", "{x}"),
    ("pause", "{x}"),
    ("remove", "{x}", "--json"),
    ("trigger", "{x}"),
    ("add", "{x}", "tasks.demo.add", "--every", "60", "--args", "[1, 2]"),
    ("add", "fuzzed", "{x}", "--every", "60"),
    ("add", "fuzzed", "tasks.demo.add", "--cron", "{x}"),
    ("add", "fuzzed", "tasks.demo.add", "--every", "{x}"),
    ("add", "fuzzed", "tasks.demo.add", "--every", "60", "--tz", "{x}"),
    ("add", "fuzzed", "tasks.demo.add", "--at", "{x}"),
    ("add", "fuzzed", "tasks.demo.add", "--every", "60", "--args", "{x}"),
    ("add", "fuzzed", "tasks.demo.add", "--every", "60", "--kwargs", "{x}"),
    ("add", "fuzzed", "tasks.demo.add", "--every", "60", "--queue", "{x}"),
    ("update", "{x}", "--every", "60"),
    ("update", "{x}", "--alert-after-failures", "{x}"),
    ("channels", "remove", "{x}"),
    ("channels", "add", "{x}", "--webhook", "https://hooks.example.com/x"),
    ("channels", "add", "fuzzed", "--webhook", "{x}"),
    ("channels", "add", "fuzzed", "--email", "{x}", "--from", "{x}", "--to", "{x}"),
    ("backfill", "{x}", "--from", "{x}", "--to", "2027-01-01T00:00:00+00:00"),
    ("prune", "--older-than", "{x}"),
    ("ui", "--basic-auth", "{x},no-colon"),
    ("ui", "--flower-url", "ftp:{x}"),
    ("{x}",),
]


@fuzz_settings(60)
@given(typed=typed_text)
def test_no_error_repeats_what_a_terminal_acts_on(
    typed: str, fuzz_app: Celery, store: Store, redis_client: redis.Redis
) -> None:
    """issue 29, finding 7 (fuzz): a name or value typed on the command line (argv holds
    no NUL) comes back in an error, a usage error or a result escaped."""
    for command in TYPED:
        result = invoke(fuzz_app, *(part.format(x=typed) for part in command))
        assert_terminal_safe(result, command)
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM beat_schedules"))
