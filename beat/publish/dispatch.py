"""Publishing claimed runs to the Celery broker, with the run ID as the task ID.

Beat publishes by task name (``send_task``): it needs no job code. It never
publishes with an ETA or countdown (a delay longer than the broker's
visibility timeout would run the task twice).

On Redis, runs go out in chunks through kombu's producer batches
(``Producer.batch``): a chunk is one pipelined round trip instead of one per
message, which is what bounds a leader's publish rate, and its pushes to one queue
are folded into one command per 1,000 messages (``beat.publish.redis_pushes``). A chunk
whose flush fails has an uncertain outcome (some of its messages may be in the
queue): its runs stay in the outbox and are published again, and the worker's guard
refuses a second delivery of a run. Other transports (RabbitMQ) take a plain
``producer.publish`` per message, and a run counts as published once its own
publish returned: a failure stops at that run, and none sent before it is sent again
(``batches`` tells the two apart).

A message's expiry is an instant, fire time + ``expires`` (the ``expires`` header),
and its time to live (RabbitMQ's ``expiration``) what is left of it at the send by
the database's clock (``beat.records.DatabaseClock``), never by this host's: a beat host
whose clock is ahead would send runs already dead.

A schedule's runs differ only in their task ID, fire time, attempt and expiry, and the
schedules of one task and options only in their arguments besides: their messages are
stamped from a template built once per task and options (``beat.publish.messages``) rather
than built from scratch by ``send_task`` each time. On Redis, kombu publishes the
first three of them in a batch, and the others' envelopes are stamped from its own
(``beat.publish.redis_envelopes``).

Runs claimed ahead of their fire time are built into a batch before it and
sent at it (``publish_at``): their lateness is one Redis round trip. Nothing of
them reaches the broker before that time, whatever the routing or transport (where
a batch cannot hold them, they are built at that time).

Two kinds of failure are told apart. A broker error (the broker is down, a
connection drops) stops publishing: the rest stay in the outbox for the next
pass. A run whose own options or payload cannot be made into a message (say
``options.headers`` is not an object) would fail the same way every time: it is
left out and returned in ``rejected``, and the others are published.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from kombu.exceptions import EncodeError
from kombu.exceptions import OperationalError as KombuOperationalError
from kombu.transport.redis import Channel as RedisChannel

from beat.errors import HABeatError, InvalidSchedule, error_text
from beat.models import RunToPublish, UnpublishableRun
from beat.publish import messages
from beat.publish.confirms import confirm_publishes
from beat.publish.messages import ATTEMPT_HEADER, FIRE_AT_HEADER, SCHEDULE_HEADER
from beat.publish.messages import published_by_beat as published_by_beat
from beat.publish.redis_envelopes import Envelopes
from beat.publish.redis_pushes import fold_pushes
from beat.publish.returns import Returns, watched
from beat.publish.workflows import WORKFLOW_TASK, send_workflow
from beat.schedule.options import check_publish_options

if TYPE_CHECKING:
    from beat.records import DatabaseClock

logger = logging.getLogger(__name__)

#: Messages per producer batch: one Redis pipeline each. Large enough that the
#: round trip is amortised, small enough that a failed flush leaves few runs to
#: publish again.
CHUNK = 500

#: ``publish_at`` lets its caller act (``while_waiting``) at least this often (seconds)
#: while it waits for a deadline, and after building this many messages.
WAIT_STEP = 1.0
BUILD_STEP = 2000

#: Size of the producer batch of ``publish_at``: never reached. kombu flushes a batch
#: by itself once it holds ``max_size`` Redis commands, and one message takes an
#: LPUSH per queue its exchange routes it to (plus a PEXPIRE per priority step of a
#: queue with an expiry): no size derived from the number of messages fits every
#: routing, and an early flush would send runs before their fire time.
NEVER_FLUSH = sys.maxsize

#: ``argsrepr``/``kwargsrepr`` (shown by Flower and in worker logs) are cut to this.
REPR_LIMIT = 1024

#: Build messages from templates made once per schedule definition (``beat.publish.messages``)
#: rather than with ``send_task`` for each; False sends every message with ``send_task``.
TEMPLATES = True

#: Push the messages of a template's runs as envelopes stamped from those kombu built
#: for its first runs in the batch (``beat.publish.redis_envelopes``, on Redis); False has
#: kombu publish each.
ENVELOPES = True

#: Routing options of a run: a queue is declared once per batch for each distinct set.
ROUTING_OPTIONS = ("queue", "exchange", "routing_key", "exchange_type")

#: Errors that building one message raises when the run's own options or payload are
#: wrong (a type, a value, an unknown queue, a payload that does not serialise).
RUN_FAULTS: tuple[type[Exception], ...] = (
    TypeError,
    ValueError,
    LookupError,
    ArithmeticError,
    EncodeError,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishResult:
    published: list[uuid.UUID]
    #: The error that stopped publishing, if any; the unpublished runs stay in the outbox.
    error: Exception | None = None
    #: Runs left out because their message cannot be built; the others went on.
    rejected: list[UnpublishableRun] = field(default_factory=list)
    #: Seconds ``publish_at`` took to build the messages ahead (0 if it built none).
    built_in: float = 0.0


class CeleryPublisher:
    """The leader loop's publisher: a Celery app's producer pool and its control channel.
    On RabbitMQ, its publishes are confirmed by the broker (``confirm_publishes``)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        confirm_publishes(app)

    def publish(
        self, runs: Sequence[RunToPublish], *, database: DatabaseClock | None = None
    ) -> PublishResult:
        return publish_runs(self.app, runs, database=database)

    def publish_at(
        self,
        runs: Sequence[RunToPublish],
        deadline: float,
        *,
        database: DatabaseClock | None = None,
        before_send: Callable[[], None] | None = None,
        while_waiting: Callable[[], float] | None = None,
    ) -> PublishResult:
        return publish_at(
            self.app,
            runs,
            deadline,
            database=database,
            before_send=before_send,
            while_waiting=while_waiting,
        )

    def revoke(self, run_ids: Sequence[uuid.UUID]) -> None:
        self.app.control.revoke([str(run_id) for run_id in run_ids])

    def terminate(self, task_ids: Sequence[str]) -> None:
        """Revoke the tasks and terminate the pool processes running them (SIGTERM)."""
        self.app.control.revoke(list(task_ids), terminate=True)


def batches(producer: Any) -> bool:
    """Whether a batch of ``producer`` holds its messages until it is flushed: kombu's
    batch on its Redis virtual channel (a redis-py pipeline), the only one ours is built
    for (``beat.publish.redis_envelopes``, ``beat.publish.redis_pushes``). Elsewhere
    (RabbitMQ, a Redis transport that may retry a pipeline) each message goes with
    ``producer.publish``, handed to the broker as it is built."""
    return bool(producer.supports_batch_publish) and isinstance(producer.channel, RedisChannel)


@dataclass(slots=True)
class _Sending:
    """What the messages of one publish share."""

    app: Any
    producer: Any
    #: Runs left out because their message cannot be built.
    rejected: list[UnpublishableRun]
    templates: messages.Templates | None
    #: The database's clock (``beat.records.DatabaseClock``); None: no time to live is set.
    database: DatabaseClock | None
    #: ``time.monotonic()`` of the send, for messages built ahead of it.
    send_at: float | None = None
    #: The stamps of the batch open on the producer (``beat.publish.redis_envelopes``).
    envelopes: Envelopes | None = None
    #: Routing options whose queues were declared (once per publish is enough).
    declared: set[tuple[Any, ...]] = field(default_factory=set)
    returns: Returns | None = None  # unroutable messages (``beat.publish.returns``)

    def database_now(self) -> datetime | None:
        """The database's time at which the message being built is sent, if known."""
        if self.database is None:
            return None
        sent = time.monotonic()
        if self.send_at is not None:
            sent = max(sent, self.send_at)
        return self.database.now_at(sent)


def publish_runs(
    app: Any, runs: Sequence[RunToPublish], *, database: DatabaseClock | None = None
) -> PublishResult:
    """Publish ``runs`` in order; stop at the first broker error. On Redis (``batches``)
    a chunk goes per producer batch, and ``published`` lists the runs of the chunks whose
    flush succeeded; elsewhere the runs whose message the broker took, one by one.
    ``database``: the database's clock, which times the messages' expiry."""
    published: list[RunToPublish] = []
    rejected: list[UnpublishableRun] = []
    if not runs:
        return PublishResult(published=[])
    try:
        with app.producer_or_acquire() as producer, watched(app, producer) as returns:
            sending = _Sending(app, producer, rejected, _templates(app), database, returns=returns)
            if batches(producer):
                for chunk in _chunks(runs, CHUNK):
                    _send_batch(sending, chunk, into=published)
            else:
                _send_all(sending, runs, into=published)
    except Exception as exc:  # the broker's errors are many and transport-specific
        logger.error(
            "publishing stopped after %d of %d runs: %s; the rest stay in the outbox",
            len(published),
            len(runs),
            exc,
            extra={"published": len(published), "due": len(runs)},
        )
        return PublishResult(published=[run.id for run in published], error=exc, rejected=rejected)
    return PublishResult(published=[run.id for run in published], rejected=rejected)


def _send_batch(
    sending: _Sending, runs: Sequence[RunToPublish], *, into: list[RunToPublish]
) -> None:
    """Send ``runs`` in one producer batch; they go ``into`` once its flush succeeded."""
    producer = sending.producer
    sent: list[RunToPublish] = []
    with producer.batch(max_size=len(runs) + 1):
        sending.envelopes = _envelopes(producer)
        _send_all(sending, runs, into=sent)
        fold_pushes(producer)
    into += sent


def publish_at(
    app: Any,
    runs: Sequence[RunToPublish],
    deadline: float,
    *,
    database: DatabaseClock | None = None,
    before_send: Callable[[], None] | None = None,
    while_waiting: Callable[[], float] | None = None,
) -> PublishResult:
    """Build the messages of ``runs`` now and send them together at ``deadline``
    (``time.monotonic()``): at the fire time, only one round trip is left to do.

    Nothing is handed to the broker before ``deadline``: on Redis (``batches``) the
    messages wait in a kombu producer batch that never flushes by itself
    (``NEVER_FLUSH``), and are reported published all or none, less those ``rejected``
    (a failed send may have delivered some: they are sent again, and the worker's guard
    runs each once). Elsewhere they are built and sent one by one at the deadline, and
    those the broker took are reported published even if a later one fails.
    ``before_send`` is called at the deadline, just before the send: a ``HABeatError``
    from it (e.g. this process no longer leads) discards the messages and propagates.
    A burst takes seconds to build, then waits for its time: meanwhile
    ``while_waiting`` is called between chunks of ``BUILD_STEP`` messages and then at
    least every ``WAIT_STEP`` seconds, and it returns in how many seconds it wants to
    be called again (the caller sends an earlier fire time's runs from it).
    ``database``: the database's clock, which times the messages' expiry. A workflow's
    canvas is sent by Celery's canvas code, which keeps to no batch: after the deadline.
    """
    published: list[RunToPublish] = []
    rejected: list[UnpublishableRun] = []
    built_in = 0.0
    if not runs:
        return PublishResult(published=[])
    workflows = [run for run in runs if run.task == WORKFLOW_TASK]
    runs = [run for run in runs if run.task != WORKFLOW_TASK]
    try:
        with app.producer_or_acquire() as producer, watched(app, producer) as returns:
            sending = _Sending(
                app, producer, rejected, _templates(app), database, deadline, returns=returns
            )
            if batches(producer):
                built_in = _build_then_send(
                    sending, runs, deadline, before_send, while_waiting, into=published
                )
            else:
                _wait_until(deadline, while_waiting)
                if before_send is not None:
                    before_send()
                _send_all(sending, runs, into=published)
            _send_all(sending, workflows, into=published)
    except HABeatError:
        raise  # from before_send: not the broker's error, nothing was sent
    except Exception as exc:  # the broker's errors are many and transport-specific
        logger.error(
            "publishing %d runs at their fire time failed after %d: %s",
            len(runs),
            len(published),
            exc,
            extra={"published": len(published), "due": len(runs)},
        )
        return PublishResult(published=[run.id for run in published], error=exc, rejected=rejected)
    done = [run.id for run in published]
    return PublishResult(published=done, rejected=rejected, built_in=built_in)


def _build_then_send(
    sending: _Sending,
    runs: Sequence[RunToPublish],
    deadline: float,
    before_send: Callable[[], None] | None,
    while_waiting: Callable[[], float] | None,
    *,
    into: list[RunToPublish],
) -> float:
    """Build the messages of ``runs`` into a batch that sends nothing before it is
    flushed, wait for ``deadline``, then flush it; the seconds the build took. The runs
    go ``into`` once the flush succeeded."""
    producer = sending.producer
    sent: list[RunToPublish] = []
    with producer.batch(max_size=NEVER_FLUSH):
        sending.envelopes = _envelopes(producer)
        started = time.monotonic()
        _send_all(sending, runs, into=sent, between=while_waiting)
        fold_pushes(producer)  # one LPUSH per 1,000 messages at the fire time
        built_in = time.monotonic() - started
        _wait_until(deadline, while_waiting)
        if before_send is not None:
            before_send()
    into += sent
    return built_in


def _wait_until(deadline: float, while_waiting: Callable[[], float] | None) -> None:
    while deadline > time.monotonic():
        step = WAIT_STEP if while_waiting is None else max(0.0, while_waiting())
        # What is left after the call: it may have sent an earlier fire time meanwhile.
        time.sleep(max(0.0, min(deadline - time.monotonic(), WAIT_STEP, step)))


def _sent(sending: _Sending, run: RunToPublish) -> bool:
    """Add the message of ``run`` to the producer's batch, or send it; False (and the
    error in ``rejected``) if the run cannot be made into a message. Broker errors raise."""
    try:
        _send(sending, run)
    except Exception as exc:
        if not is_run_fault(exc, sending.producer.connection):
            raise
        sending.rejected.append(UnpublishableRun(run=run, error=error_text(exc)))
        return False
    unroutable = sending.returns and sending.returns.returned(run.celery_task_id)
    if unroutable:
        sending.rejected.append(UnpublishableRun(run=run, error=unroutable))
    return not unroutable


def is_run_fault(exc: Exception, connection: Any) -> bool:
    """Whether ``exc``, raised while one message was built, comes from the run itself
    rather than from the broker. Anything that may be the broker's counts as the
    broker's: a run wrongly taken for faulty would be failed, one wrongly taken for a
    broker error only waits in the outbox."""
    broker_errors = (
        OSError,
        KombuOperationalError,
        *getattr(connection, "connection_errors", ()),
        *getattr(connection, "channel_errors", ()),
    )
    return isinstance(exc, RUN_FAULTS) and not isinstance(exc, broker_errors)


def _send_all(
    sending: _Sending,
    runs: Sequence[RunToPublish],
    *,
    into: list[RunToPublish],
    between: Callable[[], float] | None = None,
) -> None:
    """Add the messages of ``runs`` to the batch (or send them), and each run whose
    message was built ``into``, as it goes. ``between`` is called after every
    ``BUILD_STEP`` of them."""
    for chunk in _chunks(runs, BUILD_STEP):
        for run in chunk:
            if _sent(sending, run):
                into.append(run)
        if between is not None and len(chunk) == BUILD_STEP:
            between()


def _send(sending: _Sending, run: RunToPublish) -> None:
    app, producer = sending.app, sending.producer
    if run.task == WORKFLOW_TASK:  # its canvas, not a message of its own
        return send_workflow(app, producer, run, mandatory=sending.returns is not None)
    # kombu would re-check the queue declaration on every message; once a batch is enough.
    routing = tuple(repr(run.options.get(key)) for key in ROUTING_OPTIONS)
    template, options = _template(producer, run, sending.templates)
    expires = expiry_of(run)
    ttl = None if expires is None else time_to_live(expires, sending.database_now())
    if template is not None:
        messages.publish(
            app,
            producer,
            template,
            run,
            expires,
            ttl=ttl,
            argsrepr=_short_repr(run.args),
            kwargsrepr=_short_repr(run.kwargs),
            declare=routing not in sending.declared,
            envelopes=sending.envelopes,
            mandatory=sending.returns is not None,
        )
        sending.declared.add(routing)
        return
    options = publish_options(run) if options is None else options
    if run.options.get("expires") is None:
        database_now = sending.database_now()
        own = task_expiry(app, run.task, database_now)
        if own is not None:
            options["expires"], ttl = own, time_to_live(own, database_now)
    if routing in sending.declared:
        options["declare"] = []
    if sending.returns is not None:
        options["mandatory"] = True  # an unroutable message comes back (``returns``)
    send_plain(app, producer, run, options, ttl=ttl)
    sending.declared.add(routing)  # only once a message went through the declaration


def time_to_live(expires: datetime, database_now: datetime | None) -> float | None:
    """Seconds a message expiring at ``expires`` may wait in its queue, sent when the
    database's clock shows ``database_now`` (none left if past); None if that is not
    known: then the message has no time to live, and the worker decides by its
    ``expires`` header. Never from this host's wall clock, which may be off."""
    if database_now is None:
        return None
    return max(0.0, (expires - database_now).total_seconds())


def task_expiry(app: Any, task: str, database_now: datetime | None) -> datetime | None:
    """When the task's own ``expires`` option (Celery's task option, counted from the
    send) makes a message sent at ``database_now`` expire; None if it has none, or if
    the database's time is not known (Celery then counts it from this host's clock)."""
    own = getattr(app.tasks.get(task), "expires", None)
    if database_now is None or own is None or isinstance(own, bool):
        return None
    if isinstance(own, int | float):
        return database_now + timedelta(seconds=float(own))
    if isinstance(own, str):
        own = datetime.fromisoformat(own)
    if isinstance(own, datetime):
        return own if own.tzinfo else own.replace(tzinfo=UTC)
    return None


def send_plain(
    app: Any,
    producer: Any,
    run: RunToPublish,
    options: dict[str, Any],
    *,
    ttl: float | None = None,
) -> None:
    """Publish ``run`` with ``send_task``: every message built from scratch. Its expiry
    (``options["expires"]``, from ``publish_options``) is written as a template writes
    it: the ``expires`` header is the instant, and ``ttl`` the time to live; Celery
    would count both from this host's clock."""
    app.send_task(
        run.task,
        args=run.args,
        kwargs=run.kwargs,
        task_id=run.celery_task_id,
        producer=producer,
        # Inside a batch nothing is sent until the flush: a publish retry has nothing to
        # retry, and a failed flush leaves the runs in the outbox.
        retry=False,
        **_expiring(options, ttl),
    )


def _expiring(options: dict[str, Any], ttl: float | None) -> dict[str, Any]:
    """``send_task`` options expiring the message at ``options["expires"]`` (a datetime,
    if any) with a time to live of ``ttl``: Celery is given no ``expires`` (it would
    compute the time to live from this host's clock), the header and the property."""
    expires = options.get("expires")
    if not isinstance(expires, datetime):
        return options
    headers = {**options.get("headers", {}), "expires": expires.isoformat()}
    given = options | {"expires": None, "headers": headers}
    if ttl is not None:
        given["expiration"] = ttl
    return given


def _templates(app: Any) -> messages.Templates | None:
    """The message templates of ``app`` for one publish, or None to send every message
    with ``send_task`` (``TEMPLATES`` off, or what ``beat.publish.messages.usable`` refuses)."""
    if not TEMPLATES or not messages.usable(app):
        return None
    templates = messages.templates_of(app)
    templates.check_routing()
    return templates


def _envelopes(producer: Any) -> Envelopes | None:
    """The envelope stamps of the batch open on ``producer`` (``beat.publish.redis_envelopes``),
    or None to have kombu publish every message (``ENVELOPES`` off)."""
    return Envelopes.of(producer) if ENVELOPES else None


def _template(
    producer: Any, run: RunToPublish, templates: messages.Templates | None
) -> tuple[messages.MessageTemplate | None, dict[str, Any] | None]:
    """The message template of ``run``'s task and options, and the run's options if
    they had to be made (to build the template). No template for ad hoc runs (they carry
    the options of whoever sent them), nor for an expiry that cannot be placed in time
    (``send_task`` counts it from the send)."""
    if templates is None or run.schedule_name is None:
        return None, None
    if run.options.get("expires") is not None and expiry_of(run) is None:
        return None, None
    key = templates.key(run)
    if templates.has(key):
        # Its options were checked when it was built: the key holds them all. The
        # arguments are checked as the message is stamped.
        return templates.cached(key), None
    options = publish_options(run)
    return templates.build(key, producer, run, options), options


def publish_options(run: RunToPublish) -> dict[str, Any]:
    """``send_task`` options of a run: its schedule's options plus our headers.

    Raises ValueError for options a schedule may not carry (rows written with psql, or
    before these checks): see ``beat.schedule.options``. An ad hoc run (no schedule) carries the
    options Celery itself sent it with, which are not a schedule's."""
    if run.schedule_name is not None:
        try:
            check_publish_options(run.options)
        except InvalidSchedule as exc:
            raise ValueError(str(exc)) from None
    if not isinstance(run.options, Mapping):
        raise TypeError(f"options must be a JSON object, got {type(run.options).__name__}")
    options = dict(run.options)
    given = options.pop("headers", None) or {}
    if not isinstance(given, Mapping):
        raise TypeError(
            f"options.headers must be a JSON object, got {type(given).__name__}: {given!r:.80}"
        )
    headers = dict(given)
    headers[SCHEDULE_HEADER] = run.schedule_name
    headers[FIRE_AT_HEADER] = run.fire_at.isoformat() if run.fire_at else None
    headers[ATTEMPT_HEADER] = run.attempt + 1  # the attempt this delivery starts
    options["headers"] = headers
    expires = expiry_of(run)
    if expires is not None:
        # Relative to the fire time, not to this send: a run published again later
        # (outbox, reaper) never runs past the expiry its schedule gave it.
        options["expires"] = expires
    if run.retries:
        options["retries"] = run.retries  # the task's retry budget goes on where it was
    options.setdefault("argsrepr", _short_repr(run.args))
    options.setdefault("kwargsrepr", _short_repr(run.kwargs))
    return options


def expiry_of(run: RunToPublish) -> datetime | None:
    """When the run's ``expires`` option makes it expire: seconds after its fire time
    (jitter included: a jitter longer than ``expires`` lets the run expire), or an
    absolute time (ad hoc runs keep their caller's); None if it has none, or none that
    can be placed in time."""
    expires = run.options.get("expires")
    if isinstance(expires, bool) or expires is None:
        return None
    if isinstance(expires, int | float):
        if run.fire_at is None:
            return None
        return run.fire_at + timedelta(seconds=float(expires))
    if isinstance(expires, str):
        try:
            moment = datetime.fromisoformat(expires)
        except ValueError:
            return None
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return None


def _short_repr(value: Any) -> str:
    """A stand-in for Celery's ``saferepr`` of JSON arguments, some 20 times cheaper."""
    text = repr(value)
    return text if len(text) <= REPR_LIMIT else text[: REPR_LIMIT - 3] + "..."


def _chunks(runs: Sequence[RunToPublish], size: int) -> Iterator[Sequence[RunToPublish]]:
    for start in range(0, len(runs), size):
        yield runs[start : start + size]
