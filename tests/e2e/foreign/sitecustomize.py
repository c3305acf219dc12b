"""Makes this interpreter an environment without celery-habeat: ``import beat`` fails
and the package's entry points (the ``celery schedules`` command, the ``ha``
scheduler) are not seen, as in an image built with only Celery installed. Loaded
by Python at start when this directory is on ``PYTHONPATH``."""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

#: The packages of this repository that such an environment does not have.
ABSENT = ("beat", "app", "tests")


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def _ours(entry: importlib.metadata.EntryPoint) -> bool:
    return entry.value.split(".")[0].split(":")[0] in ABSENT


_entry_points = importlib.metadata.entry_points


def _without_ours(**params: Any) -> Any:
    found = _entry_points(**params)
    if isinstance(found, importlib.metadata.EntryPoints):
        return importlib.metadata.EntryPoints(entry for entry in found if not _ours(entry))
    return found


sys.meta_path.insert(0, _Absent())
importlib.metadata.entry_points = _without_ours  # type: ignore[assignment]
