"""What a notification says (``beat.monitors.messages``)."""

from __future__ import annotations

from datetime import UTC, datetime

from beat.models import NotificationEvent
from beat.monitors.messages import details, incident_payload

AT = datetime(2026, 12, 6, 7, 27, 12, tzinfo=UTC)


def payload(event: NotificationEvent, **fields: object) -> dict[str, object]:
    values: dict[str, object] = {
        "cluster": "habeat",
        "incident_id": 4,
        "schedule": "rates",
        "kind": "failing",
        "failures": 3,
        "last_error": "TypeError: boom",
        "at": AT,
    } | fields
    return incident_payload(event, **values)  # type: ignore[arg-type]


def test_each_event_says_what_happened_in_one_line() -> None:
    assert payload(NotificationEvent.OPENED)["text"] == "Schedule rates failed 3 times in a row"
    assert payload(NotificationEvent.PAUSED)["text"] == (
        "Schedule rates was paused after 3 failures in a row"
    )
    resolved = payload(
        NotificationEvent.RESOLVED, resolution="the run due 2026-12-06 07:30:00 UTC succeeded"
    )
    assert (
        resolved["text"]
        == "Schedule rates recovered: the run due 2026-12-06 07:30:00 UTC succeeded"
    )


def test_the_document_names_the_incident_and_the_email_lists_it() -> None:
    document = payload(NotificationEvent.OPENED) | {"notification_id": 12}
    assert document["incident"] == {
        "id": 4, "kind": "failing", "schedule": "rates", "failures": 3,
        "last_error": "TypeError: boom", "resolution": None, "detail": None,
    }  # fmt: skip
    assert document["at"] == "2026-12-06T07:27:12+00:00"
    body = details(document)
    assert body.splitlines()[0] == "Schedule rates failed 3 times in a row"
    assert "last error: TypeError: boom" in body
    assert "celery -A app schedules show rates" in body
