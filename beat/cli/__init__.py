"""``celery -A proj schedules ...``: operate the scheduler without opening psql.

Commands: add, update, show, list, pause, resume, remove, trigger, runs, leader, sync,
import, export, migrate, prune, health, incidents, channels, audit, restore, tokens,
and ui (serves the schedules UI and its HTTP API, ``beat.ui``).
Each but ui takes ``--json`` for scripts (one JSON document on stdout; for commands
that change something, an object describing the result). Human output is an
aligned table.

Each command parses its options, calls one method of :class:`beat.ops.schedules.Schedules`
and renders what it returns with :mod:`beat.ops.rendering`: no SQL and no Redis here.

Exit codes: 0 ok, 2 bad input (nothing written), 1 failure (e.g. a database
that cannot be reached, or ``health`` finding a problem). Each error is one
line on stderr that says what to do.

All output goes through ``_say`` (one line) or ``_show`` (a rendered text, a JSON
document) of :mod:`beat.cli.output`: whatever a row, a task's result or an argument
holds reaches the terminal escaped, never as an escape sequence it would run.

The group and what every command starts from are in :mod:`beat.cli.group`, the
options the commands share in :mod:`beat.cli.options`; the commands by family in
:mod:`beat.cli.schedule_commands` (add, update, show, list, pause, resume, remove,
sync), :mod:`beat.cli.run_commands` (trigger, backfill, runs, prune),
:mod:`beat.cli.cluster_commands` (migrate, leader, health, incidents),
:mod:`beat.cli.channel_commands` (channels add, list, remove),
:mod:`beat.cli.audit_commands` (audit, restore),
:mod:`beat.cli.token_commands` (tokens create, list, revoke),
:mod:`beat.cli.import_commands` (import, export) and
:mod:`beat.cli.ui_command` (ui). Importing this package registers them all on the
group.
"""

from __future__ import annotations

# Celery imports this module in every ``celery`` command (it is the ``schedules``
# entry point), which is how a worker gets run tracking without a setting.
from beat import worker  # noqa: F401

# Each command module registers its commands on the group when imported.
from beat.cli import (  # noqa: F401
    audit_commands,
    channel_commands,
    cluster_commands,
    import_commands,
    run_commands,
    schedule_commands,
    token_commands,
    ui_command,
)
from beat.cli.group import schedules as schedules
