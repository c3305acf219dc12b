"""Send one notification to its channel, or raise :class:`SendFailed` saying why: a
webhook gets the JSON document, Slack a message, email a plain-text mail. Each send
carries the notification's ID (``Idempotency-Key`` and ``X-Habeat-Notification`` headers,
the document's ``notification_id``, the mail's ``Message-ID``), so a receiver that gets
it twice (a leader died between the send and its record) can tell."""

from __future__ import annotations

import json
import smtplib
import ssl
import urllib.error
import urllib.request
from email.message import EmailMessage
from email.utils import make_msgid
from typing import Any

from beat.errors import HABeatError
from beat.models import ChannelKind
from beat.monitors.messages import details
from beat.notify.targets import smtp_target

#: Seconds a send may take (connecting included) before it counts as failed.
SEND_TIMEOUT = 10.0
USER_AGENT = "celery-habeat"


class SendFailed(HABeatError):
    """The channel did not take the notification: tried again after a back-off."""


def send(kind: ChannelKind, target: str, notification_id: int, payload: dict[str, Any]) -> None:
    """Send ``payload`` as notification ``notification_id`` through a channel."""
    document = payload | {"notification_id": notification_id}
    try:
        if kind is ChannelKind.EMAIL:
            _send_email(target, notification_id, document)
        elif kind is ChannelKind.SLACK:
            _post(target, notification_id, {"text": f"{document['text']} ({_tail(document)})"})
        else:
            _post(target, notification_id, document)
    except (OSError, smtplib.SMTPException, ValueError) as exc:
        raise SendFailed(f"{kind.value}: {type(exc).__name__}: {exc}"[:500]) from exc


def _tail(document: dict[str, Any]) -> str:
    incident = document["incident"]
    return f"incident {incident['id']}, notification {document['notification_id']}"


def _post(url: str, notification_id: int, body: dict[str, Any]) -> None:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "Idempotency-Key": str(notification_id),
            "X-Habeat-Notification": str(notification_id),
        },
    )
    try:
        with _OPENER.open(request, timeout=SEND_TIMEOUT) as response:
            response.read(1024)
    except urllib.error.HTTPError as exc:
        raise OSError(f"HTTP {exc.code} from the receiver") from None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is a failed send: urllib would follow a POST's 301, 302 or 303 with a
    GET without the document, and its 200 would count as delivered."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _send_email(target: str, notification_id: int, document: dict[str, Any]) -> None:
    smtp = smtp_target(target)
    message = EmailMessage()
    message["Subject"] = f"[habeat] {document['text']}"
    message["From"] = smtp.sender
    message["To"] = ", ".join(smtp.recipients)
    message["Message-ID"] = make_msgid(idstring=f"habeat-notification-{notification_id}")
    message["X-Habeat-Notification"] = str(notification_id)
    message.set_content(details(document))
    context = ssl.create_default_context()
    client: smtplib.SMTP
    if smtp.tls:
        client = smtplib.SMTP_SSL(smtp.host, smtp.port, timeout=SEND_TIMEOUT, context=context)
    else:
        client = smtplib.SMTP(smtp.host, smtp.port, timeout=SEND_TIMEOUT)
    with client:
        if smtp.starttls:
            client.starttls(context=context)
        if smtp.username:
            client.login(smtp.username, smtp.password or "")
        client.send_message(message)
