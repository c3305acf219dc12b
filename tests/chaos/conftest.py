"""The chaos suite's marker (pyproject.toml runs pytest with --strict-markers)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "chaos: fault injection on a real cluster with its own PostgreSQL and Redis servers",
    )
