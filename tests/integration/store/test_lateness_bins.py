"""The lateness bin PostgreSQL computes for a run (``beat.store.percentiles.lateness_bin``,
over the seconds of ``published_at - fire_at``) is the one Python computes for its seconds
(``bin_of``, the oracle): for every lateness, negative, under a millisecond, at the
bounds of the bins and past the last one; NULL for a run with no lateness."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import BigInteger, Double, Interval, bindparam, column, func, literal_column, select
from sqlalchemy.dialects.postgresql import ARRAY

from beat.store.all_roles import Store
from beat.store.percentiles import BINS_PER_OCTAVE, LATENESS_BINS, bin_of, lateness_bin

pytestmark = pytest.mark.integration

#: Where bins meet, in microseconds: 2 ** (i / BINS_PER_OCTAVE) ms and a microsecond
#: either side, for every bin.
_BOUNDS = sorted(
    {
        round(1000 * 2 ** (index / BINS_PER_OCTAVE)) + offset
        for index in range(LATENESS_BINS + 2)
        for offset in (-1, 0, 1)
    }
)
_MICROSECONDS = st.one_of(
    st.integers(min_value=-(10**8), max_value=10**11),
    st.integers(min_value=-2_000, max_value=5_000),
    st.sampled_from(_BOUNDS),
)


def bins_in_sql(store: Store, microseconds: list[int]) -> list[int | None]:
    values = (
        func.unnest(bindparam("values", type_=ARRAY(BigInteger)))
        .table_valued(column("m", BigInteger))
        .render_derived()
    )
    late = values.c.m * literal_column("interval '1 microsecond'", Interval)
    query = select(values.c.m, lateness_bin(func.date_part("epoch", late, type_=Double)))
    with store.engine.connect() as conn:
        rows = conn.execute(query, {"values": microseconds}).all()
    found = {m: found_bin for m, found_bin in rows}
    return [found[m] for m in microseconds]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_MICROSECONDS, min_size=1, max_size=200, unique=True))
def test_postgresql_bins_a_lateness_as_python_does(store: Store, microseconds: list[int]) -> None:
    expected = [bin_of(m / 1_000_000) for m in microseconds]
    assert bins_in_sql(store, microseconds) == expected


def test_every_bound_of_every_bin_is_binned_as_python_bins_it(store: Store) -> None:
    expected = [bin_of(m / 1_000_000) for m in _BOUNDS]
    assert bins_in_sql(store, _BOUNDS) == expected
    assert set(expected) == set(range(LATENESS_BINS))


def test_a_run_with_no_lateness_has_no_bin(store: Store) -> None:
    query = select(lateness_bin(literal_column("NULL::float8", Double)))
    with store.engine.connect() as conn:
        assert conn.execute(query).scalar_one() is None
