"""A wall clock off by ``HABEAT_TEST_CLOCK_SKEW`` seconds, for one test process
(see ``tests.clock_skew``).

Put this directory first on ``PYTHONPATH``: ``site`` imports this module before
anything else, so Celery, kombu and this package read the shifted clock through
``time.time``, ``time.time_ns``, ``datetime.datetime.now``/``utcnow``/``today``
and ``datetime.date.today``, whether they import the module or the name. The
monotonic clock and ``time.sleep`` are left alone (libfaketime 0.9.10 breaks
Python 3.11's ``time.sleep`` when it leaves them alone), and so are the servers:
PostgreSQL and Redis keep the true clock, as a host's skew leaves them.
"""

from __future__ import annotations

import datetime as _datetime
import os
import time as _time
from typing import Any

SKEW_ENV = "HABEAT_TEST_CLOCK_SKEW"


def _install(skew: float) -> None:
    true_time, true_time_ns = _time.time, _time.time_ns
    true_localtime, true_gmtime = _time.localtime, _time.gmtime
    skew_ns = round(skew * 1e9)

    def time() -> float:
        return true_time() + skew

    def time_ns() -> int:
        return true_time_ns() + skew_ns

    def localtime(seconds: float | None = None) -> _time.struct_time:
        return true_localtime(time() if seconds is None else seconds)

    def gmtime(seconds: float | None = None) -> _time.struct_time:
        return true_gmtime(time() if seconds is None else seconds)

    true_strftime, true_ctime, true_asctime = _time.strftime, _time.ctime, _time.asctime

    def strftime(form: str, moment: Any = None) -> str:
        return true_strftime(form, localtime() if moment is None else moment)

    def ctime(seconds: float | None = None) -> str:
        return true_ctime(time() if seconds is None else seconds)

    def asctime(moment: Any = None) -> str:
        return true_asctime(localtime() if moment is None else moment)

    for name, shifted in {
        "time": time, "time_ns": time_ns, "localtime": localtime, "gmtime": gmtime,
        "strftime": strftime, "ctime": ctime, "asctime": asctime,
    }.items():  # fmt: skip
        # Callable staticmethods, as the true builtins behave: a class that keeps one as
        # an attribute (logging.Formatter.converter = time.localtime) must not bind it.
        setattr(_time, name, staticmethod(shifted))

    true_date, true_datetime = _datetime.date, _datetime.datetime

    class _Real(type):
        # Instances made by C code (psycopg, the datetime arithmetic) are the true
        # classes: isinstance and issubclass must accept them as the shifted ones.
        def __instancecheck__(cls, instance: object) -> bool:
            return isinstance(instance, cls.__mro__[1])

        def __subclasscheck__(cls, subclass: type) -> bool:
            return issubclass(subclass, cls.__mro__[1])

    # No __dict__ (empty slots): C extensions that check these types' size at import
    # (Cython's type import) find the size of the true classes.
    class date(true_date, metaclass=_Real):  # type: ignore[misc]
        __slots__ = ()

        @classmethod
        def today(cls) -> _datetime.date:
            return true_date.fromtimestamp(time())

    class datetime(true_datetime, metaclass=_Real):  # type: ignore[misc]
        __slots__ = ()

        @classmethod
        def now(cls, tz: _datetime.tzinfo | None = None) -> _datetime.datetime:
            return true_datetime.fromtimestamp(time(), tz)

        @classmethod
        def utcnow(cls) -> _datetime.datetime:
            return true_datetime.fromtimestamp(time(), _datetime.UTC).replace(tzinfo=None)

        @classmethod
        def today(cls) -> _datetime.datetime:
            return true_datetime.fromtimestamp(time())

    # Named as the classes they replace, so pickle (which finds a class by its module
    # and qualified name) finds them where they stand: datetime.datetime.
    for shifted in (date, datetime):
        shifted.__module__, shifted.__qualname__ = "datetime", shifted.__name__
    _datetime.date = date  # type: ignore[misc]
    _datetime.datetime = datetime  # type: ignore[misc]


_skew = float(os.environ.get(SKEW_ENV) or 0)
if _skew:
    _install(_skew)
