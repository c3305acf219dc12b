"""psycopg's ``prepare_threshold`` from the database URL: a count or ``none``, or, left
out, each connection's own check (prepared statements only when it reaches the server
itself: behind PgBouncer in transaction mode they would meet another backend's)."""

from __future__ import annotations

import pytest

from beat.errors import ConfigError
from beat.store.db import (
    DETECTED,
    Detected,
    create_store_engine,
    psycopg_conninfo,
    split_prepare_threshold,
)

URL = "postgresql+psycopg://u@db:6432/beat"


@pytest.mark.parametrize(
    ("query", "threshold"),
    [
        ("", DETECTED),
        ("?prepare_threshold=none", None),
        ("?prepare_threshold=None", None),
        ("?prepare_threshold=0", 0),
        ("?prepare_threshold=12", 12),
    ],
)
def test_the_threshold_leaves_the_url_for_psycopgs_keyword_off_unless_counted(
    query: str, threshold: int | Detected | None
) -> None:
    url, given = split_prepare_threshold(URL + query)
    assert given == threshold
    assert "prepare_threshold" not in url.render_as_string(hide_password=False)


def test_other_parameters_stay_in_the_url() -> None:
    url, _ = split_prepare_threshold(URL + "?sslmode=require&prepare_threshold=none")
    assert dict(url.query) == {"sslmode": "require"}


def test_a_threshold_that_is_no_count_is_refused_naming_the_fix() -> None:
    with pytest.raises(ConfigError, match="give a count of executions, or none"):
        split_prepare_threshold(URL + "?prepare_threshold=off")


def test_the_engine_and_the_idle_connections_never_pass_it_to_libpq() -> None:
    engine = create_store_engine(URL + "?prepare_threshold=5")
    try:
        assert "prepare_threshold" not in engine.url.render_as_string(hide_password=False)
    finally:
        engine.dispose()
    assert "prepare_threshold" not in psycopg_conninfo(URL + "?prepare_threshold=none")
