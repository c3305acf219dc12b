"""Lateness percentiles (:class:`Percentiles`): those PostgreSQL's
``percentile_cont`` gives over the runs read live, and those read from the lateness
histogram of the summary of finished runs (``LATENESS_BINS``): a lateness's bin in
SQL (:func:`lateness_bin`) and in Python (:func:`bin_of`), and the percentiles of
merged bins (:func:`histogram_percentiles`)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Double, Integer, case, func, literal_column, null

#: The percentiles of lateness reported, as fractions.
QUANTILES = (0.5, 0.95, 0.99)

#: The lateness histogram of the summary: bin 0 holds lateness under 1 ms (and
#: negative), bin ``i`` (1 to ``BINS_PER_OCTAVE * LATENESS_OCTAVES``) from
#: ``2 ** ((i - 1) / BINS_PER_OCTAVE)`` ms to ``2 ** (i / BINS_PER_OCTAVE)`` ms, the
#: last one from ``2 ** LATENESS_OCTAVES`` ms (70 min) up. A quarter of an octave is
#: a ratio of 1.19: a value read at the geometric middle of its bin (see
#: :func:`histogram_percentiles`) is within 9 % of the true one.
BINS_PER_OCTAVE = 4
LATENESS_OCTAVES = 22
LATENESS_BINS = BINS_PER_OCTAVE * LATENESS_OCTAVES + 2


@dataclass(frozen=True, kw_only=True, slots=True)
class Percentiles:
    """Lateness in seconds (``published_at - fire_at``) of published runs."""

    p50: float
    p95: float
    p99: float
    max: float
    #: Read from the summary's histogram: within a bin's width of the true value
    #: (see ``LATENESS_BINS``); ``max`` is exact all the same.
    approximate: bool = False


def lateness_bin(seconds: ColumnElement[float]) -> ColumnElement[int]:
    """The bin of ``LATENESS_BINS`` a lateness falls in (NULL for NULL)."""
    per_log = literal_column(repr(BINS_PER_OCTAVE / math.log(2)), Double)
    binned = func.least(
        literal_column(str(LATENESS_BINS - 1)),
        literal_column("1") + func.floor(func.ln(seconds * literal_column("1000.0")) * per_log),
    )
    # Tested first: least() ignores a NULL.
    return case(
        (seconds.is_(None), null()),
        (seconds < literal_column("0.001"), literal_column("0")),
        else_=binned,
    ).cast(Integer)


def bin_of(seconds: float) -> int:
    """:func:`lateness_bin` in Python."""
    if seconds < 0.001:
        return 0
    found = 1 + math.floor(math.log(seconds * 1000.0) * (BINS_PER_OCTAVE / math.log(2)))
    return min(LATENESS_BINS - 1, found)


def histogram_percentiles(bins: Sequence[int], slowest: float) -> Percentiles | None:
    """``QUANTILES`` of the lateness counted in ``bins`` (``LATENESS_BINS``), as
    ``percentile_cont`` interpolates between ranks, each value taken at the
    geometric middle of its bin: within 9 % of the true one (below 1 ms: within
    0.5 ms; from 70 min up, the middle of 70 min and ``slowest``). None are above
    ``slowest``, the exact maximum."""
    total = sum(bins)
    if total == 0:
        return None
    cumulative = list(itertools.accumulate(bins))

    def value(rank: int) -> float:
        index = bisect.bisect_right(cumulative, rank)
        if index == 0:
            return min(0.0005, slowest)
        low = 2 ** ((index - 1) / BINS_PER_OCTAVE) / 1000.0
        high = 2 ** (index / BINS_PER_OCTAVE) / 1000.0
        if index == LATENESS_BINS - 1:
            high = max(low, slowest)
        return min(math.sqrt(low * high), slowest)

    def quantile(fraction: float) -> float:
        rank = fraction * (total - 1)
        below = math.floor(rank)
        found = value(below)
        if rank > below:
            found += (value(below + 1) - found) * (rank - below)
        return found

    p50, p95, p99 = (quantile(fraction) for fraction in QUANTILES)
    return Percentiles(p50=p50, p95=p95, p99=p99, max=slowest, approximate=True)
