"""Who may use the write API, the part of :class:`beat.ops.schedules.Schedules` that
makes, lists and revokes its tokens and tells who a token is
(``beat.store.api_tokens``)."""

from __future__ import annotations

from beat.models import Role
from beat.ops.schedules_base import SchedulesBase
from beat.store.api_tokens import ApiToken


class ApiAccess(SchedulesBase):
    """API tokens, each with a role."""

    def create_token(self, name: str, role: Role) -> str:
        """A new token called ``name`` with ``role``, made by whoever acts: the token,
        shown this once (only its hash is kept)."""
        return self.store.create_token(name, role, created_by=self.change.actor)

    def tokens(self) -> list[ApiToken]:
        """Every token, revoked ones too, by name (never the tokens themselves)."""
        return self.store.tokens()

    def revoke_token(self, name: str) -> None:
        """Revoke token ``name``: its next request is refused."""
        self.store.revoke_token(name)

    def token_bearer(self, token: str) -> tuple[str, Role] | None:
        """The name and role of a token not revoked; None for any other text."""
        return self.store.token_bearer(token)
