"""The API tokens of the write API (``beat_api_tokens``): made with a role, shown once,
kept as their SHA-256 (a token is 256 random bits: a fast hash is as good as a slow
one for it), found by that hash on each request, revoked at once. Revoked tokens stay,
so a name is never given to another token."""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError

from beat.errors import InvalidSchedule, StoreError
from beat.models import Role
from beat.store.db import StoreConnection
from beat.store.tables import api_tokens

logger = logging.getLogger(__name__)

#: What every token starts with: a secret scanner, or a person, can tell it for one.
TOKEN_PREFIX = "habeat_"
#: How often a token's ``last_used_at`` is written (not on every request).
USE_RECORDED_EVERY = timedelta(minutes=1)
#: The longest token name.
MAX_NAME_LENGTH = 100


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiToken:
    name: str
    role: Role
    created_at: datetime
    created_by: str
    revoked_at: datetime | None
    last_used_at: datetime | None


class TokenNotFound(InvalidSchedule):
    """No token of this name: ``schedules tokens list`` shows them."""


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_token_name(name: str) -> str:
    if not name or not name.isprintable() or name != name.strip() or len(name) > MAX_NAME_LENGTH:
        raise InvalidSchedule(
            f"a token's name is 1 to {MAX_NAME_LENGTH} printable characters without spaces"
            f" around them, got {name!r:.120}"
        )
    return name


class ApiTokens(StoreConnection):
    """Make, list, revoke and look up API tokens."""

    def create_token(self, name: str, role: Role, created_by: str) -> str:
        """A new token called ``name`` with ``role``: the token itself, which is not kept
        (only its hash is). InvalidSchedule if the name is taken, revoked tokens' too."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._transaction() as conn:
            made = conn.execute(
                pg_insert(api_tokens)
                .values(
                    name=check_token_name(name),
                    role=role.value,
                    token_hash=token_hash(token),
                    created_by=created_by,
                )
                .on_conflict_do_nothing(index_elements=[api_tokens.c.name])
                .returning(api_tokens.c.name)
            ).scalar_one_or_none()
        if made is None:
            raise InvalidSchedule(
                f"a token named {name!r:.120} exists (or existed: revoked names are kept):"
                " pick another name"
            )
        return token

    def tokens(self) -> list[ApiToken]:
        with self._transaction() as conn:
            rows = conn.execute(select(api_tokens).order_by(api_tokens.c.name)).all()
        return [
            ApiToken(
                name=row.name,
                role=Role(row.role),
                created_at=row.created_at,
                created_by=row.created_by,
                revoked_at=row.revoked_at,
                last_used_at=row.last_used_at,
            )
            for row in rows
        ]

    def revoke_token(self, name: str) -> None:
        """Revoke token ``name`` at once: its next request is refused. TokenNotFound if
        there is none (revoking it again changes nothing)."""
        with self._transaction() as conn:
            found = conn.execute(
                update(api_tokens)
                .where(api_tokens.c.name == name)
                .values(revoked_at=func.coalesce(api_tokens.c.revoked_at, func.now()))
                .returning(api_tokens.c.name)
            ).scalar_one_or_none()
        if found is None:
            raise TokenNotFound(
                f"no token named {name!r:.120}: `celery -A app schedules tokens list` shows them"
            )

    def token_bearer(self, token: str) -> tuple[str, Role] | None:
        """The name and role of ``token`` if it is a token not revoked; None otherwise.
        Records that it was used (at most once a ``USE_RECORDED_EVERY``)."""
        digest = token_hash(token)
        with self._transaction() as conn:
            row = conn.execute(
                select(api_tokens.c.name, api_tokens.c.role).where(
                    api_tokens.c.token_hash == digest, api_tokens.c.revoked_at.is_(None)
                )
            ).one_or_none()
        if row is None:
            return None
        self._record_use(row.name)
        return row.name, Role(row.role)

    def _record_use(self, name: str) -> None:
        """Note that token ``name`` was used, at most once a ``USE_RECORDED_EVERY``; a
        database that takes no writes (a standby) only goes without the note."""
        stale = func.now() - USE_RECORDED_EVERY
        try:
            with self._transaction() as conn:
                conn.execute(
                    update(api_tokens)
                    .where(
                        api_tokens.c.name == name,
                        api_tokens.c.last_used_at.is_(None) | (api_tokens.c.last_used_at < stale),
                    )
                    .values(last_used_at=func.now())
                )
        except (StoreError, DBAPIError) as exc:
            logger.warning("could not note that API token %s was used: %s", name, exc)
