"""The history tab of a schedule's page: every change the audit log keeps of it (who,
when, from where, each field before and after), and a restore of an earlier version,
which is a change like any other. A removed schedule's history stays readable, and
restoring brings it back."""

from __future__ import annotations

from typing import Any

import tornado.web

from beat.models import Role
from beat.records import ScheduleChange
from beat.ui.base_handler import BaseHandler, UIContext, schedule_url, signed_form

#: Changes one page of the history shows (the CLI and the JSON API read further back).
HISTORY_PAGE_SIZE = 100


class HistoryPage(BaseHandler):
    async def get(self, name: str) -> None:
        changes = await self.call(self.schedules.audit, name, limit=HISTORY_PAGE_SIZE)
        current = await self.call(self.schedules.version_now, name)
        if not changes and current is None:
            raise tornado.web.HTTPError(404, "no schedule named %r, and no change recorded", name)
        await self.render_page(
            "history.html",
            name=name,
            changes=changes,
            current=current,
            restorable=lambda change: restorable(change, current),
            section="schedules",
        )


def restorable(change: ScheduleChange, current: int | None) -> bool:
    """Whether the page offers to restore the version ``change`` made: one with fields,
    other than the schedule's version now (any, once the schedule is removed)."""
    return change.after is not None and change.version != current


class RestoreHandler(BaseHandler):
    """POST /schedules/<name>/restore with the version: back to the history tab."""

    @signed_form(Role.ADMIN)
    async def post(self, name: str) -> None:
        given = self.get_body_argument("version", "")
        if not (given.isascii() and given.isdigit()) or int(given) < 1:
            raise tornado.web.HTTPError(400, "version must be a version number of the schedule")
        restored = await self.call(self.schedules.restore, name, int(given))
        target = f"{schedule_url(name, 'history')}?done=restored#v{restored.version}"
        self.redirect(target, status=303)


def routes(context: UIContext) -> list[tuple[str, type[tornado.web.RequestHandler], Any]]:
    arguments = {"context": context}
    return [
        (r"/schedules/([^/]+)/history", HistoryPage, arguments),
        (r"/schedules/([^/]+)/restore", RestoreHandler, arguments),
    ]
