"""The scheduler's configuration as a worker reads it on every delivery.

``BeatConfig.from_celery_conf`` reads some thirty keys through Celery's layered
``app.conf`` and checks them: about a tenth of a millisecond, paid by each receipt,
start and outcome of a run. A worker's configuration is set before it consumes, so it
is read once per app and read again only if the app's configuration (what was set on
it: ``conf.changes``) or one of the variables the settings read changed since.
"""

from __future__ import annotations

import copy
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from beat.config import SETTINGS, BeatConfig
from beat.process_locks import ForkSafeLock

#: Every environment variable a setting may be read from.
_VARIABLES = tuple(variable for row in SETTINGS for variable in row.variables)
_ENCODED = tuple(os.fsencode(variable) for variable in _VARIABLES)


def _variables() -> tuple[str | bytes | None, ...]:
    """The variables' values now. ``os.environ.get`` encodes each name and decodes each
    value: 34 of them cost some 40 µs, paid twice or more by every run a worker takes.
    The mapping behind ``os.environ`` on POSIX (``_data``, bytes to bytes: what
    ``os.environ`` itself reads and writes) gives the same answer in 2 µs; elsewhere
    the public mapping is read."""
    data = getattr(os.environ, "_data", None)
    if os.name == "posix" and isinstance(data, dict):
        return tuple(map(data.get, _ENCODED))
    return tuple(os.environ.get(variable) for variable in _VARIABLES)


@dataclass(frozen=True, slots=True)
class _Read:
    conf: Callable[[], Any]  # a weak reference: the app's lifetime is not ours to extend
    changes: dict[str, Any]
    variables: tuple[str | bytes | None, ...]
    config: BeatConfig


_reads: dict[int, _Read] = {}
_lock = ForkSafeLock()


def delivery_config(conf: Any) -> BeatConfig:
    """``BeatConfig.from_celery_conf(conf)``, read again only when what it reads changed."""
    variables = _variables()
    changes = getattr(conf, "changes", None)
    known = _reads.get(id(conf))
    if (
        known is not None
        and known.conf() is conf
        and known.variables == variables
        and known.changes == changes
    ):
        return known.config
    config = BeatConfig.from_celery_conf(conf)
    if isinstance(changes, dict):
        read = _Read(weakref.ref(conf), copy.deepcopy(changes), variables, config)
        with _lock:
            _reads[id(conf)] = read
    return config
