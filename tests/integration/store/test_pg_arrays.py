"""Array literals (``beat.store.pg_arrays``) read back by PostgreSQL as the driver's own
arrays would be: the driver's dumping of the same lists is the oracle."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import BigInteger, Integer, Text, bindparam, select, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.engine import Connection

from beat.store.all_roles import Store
from beat.store.pg_arrays import (
    array_param,
    bigint_array,
    integer_array,
    text_array,
    time_array,
    uuid_array,
)
from beat.store.tables import TZ

ZONES = [UTC, ZoneInfo("Europe/Paris"), ZoneInfo("Asia/Kolkata"), ZoneInfo("America/St_Johns")]

aware_times = st.builds(
    lambda moment, zone: moment.replace(tzinfo=UTC).astimezone(zone),
    st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1)),
    st.sampled_from(ZONES),
)

CASES: list[tuple[Any, Callable[[Any], str], st.SearchStrategy[Any]]] = [
    (UUID(as_uuid=True), uuid_array, st.uuids()),
    (BigInteger, bigint_array, st.integers(-(2**63), 2**63 - 1)),
    (Integer, integer_array, st.integers(-(2**31), 2**31 - 1)),
    (TZ, time_array, st.one_of(st.none(), aware_times)),
    # Quotes, backslashes, braces, commas, spaces, "NULL" and the empty text.
    (
        Text,
        text_array,
        st.one_of(
            st.none(), st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
        ),
    ),
]


@pytest.fixture
def conn(store: Store) -> Iterator[Connection]:
    with store.engine.connect() as connection:
        yield connection


# Named by their function: the same names in every pytest process (pytest-xdist compares).
@pytest.mark.parametrize(
    ("item", "literal", "elements"), CASES, ids=[case[1].__name__ for case in CASES]
)
@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_literal_reads_back_as_the_drivers_array(
    conn: Connection,
    item: Any,
    literal: Callable[[Any], str],
    elements: st.SearchStrategy[Any],
    data: st.DataObject,
) -> None:
    values = data.draw(st.lists(elements, max_size=30))
    read = conn.execute(select(array_param("a", item)), {"a": literal(values)}).scalar_one()
    expected = conn.execute(select(bindparam("a", type_=ARRAY(item))), {"a": values}).scalar_one()
    assert read == expected == values


def test_a_naive_time_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(ValueError, match="no time zone"):
        time_array([datetime(2026, 12, 3, 12, 0)])


def test_a_literal_reaches_the_planner_as_one_constant_of_its_array_type(
    conn: Connection,
) -> None:
    """Cast in the statement instead (text to uuid[]), the literal stayed an expression:
    on a table without statistics the planner scanned it and parsed the literal
    again for every row, 20 s for 1,000 ids among 30,000 rows."""
    conn.execute(text("CREATE TEMP TABLE fresh (id uuid PRIMARY KEY, state text)"))
    conn.execute(
        text("INSERT INTO fresh SELECT gen_random_uuid(), 'pending' FROM generate_series(1, 30000)")
    )
    explain = text("EXPLAIN UPDATE fresh SET state = 'queued' WHERE id = ANY(:ids)").bindparams(
        array_param("ids", UUID(as_uuid=True))
    )
    ids = uuid_array(uuid.uuid4() for _ in range(1000))
    plan = "\n".join(row[0] for row in conn.execute(explain, {"ids": ids}))
    constant = re.search(r"ANY \('\{[0-9a-f,-]+\}'::uuid\[\]\)", plan)
    assert constant is not None, plan[:300]


def test_fire_times_of_a_burst_are_written_once_each() -> None:
    fire = datetime(2026, 12, 4, tzinfo=UTC)
    later = fire + timedelta(seconds=1)
    assert time_array([fire, fire, None, later, fire]) == (
        "{"
        + ",".join(
            [fire.isoformat(), fire.isoformat(), "NULL", later.isoformat(), fire.isoformat()]
        )
        + "}"
    )


def test_times_of_the_repeated_hour_keep_their_own_instant() -> None:
    """02:30 in Berlin happens twice on 2026-10-25 (``fold`` 0 and 1): the two compare
    equal in Python, yet are an hour apart; each keeps its own instant."""
    berlin = ZoneInfo("Europe/Berlin")
    first = datetime(2026, 10, 25, 0, 30, tzinfo=UTC).astimezone(berlin)
    second = datetime(2026, 10, 25, 1, 30, tzinfo=UTC).astimezone(berlin)
    assert first == second  # Python's comparison within one zone ignores fold
    assert time_array([first, second]) == ("{2026-10-25T00:30:00+00:00,2026-10-25T01:30:00+00:00}")


def test_copy_of_an_array_column_still_uses_the_drivers_dumper(store: Store) -> None:
    """The literals' dumpers are found by their class only: COPY, which looks dumpers
    up by type, still dumps a list as an array."""
    url = store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url) as connection:
        connection.execute("CREATE TEMP TABLE copied (tags text[])")
        with connection.cursor().copy("COPY copied (tags) FROM STDIN") as copy:
            copy.set_types(["text[]"])
            copy.write_row([["a", "b"]])
        row = connection.execute("SELECT tags FROM copied").fetchone()
    assert row == (["a", "b"],)
