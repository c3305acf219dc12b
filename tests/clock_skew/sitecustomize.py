"""Shift this process's wall clock by ``HABEAT_TEST_CLOCK_SKEW`` seconds (see
``tests.clock_skew``). Loaded by Python's ``site`` at start-up, before anything else
reads the clock, when this directory is on ``PYTHONPATH``.

``datetime.datetime`` becomes a subclass whose ``now``, ``utcnow`` and ``today`` are
shifted; ``isinstance`` and ``issubclass`` treat it as the real class both ways (as
freezegun does), so values made by C code (a database driver) still pass type checks.
"""

from __future__ import annotations

import datetime as _datetime_module
import os
import time as _time_module
from typing import Any

_SKEW = float(os.environ.get("HABEAT_TEST_CLOCK_SKEW") or 0.0)


def _posing_as(real: type) -> type:
    """A metaclass for a subclass of ``real`` that ``isinstance`` and ``issubclass``
    take for ``real`` itself."""

    class PosingAs(type):
        def __instancecheck__(cls, obj: object) -> bool:
            return isinstance(obj, real)

        def __subclasscheck__(cls, other: type) -> bool:
            return issubclass(other, real)

    return PosingAs


def _install(skew: float) -> None:
    real_time = _time_module.time
    real_time_ns = _time_module.time_ns
    real_datetime = _datetime_module.datetime
    real_date = _datetime_module.date
    shift = _datetime_module.timedelta(seconds=skew)
    skew_ns = int(skew * 1_000_000_000)

    def time() -> float:
        return real_time() + skew

    def time_ns() -> int:
        return real_time_ns() + skew_ns

    class datetime(real_datetime, metaclass=_posing_as(real_datetime)):  # the module's name
        __slots__ = ()  # the real class's size: C extensions check it

        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return real_datetime.now(tz) + shift

        @classmethod
        def utcnow(cls) -> Any:
            return real_datetime.utcnow() + shift

        @classmethod
        def today(cls) -> Any:
            return real_datetime.today() + shift

    class date(real_date, metaclass=_posing_as(real_date)):  # the module's name
        __slots__ = ()

        @classmethod
        def today(cls) -> Any:
            return (real_datetime.now() + shift).date()

    _time_module.time = time
    _time_module.time_ns = time_ns
    _datetime_module.datetime = datetime  # type: ignore[misc]
    _datetime_module.date = date  # type: ignore[misc]


if _SKEW:
    _install(_SKEW)
