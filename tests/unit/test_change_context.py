"""Who a change is recorded as: what the triggers are told."""

from __future__ import annotations

import json

from beat.models import ChangeAction, ChangeEntry
from beat.records import ChangeContext


def test_a_change_tells_the_triggers_only_what_it_knows() -> None:
    change = ChangeContext(actor="alice", entry=ChangeEntry.UI, address="192.0.2.7")
    assert change.document() == {"actor": "alice", "entry": "ui", "address": "192.0.2.7"}
    restore = ChangeContext(actor="a", entry=ChangeEntry.CLI, action=ChangeAction.RESTORE)
    assert restore.document()["action"] == "restore"


def test_a_user_name_that_is_not_utf_8_is_written_so_postgresql_takes_it() -> None:
    """A lone surrogate (os.getlogin() of a name not in UTF-8) in the JSON made PostgreSQL
    refuse the setting, and with it every change of that user."""
    change = ChangeContext(actor="caf\udce9", entry=ChangeEntry.CLI)
    written = json.dumps(change.document())
    assert "\\udce9" not in written
    assert change.document()["actor"] == "caf?"
