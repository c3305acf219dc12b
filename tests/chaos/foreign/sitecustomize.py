"""An environment without this package, for the worker of a mixed fleet.

Put this directory first on ``PYTHONPATH``: ``site`` imports this module before
anything else. The package is installed in the virtualenv the chaos processes
share, so this makes it absent, as in a worker image built from another
repository or one not yet upgraded: ``import beat`` fails, and the entry points
it registers (the ``celery.commands`` entry point through which every
``celery`` command would import ``beat.worker``) are not listed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

PACKAGE = "beat"


def _ours(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


class RefusePackage(importlib.abc.MetaPathFinder):
    """Answers every import of the package as if it were not installed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if _ours(fullname):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


_true_entry_points = importlib.metadata.entry_points


def entry_points(**params: Any) -> Any:
    """The installed entry points but the package's own."""
    found = _true_entry_points(**params)
    if isinstance(found, importlib.metadata.EntryPoints):
        return importlib.metadata.EntryPoints(
            point for point in found if not _ours(point.value.split(":")[0])
        )
    return found


sys.meta_path.insert(0, RefusePackage())
importlib.metadata.entry_points = entry_points
