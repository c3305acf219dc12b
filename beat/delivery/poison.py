"""A worker bootstep that sets aside broker messages it cannot decode or unpack.

Celery 5.7 lets some malformed messages kill the worker: a task message whose
body is not the ``(args, kwargs, embed)`` triple of protocol 2 raises
``ValueError`` while the request is built, outside the handlers Celery guards;
the worker exits ("Unrecoverable error"), restores the unacknowledged message,
and every restarted worker takes it again and dies. A Redis list item that is
not JSON kills the worker the same way (the item itself is lost), and a JSON
item that is not a kombu envelope restarts the consumer as if the broker had
gone away (which, with ``worker_cancel_long_running_tasks_on_connection_loss``,
cancels the tasks running on that worker).

:class:`PoisonMessageGuard` (a consumer bootstep) turns all of these into one
outcome, the one Celery already has for the malformed messages it recognises:
the message is removed from its queue (acknowledged, or never delivered) and
set aside. Setting aside logs ONE ERROR line with the task ID, the queue and
what was wrong; counts it in ``habeat_worker_messages_set_aside_total{reason}``;
and, on a Redis broker, keeps a copy in a Redis list capped at
``habeat_dead_letter_max_length`` records, ``habeat_dead_letter_key``
(``habeat.dead_letter`` after the broker's ``global_keyprefix``: not a plausible
queue name, so no worker consumes it by accident). Each record is JSON with the
queue, task ID, reason, problem, time, and the message exactly as the broker
stored it, so it can be read, fixed and sent again. Celery's own multi-line
reports of these messages are replaced by that line (the copy holds the whole
message). Messages are never retried: the next one is taken at once.

Install it in any Celery app by listing this module in ``imports``; the worker
imports it before it builds its consumer (no task changes)::

    app.conf.imports = (*app.conf.imports, "beat.delivery.poison")
"""

from __future__ import annotations

import base64
import enum
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from celery import bootsteps
from celery.exceptions import InvalidTaskError
from celery.signals import worker_init
from celery.worker.consumer import consumer as celery_consumer
from kombu.exceptions import ContentDisallowed

from beat import metrics
from beat.config import BeatConfig, uses_this_scheduler

logger = logging.getLogger(__name__)

#: Longest description of a problem put in the log line.
MAX_PROBLEM_LENGTH = 300


class Reason(enum.StrEnum):
    """Why a message was set aside: the ``reason`` label of the counter."""

    NOT_AN_ENVELOPE = "not_an_envelope"  # the list item is not a kombu message
    UNDECODABLE = "undecodable"  # the body cannot be deserialized
    DISALLOWED_CONTENT = "disallowed_content"  # a content type the app does not accept
    NOT_A_TASK = "not_a_task"  # no task name in the headers or the body
    UNKNOWN_TASK = "unknown_task"  # a task name this worker has not registered
    INVALID_TASK = "invalid_task"  # a task message Celery cannot unpack


for _reason in Reason:
    metrics.WORKER_MESSAGES_SET_ASIDE.labels(reason=_reason.value)


@dataclass(frozen=True, slots=True)
class SetAside:
    """One message taken off its queue for good, and why."""

    reason: Reason
    problem: str
    queue: str | None
    task_id: str | None
    raw: str  # the message as the broker stored it


class DeadLetters:
    """Where set-aside messages are kept: a Redis list capped in length, on the broker."""

    def __init__(self, channel: Any, key: str, max_length: int) -> None:
        self.channel = channel
        self.key = key
        self.max_length = max_length

    @classmethod
    def of(cls, consumer: Any, config: BeatConfig) -> DeadLetters:
        """The list on the consumer's current channel; other brokers keep nothing."""
        channel = consumer.task_consumer.channel if _is_redis(consumer) else None
        return cls(channel, config.dead_letter_key, config.dead_letter_max_length)

    def keep(self, message: SetAside) -> str:
        """Keep a copy; say where it went, for the log line."""
        if self.channel is None or self.max_length <= 0:
            return "dropped"
        record = json.dumps(
            {
                "queue": message.queue,
                "task_id": message.task_id,
                "reason": message.reason.value,
                "problem": message.problem,
                "set_aside_at": time.time(),
                "message": message.raw,
            }
        )
        # A plain client on the broker's pool, and the prefix added here: kombu's
        # prefixing client leaves some commands (LTRIM) unprefixed.
        key = getattr(self.channel, "global_keyprefix", "") + self.key
        try:
            with redis.Redis(connection_pool=self.channel.pool).pipeline() as pipe:
                pipe.lpush(key, record)
                pipe.ltrim(key, 0, self.max_length - 1)
                pipe.execute()
        except Exception as exc:  # the message is still removed: a loop is worse than a loss
            return f"dropped (no copy kept: {type(exc).__name__}: {exc})"
        return f"a copy is kept in Redis list {key!r}"


class PoisonMessageGuard(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer bootstep: a message the worker cannot decode or unpack is set aside, once."""

    label = "poison message guard"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.config = BeatConfig.from_celery_conf(c.app.conf)
        self.dead_letters = DeadLetters(None, self.config.dead_letter_key, 0)
        # Instance attributes: the consumer looks these up when it builds its
        # task handler (and Tasks.start hands on_decode_error to kombu).
        c.on_decode_error = self._guard_decode_error(c.on_decode_error)
        c.on_invalid_task = self._guard_invalid_task(c.on_invalid_task)
        c.on_unknown_task = self._guard_unknown_task(c.on_unknown_task)
        c.on_unknown_message = self._guard_unknown_message(c.on_unknown_message)
        c.create_task_handler = self._guard_task_handler(c.create_task_handler, c)
        _silence_celery_reports()

    def start(self, c: Any) -> None:
        # Runs again on every reconnection, with the new channel.
        self.dead_letters = DeadLetters.of(c, self.config)
        if _is_redis(c):
            self._guard_brpop(c.task_consumer.channel)

    # -- what Celery hands to its handlers: a kombu Message ---------------------------------

    def set_aside(self, message: Any, reason: Reason, problem: str) -> None:
        self.record(
            SetAside(
                reason=reason,
                problem=problem,
                queue=_queue_of(message),
                task_id=_task_id_of(message),
                raw=_raw_of(message),
            )
        )

    def record(self, message: SetAside) -> None:
        where = self.dead_letters.keep(message)
        metrics.WORKER_MESSAGES_SET_ASIDE.labels(reason=message.reason.value).inc()
        logger.error(
            "set aside message %s from queue %r (%s): %s; removed from the queue, %s",
            message.task_id or "(no task ID)",
            message.queue,
            message.reason.value,
            _one_line(message.problem),
            where,
        )

    def _guard_decode_error(self, original: Callable[..., None]) -> Callable[..., None]:
        def on_decode_error(message: Any, exc: BaseException) -> None:
            self.set_aside(message, Reason.UNDECODABLE, f"cannot decode the body: {exc}")
            _then_remove(original, message, message, exc)

        return on_decode_error

    def _guard_invalid_task(self, original: Callable[..., None]) -> Callable[..., None]:
        def on_invalid_task(body: Any, message: Any, exc: BaseException) -> None:
            if isinstance(exc, ContentDisallowed):
                self.set_aside(message, Reason.DISALLOWED_CONTENT, str(exc))
            else:
                problem = f"not a valid task message: {_describe(exc)}"
                self.set_aside(message, Reason.INVALID_TASK, problem)
            _then_remove(original, message, body, message, exc)

        return on_invalid_task

    def _guard_unknown_task(self, original: Callable[..., None]) -> Callable[..., None]:
        # Celery's handler also marks the result as failed (NotRegistered) and
        # sends task-failed: callers waiting on the result learn of it.
        def on_unknown_task(body: Any, message: Any, exc: BaseException) -> None:
            problem = f"no task named {exc!s} is registered on this worker"
            self.set_aside(message, Reason.UNKNOWN_TASK, problem)
            _then_remove(original, message, body, message, exc)

        return on_unknown_task

    def _guard_unknown_message(self, original: Callable[..., None]) -> Callable[..., None]:
        def on_unknown_message(body: Any, message: Any) -> None:
            problem = "not a task message: no task name in its headers or body"
            self.set_aside(message, Reason.NOT_A_TASK, problem)
            _then_remove(original, message, body, message)

        return on_unknown_message

    def _guard_task_handler(
        self, create: Callable[[], Callable[[Any], Any]], c: Any
    ) -> Callable[[], Callable[[Any], Any]]:
        """Whatever else building the request raises is an invalid task message too
        (Celery guards only InvalidTaskError, ContentDisallowed and DecodeError)."""

        def create_task_handler() -> Callable[[Any], Any]:
            on_task_received = create()

            def guarded(message: Any) -> Any:
                try:
                    return on_task_received(message)
                except Exception as exc:
                    if _is_broker_error(exc, c):
                        raise  # the broker failed, not the message: reconnect, redeliver
                    if message.acknowledged:  # off the broker already: nothing to set aside
                        logger.exception("handling message %s failed", _task_id_of(message))
                        return None
                    problem = _unpack_problem(message) or f"{type(exc).__name__}: {exc}"
                    return c.on_invalid_task(None, message, InvalidTaskError(problem))

            return guarded

        return create_task_handler

    # -- what kombu reads from Redis before Celery sees it: a list item ---------------------

    def _guard_brpop(self, channel: Any) -> None:
        """Check each item BRPOP returns before kombu builds a message of it; a bad one
        is set aside and reads as an empty poll (the item is already off its list)."""
        client = channel.client
        if getattr(client, "_habeat_brpop_guarded", False):
            return
        parse_response = client.parse_response

        def guarded(connection: Any, command_name: str, **options: Any) -> Any:
            response = parse_response(connection, command_name, **options)
            if command_name != "BRPOP" or not response:
                return response
            queue = _text(response[0]).rsplit(channel.sep, 1)[0]
            problem = envelope_problem(channel, response[1])
            if problem is None:
                return response
            self.record(
                SetAside(
                    reason=Reason.NOT_AN_ENVELOPE,
                    problem=problem,
                    queue=queue,
                    task_id=None,
                    raw=_text(response[1]),
                )
            )
            return None

        client.parse_response = guarded
        client._habeat_brpop_guarded = True


def envelope_problem(channel: Any, item: bytes | str) -> str | None:
    """What keeps kombu from delivering this Redis list item, or None if nothing does."""
    try:
        # Decoded as kombu decodes it (UTF-8, bad bytes replaced), so both agree.
        payload = json.loads(item.decode(errors="replace") if isinstance(item, bytes) else item)
    except ValueError as exc:
        return f"not a kombu message: not JSON ({exc})"
    if not isinstance(payload, dict):
        return f"not a kombu message: a JSON {type(payload).__name__}, not an object"
    try:
        message = channel.Message(payload, channel=channel)
    except Exception as exc:
        return f"not a kombu message: {type(exc).__name__}: {exc}"
    delivery = message.delivery_info
    if not all(isinstance(delivery.get(key), str) for key in ("exchange", "routing_key")):
        return "not a kombu message: no delivery_info with exchange and routing_key"
    if not isinstance(message.delivery_tag, str | int):
        return "not a kombu message: its delivery_tag is not a string"
    return None


@worker_init.connect  # type: ignore[untyped-decorator]
def install(sender: Any = None, **_: Any) -> None:
    """Add the guard to the consumer of every worker of an app that imports this module."""
    app = getattr(sender, "app", None)
    if app is not None and uses_this_scheduler(app.conf):
        app.steps["consumer"].add(PoisonMessageGuard)


# -- helpers ---------------------------------------------------------------------------------

#: Celery's multi-line reports of the messages the guard sets aside (it logs one line instead).
_CELERY_REPORTS = frozenset(
    {
        celery_consumer.UNKNOWN_FORMAT,
        celery_consumer.UNKNOWN_TASK_ERROR,
        celery_consumer.INVALID_TASK_ERROR,
        celery_consumer.MESSAGE_DECODE_ERROR,
    }
)


def _drop_celery_report(record: logging.LogRecord) -> bool:
    return record.msg not in _CELERY_REPORTS


def _silence_celery_reports() -> None:
    celery_logger = logging.getLogger(celery_consumer.__name__)
    if _drop_celery_report not in celery_logger.filters:
        celery_logger.addFilter(_drop_celery_report)


def _then_remove(original: Callable[..., None], message: Any, *args: Any) -> None:
    """Let Celery's handler reject the message (and tell the result backend); if it
    fails half-way, remove the message anyway: it is set aside already."""
    try:
        original(*args)
    except Exception as exc:
        logger.warning("Celery's handler of a set-aside message failed: %r", exc)
    if not message.acknowledged:
        message.reject_log_error(logger, Exception)


def _is_redis(consumer: Any) -> bool:
    return bool(consumer.connection.transport.driver_type == "redis")


def _is_broker_error(exc: Exception, consumer: Any) -> bool:
    # The Redis transport counts KeyError as a connection error; here it comes
    # from a message that lacks a field.
    broker_errors = tuple(consumer.connection_errors) + tuple(consumer.channel_errors)
    return isinstance(exc, broker_errors) and not isinstance(exc, KeyError)


def _queue_of(message: Any) -> str | None:
    """The queue kombu would restore the message to (its routing key)."""
    delivery = message.delivery_info or {}
    queue = delivery.get("routing_key") or delivery.get("exchange")
    return None if queue is None else str(queue)


def _unpack_problem(message: Any) -> str | None:
    """Why a task message's body cannot be unpacked, if that is what is wrong with it."""
    headers = message.headers
    if not isinstance(headers, dict) or "task" not in headers:
        return None  # protocol 1: the body is a dict Celery checks itself
    try:
        body = message.decode()
    except Exception:
        return None
    if _is_sequence(body) and len(body) == 3:
        args, kwargs, embed = body
        if _is_sequence(args) and isinstance(kwargs, dict) and isinstance(embed, dict | None):
            return None
    return (
        "its body is not the (args, kwargs, embed) triple of task protocol 2:"
        f" {_one_line(repr(body))}"
    )


def _is_sequence(value: object) -> bool:
    return isinstance(value, list | tuple)


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, InvalidTaskError) else f"{type(exc).__name__}: {exc}"


def _task_id_of(message: Any) -> str | None:
    headers = message.headers if isinstance(message.headers, dict) else {}
    properties = message.properties if isinstance(message.properties, dict) else {}
    task_id = headers.get("id") or properties.get("correlation_id")
    return None if task_id is None else str(task_id)


def _raw_of(message: Any) -> str:
    """The message as the broker stored it (virtual transports keep the envelope)."""
    raw = getattr(message, "_raw", None)
    if isinstance(raw, dict):
        return json.dumps(raw, default=repr)
    body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
    return json.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-type": message.content_type,
            "content-encoding": message.content_encoding,
            "headers": message.headers,
            "properties": message.properties,
        },
        default=repr,
    )


def _text(item: bytes | str) -> str:
    return item.decode("utf-8", "backslashreplace") if isinstance(item, bytes) else item


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_PROBLEM_LENGTH else line[: MAX_PROBLEM_LENGTH - 1] + "…"
