"""A wall clock off by ``HABEAT_TEST_CLOCK_SKEW`` seconds, for the process that puts
this directory first on ``PYTHONPATH``: ``time.time``, ``time.time_ns`` and
``datetime.now``/``utcnow``/``today`` are shifted; the monotonic clock and sleeps
are left alone (libfaketime 0.9.10 breaks Python 3.11's ``time.sleep``)."""

from __future__ import annotations

import datetime as _datetime
import os
import time as _time
from typing import Any

_SKEW = float(os.environ.get("HABEAT_TEST_CLOCK_SKEW", "0"))
_real_time, _real_time_ns = _time.time, _time.time_ns
_RealDatetime = _datetime.datetime


def _time_shifted() -> float:
    return _real_time() + _SKEW


def _time_ns_shifted() -> int:
    return _real_time_ns() + int(_SKEW * 1e9)


class _Meta(type):
    # Datetimes made by C code (psycopg, fromtimestamp on the real class) stay instances.
    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, _RealDatetime)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _RealDatetime)


class _ShiftedDatetime(_RealDatetime, metaclass=_Meta):
    __slots__ = ()  # the size C extensions check the class against

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return _RealDatetime.now(tz) + _datetime.timedelta(seconds=_SKEW)

    @classmethod
    def utcnow(cls) -> Any:
        return _RealDatetime.utcnow() + _datetime.timedelta(seconds=_SKEW)

    @classmethod
    def today(cls) -> Any:
        return cls.now()


if _SKEW:
    _time.time, _time.time_ns = _time_shifted, _time_ns_shifted
    _datetime.datetime = _ShiftedDatetime  # type: ignore[misc]
