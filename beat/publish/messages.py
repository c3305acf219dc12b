"""Task messages built once per schedule definition and stamped per run.

``send_task`` does for every message what is the same for every run of a task with
the same options: it merges the task's own options, routes, builds the protocol 2
headers. A template does that once, through Celery's own code: ``send_task`` itself is
called with a producer that records what it would publish (``_Recorder``). Each run
then only stamps what differs from one run to the next and hands the message to the
producer (kombu does the rest: properties, body encoding, delivery tag, routing to the
queue's list):

* the body, protocol 2's ``(args, kwargs, embed)``, serialised as ``send_task`` has
  kombu serialise it (the embed, callbacks and the like, is the template's);
* headers ``argsrepr`` and ``kwargsrepr``, and the properties of the same names
  (``send_task`` passes its options on to kombu): the run's own, as ``beat.publish.dispatch``
  gives them to ``send_task`` (``publish_options``);

* headers ``id`` and ``root_id``, property ``correlation_id``: the run's task ID;
* headers ``retries``, ``habeat_schedule``, ``habeat_fire_at``, ``habeat_attempt``;
* header ``expires`` and property ``expiration`` (the seconds left until then at
  the send, by the database's clock: ``beat.publish.dispatch.time_to_live``), when the run's
  options have an expiry;
* property ``reply_to``: Celery's ID of the sending thread.

What no template can reproduce falls back to ``send_task`` for every message
(``usable`` says which): signal receivers around publishing (they may change a
message, or expect to be called for each), ``task_sent`` events, a sender running
inside a worker task (parent and root IDs, inherited priority), and an expiry or ETA
that comes from the task's own options (computed from the time of the send: by the
database's clock, ``beat.publish.dispatch.task_expiry``).

A template is shared by every schedule of one task and one set of options, whatever
their arguments (``Templates.key``), as long as routing looks at the task's name only:
Celery's own ``task_routes`` mappings (names and globs). A router that is a function,
an object or an import path may route by the arguments: the template is then one
schedule definition's, arguments included, and holds its routing.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from celery import signals
from celery.app.routes import MapRoute, Router
from celery.backends.base import BaseBackend
from kombu.serialization import dumps

from beat.models import RunToPublish
from beat.publish.redis_envelopes import Envelopes

#: Message headers that tell a worker (and Flower) which schedule and fire time a run is for.
SCHEDULE_HEADER: Final = "habeat_schedule"
FIRE_AT_HEADER: Final = "habeat_fire_at"
ATTEMPT_HEADER: Final = "habeat_attempt"

#: Templates a Celery app keeps; the oldest is dropped beyond this.
MAX_TEMPLATES: Final = 10_000

#: Placeholders the template is built with: each run stamps its own values.
_TEMPLATE_TASK_ID: Final = "00000000-0000-0000-0000-000000000000"

#: What ``publish`` stamps per run, of the headers and (when present) the properties.
_STAMPED_HEADERS: Final = (
    "id",
    "root_id",
    "argsrepr",
    "kwargsrepr",
    "retries",
    SCHEDULE_HEADER,
    FIRE_AT_HEADER,
    ATTEMPT_HEADER,
)
_STAMPED_HEADERS_EXPIRING: Final = (*_STAMPED_HEADERS, "expires")
_STAMPED_PROPERTIES: Final = ("correlation_id", "reply_to", "argsrepr", "kwargsrepr", "expiration")

#: Publish arguments of ``send_task_message`` that a template does not keep: the body
#: is serialised once (so no ``serializer``), ``headers`` are stamped, ``declare`` is
#: decided per batch, ``retry`` is never used inside a batch.
_NOT_KEPT: Final = frozenset({"serializer", "headers", "declare", "retry", "retry_policy"})


class _Recorder:
    """A producer for ``send_task`` that keeps what it would publish instead."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.published: tuple[Any, dict[str, Any]] | None = None

    def publish(self, body: Any, **kwargs: Any) -> None:
        self.published = (body, kwargs)


@dataclass(frozen=True, slots=True)
class MessageTemplate:
    """One schedule definition's message, as ``send_task`` would publish it, less the run."""

    task: str
    #: The body's third part (callbacks, errbacks, chain, chord), and kombu's serialiser
    #: of the body (``send_task``'s: the app's ``task_serializer`` or the task's own).
    embed: dict[str, Any]
    serializer: str | None
    headers: dict[str, Any]
    #: Producer.publish arguments: exchange, routing key, delivery mode, priority, the
    #: properties (``correlation_id`` and ``reply_to`` stamped per run)...
    publish_kwargs: dict[str, Any]
    declare: tuple[Any, ...]
    #: Whether ``send_task`` would call the result backend's ``on_task_call``.
    backend_call: bool


def usable(app: Any) -> bool:
    """Whether messages of ``app`` may be built from templates (see the module docstring)."""
    if app.conf.task_send_sent_event or app.current_worker_task is not None:
        return False
    watched = (signals.before_task_publish, signals.after_task_publish, signals.task_sent)
    return not any(
        receiver[0][0] not in OWN_RECEIVERS for signal in watched for receiver in signal.receivers
    )


def published_by_beat(request: Any) -> bool:
    """Was this delivery published by beat (a claimed, triggered or reclaimed run)?

    Celery keeps custom headers on a task's request, and copies them into its retries."""
    return getattr(request, ATTEMPT_HEADER, None) is not None


#: The ``dispatch_uid`` of the receiver that carries a retry's instants
#: (``beat.delivery.tracking``).
RETRY_INSTANTS_RECEIVER = "habeat.due_on_the_database_clock"
#: The ``dispatch_uid`` of the receiver that records a workflow's step as it is sent
#: (``beat.delivery.workflow_steps``).
STEP_RECORDER = "habeat.record_sent_step"
#: Signal receivers of this package that act only on a task's own publishes (a retry
#: sent from a worker) or on a workflow's steps, never on the messages beat stamps from
#: templates: they do not keep beat from its templates.
OWN_RECEIVERS = frozenset({RETRY_INSTANTS_RECEIVER, STEP_RECORDER})


def routes_by_name(app: Any) -> bool:
    """Whether ``app`` routes a task by its name alone (Celery's router with only
    ``task_routes`` mappings): then a template holds for any arguments."""
    router = app.amqp.router
    return type(router) is Router and all(type(route) is MapRoute for route in router.routes)


def build(
    app: Any, producer: Any, run: RunToPublish, options: Mapping[str, Any]
) -> MessageTemplate | None:
    """The template of ``run``'s schedule definition, ``options`` being its ``send_task``
    options (``beat.publish.dispatch.publish_options``), built by ``send_task`` itself; None if
    this message cannot be made from a template. Raises what ``send_task`` raises for
    the run's options or payload."""
    given = dict(options)
    given.pop("expires", None)  # stamped per run
    given.pop("retries", None)  # stamped per run
    given.pop("declare", None)
    recorder = _Recorder(producer.connection)
    app.send_task(
        run.task,
        args=run.args,
        kwargs=run.kwargs,
        task_id=_TEMPLATE_TASK_ID,
        producer=recorder,
        retry=False,
        add_to_parent=False,
        **given,
    )
    if recorder.published is None:
        return None
    body, kwargs = recorder.published
    headers = dict(kwargs["headers"])
    if headers.get("expires") is not None or headers.get("eta") is not None:
        return None  # the task's own options: relative to each send
    if "expiration" in kwargs or kwargs.get("content_type"):
        return None
    if not isinstance(body, tuple) or len(body) != 3 or not isinstance(body[2], dict):
        return None  # not protocol 2
    backend = app.backend
    backend_call = not headers.get("ignore_result") and (
        type(backend).on_task_call is not BaseBackend.on_task_call
    )
    return MessageTemplate(
        task=run.task,
        embed=body[2],
        serializer=kwargs.get("serializer"),
        headers=headers,
        publish_kwargs={key: value for key, value in kwargs.items() if key not in _NOT_KEPT},
        declare=tuple(kwargs.get("declare") or ()),
        backend_call=backend_call,
    )


class Templates:
    """The templates of one Celery app, by schedule definition (bounded: ``MAX_TEMPLATES``)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._by_key: dict[tuple[Any, ...], MessageTemplate | None] = {}
        self.by_name = routes_by_name(app)

    def check_routing(self) -> None:
        """Look again at how the app routes (``routes_by_name``): once per publish."""
        self.by_name = routes_by_name(self.app)

    def key(self, run: RunToPublish) -> tuple[Any, ...]:
        """What a template depends on: runs with equal keys share it. The task and its
        options; the arguments too if a router may look at them."""
        if self.by_name:
            return (run.task, repr(run.options))
        return (run.task, repr(run.options), repr(run.args), repr(run.kwargs))

    def has(self, key: tuple[Any, ...]) -> bool:
        return key in self._by_key

    def cached(self, key: tuple[Any, ...]) -> MessageTemplate | None:
        """The template of ``key`` (``has`` it); None: its runs go with ``send_task``."""
        return self._by_key[key]

    def build(
        self, key: tuple[Any, ...], producer: Any, run: RunToPublish, options: Mapping[str, Any]
    ) -> MessageTemplate | None:
        """Build (``build``), keep and return the template of ``key``; not kept if
        ``send_task`` raises (the run is at fault, and rejected)."""
        template = build(self.app, producer, run, options)
        if len(self._by_key) >= MAX_TEMPLATES:
            del self._by_key[next(iter(self._by_key))]
        self._by_key[key] = template
        return template

    def clear(self) -> None:
        self._by_key.clear()

    def all(self) -> list[MessageTemplate | None]:
        """The templates kept (None for definitions sent with ``send_task``)."""
        return list(self._by_key.values())


_TEMPLATES: weakref.WeakKeyDictionary[Any, Templates] = weakref.WeakKeyDictionary()


def templates_of(app: Any) -> Templates:
    """The templates kept for ``app`` (made on first use)."""
    found = _TEMPLATES.get(app)
    if found is None:
        found = _TEMPLATES[app] = Templates(app)
    return found


def publish(
    app: Any,
    producer: Any,
    template: MessageTemplate,
    run: RunToPublish,
    expires: datetime | None,
    *,
    ttl: float | None = None,
    argsrepr: str,
    kwargsrepr: str,
    declare: bool,
    envelopes: Envelopes | None = None,
    mandatory: bool = False,
) -> None:
    """Publish ``run``'s message from its template through ``producer`` (in its batch, if
    one is open). ``expires``: when the run expires (``beat.publish.dispatch.expiry_of``);
    ``ttl``: the seconds left until then at the send (none if not known);
    ``argsrepr``, ``kwargsrepr``: the run's arguments as ``send_task`` is given them;
    ``declare``: whether the template's queues are to be declared (once per batch is
    enough); ``envelopes``: the stamps of the open batch, if it is kombu's batch on
    Redis (``beat.publish.redis_envelopes``), to push the message without kombu once a run of
    the template taught them its envelope. Header keys stay in the order ``send_task``
    gives them. Raises what ``send_task`` raises for the run's arguments (TypeError,
    kombu's EncodeError)."""
    # As Celery's protocol 2 (``AMQP.as_task_v2``), then kombu's ``Producer.publish``.
    args = run.args or ()
    kwargs_ = run.kwargs or {}
    if not isinstance(args, list | tuple):
        raise TypeError("task args must be a list or tuple")
    if not isinstance(kwargs_, Mapping):
        raise TypeError("task keyword arguments must be a mapping")
    content_type, content_encoding, body = dumps(  # type: ignore[no-untyped-call]
        (args, kwargs_, template.embed), serializer=template.serializer
    )
    task_id = run.celery_task_id
    headers = template.headers.copy()
    headers["id"] = task_id
    headers["root_id"] = task_id
    headers["argsrepr"] = argsrepr
    headers["kwargsrepr"] = kwargsrepr
    headers["retries"] = run.retries
    headers[SCHEDULE_HEADER] = run.schedule_name
    headers[FIRE_AT_HEADER] = run.fire_at.isoformat() if run.fire_at else None
    headers[ATTEMPT_HEADER] = run.attempt + 1
    kwargs = template.publish_kwargs.copy()
    kwargs["correlation_id"] = task_id
    if "argsrepr" in kwargs:  # send_task hands its options on as properties too
        kwargs["argsrepr"] = argsrepr
    if "kwargsrepr" in kwargs:
        kwargs["kwargsrepr"] = kwargsrepr
    kwargs["reply_to"] = app.thread_oid
    if mandatory:  # on RabbitMQ: an unroutable message is returned (``beat.publish.returns``)
        kwargs["mandatory"] = True
    if expires is not None:
        headers["expires"] = expires.isoformat()
        if ttl is not None:
            kwargs["expiration"] = ttl
    if template.backend_call:
        with _library_errors(producer):
            app.backend.on_task_call(producer, task_id)
    if envelopes is None:
        _publish(producer, template, body, content_type, content_encoding, headers, kwargs, declare)
        return
    values = None
    if envelopes.wants_values(template):
        values = envelopes.values(
            body,
            content_type,
            content_encoding,
            headers,
            _STAMPED_HEADERS if expires is None else _STAMPED_HEADERS_EXPIRING,
            kwargs,
            _stamped_properties(kwargs),
        )
        if envelopes.push(template, values):
            return
    before = envelopes.mark()
    _publish(producer, template, body, content_type, content_encoding, headers, kwargs, declare)
    envelopes.published(template, before, values)


def _publish(
    producer: Any,
    template: MessageTemplate,
    body: Any,
    content_type: str,
    content_encoding: str,
    headers: dict[str, Any],
    kwargs: dict[str, Any],
    declare: bool,
) -> None:
    with _library_errors(producer):
        producer.publish(
            body,
            content_type=content_type,
            content_encoding=content_encoding,
            headers=headers,
            declare=list(template.declare) if declare else [],
            retry=False,
            **kwargs,
        )


def _stamped_properties(kwargs: Mapping[str, Any]) -> tuple[str, ...]:
    """The properties ``publish`` stamps for a run, in a message's envelope."""
    return tuple(name for name in _STAMPED_PROPERTIES if name in kwargs)


@contextlib.contextmanager
def _library_errors(producer: Any) -> Iterator[None]:
    """As ``send_task``: the transport's errors raised as kombu's."""
    with producer.connection._reraise_as_library_errors():
        yield
