"""Schema migrations (Alembic, run programmatically) and the check that the schema is current."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError

from beat.errors import SchemaOutdated
from beat.store.tables import VERSION_TABLE

MIGRATIONS_DIR = Path(__file__).parents[1] / "migrations"
#: Serialises concurrent `migrate` runs (several containers starting at once).
MIGRATE_LOCK_ID = 0x6861_6265_6174  # "habeat"


def _alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None, "no migrations found"
    return head


def current_revision(engine: Engine) -> str | None:
    # Alembic logs its dialect choice at INFO on every check: not news to an operator.
    logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


def migrate(engine: Engine, revision: str = "head") -> str:
    """Upgrade the schema to ``revision``; safe to run from several processes at once."""
    config = _alembic_config()
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATE_LOCK_ID})
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
    return current_revision(engine) or "base"


def ensure_database(engine: Engine) -> bool:
    """Create the configured database if it does not exist yet; True if it was created.

    Connects to the server's ``postgres`` maintenance database to do so, with the
    same user: a fresh machine then needs only `schedules migrate`.
    """
    try:
        with engine.connect():
            return False
    except OperationalError as exc:
        if "does not exist" not in str(exc.orig):
            raise
    name = engine.url.database
    maintenance = create_engine(engine.url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with maintenance.connect() as conn:
            # The name comes from a URL: quoted as an identifier (embedded quotes
            # doubled), so no name can be read as SQL.
            quoted = maintenance.dialect.identifier_preparer.quote_identifier(name or "")
            conn.execute(text(f"CREATE DATABASE {quoted}"))
    finally:
        maintenance.dispose()
    return True


def check_schema(engine: Engine) -> None:
    """Raise :class:`SchemaOutdated` unless the database is at this code's head revision."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise SchemaOutdated(
            f"database schema is at revision {current or 'none'}, this code needs {head}:"
            " run `celery -A <your app> schedules migrate`"
        )
