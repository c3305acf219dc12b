"""Checks every source's import tests make."""

from __future__ import annotations

from collections.abc import Callable

from click.testing import Result

from beat.store.all_roles import Store
from tests.integration.helpers import as_json, table_rows


def assert_importing_again_changes_nothing(run_import: Callable[..., Result], store: Store) -> None:
    """Import, then import again: the second reports every schedule unchanged and
    writes nothing."""
    assert run_import().exit_code == 0
    written = table_rows(store)
    again = as_json(run_import("--json"))
    assert {line["action"] for line in again["schedules"]} == {"unchanged"}
    assert table_rows(store) == written
