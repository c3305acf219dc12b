"""Which of some task IDs the broker still holds: the reaper's evidence that a message is gone.

A run stays ``queued`` while its message waits in the broker or a worker holds
it unacknowledged. A message the broker lost (Redis restarted without
persistence, a key evicted, a worker killed between taking a message and
recording it) would otherwise be noticed only after twice the visibility
timeout. On Redis, the broker's content can be read: ``held_task_ids`` looks
for the task IDs of some runs in their queues' lists and in kombu's ``unacked``
hash, so that only runs whose message is really gone are published again.

kombu's Redis transport, as this module reads it (kombu/transport/redis.py):

- a queue is one list per priority step (``priority_steps``, by default 0, 3, 6
  and 9): ``<queue>`` for step 0, ``<queue><sep><step>`` for the others
  (``sep`` is ``"\\x06\\x16"`` by default); messages are LPUSHed at the head and
  consumed from the tail (BRPOP);
- a message delivered to a consumer that has not acked it yet is a field of the
  ``unacked`` hash (key ``unacked_key``), its value the JSON
  ``[message, exchange, routing_key]``, its field the delivery tag; the same tag
  is a member of the ``unacked_index`` sorted set (``unacked_index_key``), scored
  with the time of the delivery (the consumer's ``time.time()``), written with
  the hash entry in one transaction (``QoS.append``); kombu moves it back to its
  queue once it is older than the visibility timeout (``restore_visible``);
- every key carries ``global_keyprefix`` (a transport option);
- a message is a JSON envelope whose body is base64: the only ``"id"`` keys in
  it are its headers' (the task ID, protocol 2) and any that a caller put in
  custom headers, so a regular expression finds the task ID without parsing it.

Other brokers (RabbitMQ...) do not let a client read a queue without consuming
it: ``held_task_ids`` returns None there, and the caller keeps the
visibility-timeout rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
from kombu.transport import redis as kombu_redis

#: Messages (or unacked entries) read per Redis round trip: a page of messages of
#: about 1 KiB each is about 1 MiB, which bounds the scan's memory.
PAGE_SIZE = 1000

#: The task ID in a raw envelope: the value of an ``"id"`` key, JSON escapes kept.
#: Inside a JSON string every quote is escaped, so ``"id":`` is always a key.
_TASK_ID = re.compile(rb'"id"\s*:\s*"((?:[^"\\]|\\.)*)"')


def queue_of(
    app: Any,
    task: str,
    options: Mapping[str, Any],
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> str | None:
    """The queue that ``app.send_task(task, args=args, kwargs=kwargs, **options)``
    puts its message in.

    The destination is worked out as Celery does it: the options of the task if
    it is registered with ``app``, then ``options`` (``queue``, ``exchange``,
    ``routing_key``, ``exchange_type``), else the app's ``task_routes``, else
    ``task_default_queue``. ``args`` and ``kwargs`` matter only to routers that
    look at them.

    None when the message goes through a named exchange that is not a direct
    exchange bound to one of the app's declared queues (``task_queues``) with
    that routing key: its queue is then the broker's to decide, and the caller
    should keep the visibility-timeout rule for that run. Raises what
    ``send_task`` raises for a queue missing from ``task_queues`` when
    ``task_create_missing_queues`` is off.
    """
    route = app.amqp.router.route(
        {**_registered_options(app, task), **options},
        task,
        list(args),
        dict(kwargs or {}),
        _registered_task(app, task),
    )
    return _destination(app, route)


def held_task_ids(
    app: Any,
    queues: Collection[str],
    task_ids: Collection[str],
    *,
    delivered_since: float | None = None,
    page_size: int = PAGE_SIZE,
) -> set[str] | None:
    """The IDs among ``task_ids`` whose message the broker holds: waiting in one
    of ``queues`` (any priority) or delivered to a consumer and not acked yet.
    None when the broker is not Redis, or does not record unacked messages
    (``ack_emulation`` off): the broker's content cannot be read, nothing is
    known. Connects with the app's broker settings (URL, TLS, credentials,
    ``broker_transport_options``).

    ``delivered_since`` (seconds since the epoch): a delivery older than this
    does not count (its ``unacked_index`` score is earlier): the message is held
    only by the unacked hash, for a consumer that may be dead, until kombu
    restores it after the visibility timeout. The scores are the consuming
    workers' wall clocks: the caller allows for their skew (``beat.leader.lost_messages``
    compares them with the database's clock, with a margin). An ID is then held if its message
    waits in a queue or one of its deliveries (several under one task ID, once a
    run was published again) is that recent. An entry without a score (none
    that kombu writes) counts as recent. None (the default): every delivery
    counts.

    Reads at most ``page_size`` messages per round trip, the lists from their
    head (newest) to their tail, then the unacked hash, and stops once every ID
    is found. Walking a list from its head skips no message that stays in it
    while new ones are pushed and old ones consumed; a message consumed during
    the walk is in the unacked hash, read afterwards.

    What one look cannot see, and why a caller must look twice: a worker's BRPOP
    takes a message off its list a moment before kombu records it in the unacked
    hash (a separate command), and a message whose visibility timeout ran out
    moves back from the hash to a list, possibly one this look has read
    already. Such a message is in neither place as far as this look can tell,
    and its ID is reported missing. Act on a run only when its ID is missing
    from two looks some seconds apart, the run still ``queued`` all along: a
    message in transit is found again by the next look, one really lost (or
    popped by a worker that died before recording it) stays missing.

    Raises the broker's connection errors (kombu's ``OperationalError`` or
    redis-py's errors): the caller then knows nothing and should act on nothing.
    """
    holdings = broker_holdings(app, queues, task_ids, page_size=page_size)
    if holdings is None:
        return None
    return holdings.waiting | {
        task_id
        for task_id, score in holdings.delivered.items()
        if delivered_since is None or score is None or score >= delivered_since
    }


@dataclass(frozen=True, kw_only=True, slots=True)
class Holdings:
    """Where the broker holds the messages of some task IDs (``broker_holdings``)."""

    #: IDs with a message waiting in one of the queues.
    waiting: set[str]
    #: IDs not waiting but delivered to a consumer and not acked yet, each with the
    #: newest delivery's ``unacked_index`` score (the consuming worker's wall clock;
    #: None if kombu wrote none, or it was acked or restored meanwhile).
    delivered: dict[str, float | None]


def broker_holdings(
    app: Any, queues: Collection[str], task_ids: Collection[str], *, page_size: int = PAGE_SIZE
) -> Holdings | None:
    """What ``held_task_ids`` reads, kept apart: the IDs waiting in ``queues`` and those
    held by deliveries only, with their scores, so that a caller can judge a delivery's
    age by a clock of its own (``beat.leader.lost_messages``). None where the broker's content
    cannot be read; raises the broker's connection errors."""
    with app.connection_for_write() as connection:
        # Checked on the transport class: a non-Redis broker is never contacted.
        if not issubclass(connection.get_transport_cls(), kombu_redis.Transport):
            return None
        wanted = set(task_ids)
        if not wanted:
            return Holdings(waiting=set(), delivered={})
        channel = connection.default_channel
        if not channel.ack_emulation:
            return None
        # The channel's connection pool carries the app's URL, TLS and credentials;
        # keys are prefixed here, since kombu's own client prefixes only the
        # commands kombu sends (not LRANGE or HSCAN).
        client = redis.Redis(connection_pool=channel.client.connection_pool)
        prefix = channel.global_keyprefix
        waiting = _find(wanted, _lists(client, _queue_keys(channel, queues), page_size))
        missing = wanted - waiting
        delivered: dict[str, float | None] = {}
        for entries in _hash_pages(client, prefix + channel.unacked_key, page_size):
            if not missing:
                break
            for task_id, score in _delivered(
                client, prefix + channel.unacked_index_key, entries, missing
            ).items():
                delivered[task_id] = _newer(delivered.get(task_id, score), score)
        return Holdings(waiting=waiting, delivered=delivered)


def _registered_task(app: Any, task: str) -> Any:
    # Like send_task: read the registry without finalizing the app.
    return app._tasks.get(task)


def _registered_options(app: Any, task: str) -> dict[str, Any]:
    """The execution options (queue, routing_key...) a registered task declares."""
    registered = _registered_task(app, task)
    get_options = getattr(registered, "_get_exec_options", None)
    if not callable(get_options):
        return {}
    return {key: value for key, value in (get_options() or {}).items() if value is not None}


def _destination(app: Any, route: Mapping[str, Any]) -> str | None:
    """Where a routed message lands, as Celery's ``send_task_message`` and kombu's
    virtual exchanges decide it."""
    queue = route.get("queue")
    exchange = route.get("exchange")
    if queue is None and exchange is None:
        queue = app.amqp.default_queue
    if isinstance(queue, str):
        queue = app.amqp.queues[queue]
    exchange_type = route.get("exchange_type")
    if exchange_type is None:
        exchange_type = queue.exchange.type if queue is not None else "direct"
    if exchange_type != "direct":
        return None
    routing_key = route.get("routing_key")
    if not exchange or not routing_key:
        # The default (nameless) exchange: the routing key is the queue's name.
        return str(queue.name) if queue is not None else None
    return _bound_queue(app, getattr(exchange, "name", exchange), routing_key)


def _bound_queue(app: Any, exchange: str, routing_key: str) -> str | None:
    """The first declared queue bound to direct ``exchange`` with ``routing_key``."""
    for queue in app.amqp.queues.values():
        bound = queue.exchange
        if (
            bound is not None
            and bound.name == exchange
            and bound.type == "direct"
            and queue.routing_key == routing_key
        ):
            return str(queue.name)
    return None


def _queue_keys(channel: Any, queues: Iterable[str]) -> list[str]:
    """The Redis lists of ``queues``, one per priority step, with the key prefix."""
    keys = (
        channel.global_keyprefix + channel._q_for_pri(queue, step)
        for queue in queues
        for step in channel.priority_steps
    )
    return list(dict.fromkeys(keys))


def _lists(client: redis.Redis, lists: Iterable[str], page_size: int) -> Iterator[list[bytes]]:
    """Raw messages of ``lists``, a page at a time."""
    for key in lists:
        yield from _list_pages(client, key, page_size)


def _list_pages(client: redis.Redis, key: str, page_size: int) -> Iterator[list[bytes]]:
    # From the head: a push there shifts the unread messages further on (read
    # twice at worst), a pop at the tail shifts none.
    start = 0
    while True:
        page = cast(list[bytes], client.lrange(key, start, start + page_size - 1))
        if page:
            yield page
        if len(page) < page_size:
            return
        start += page_size


def _hash_pages(client: redis.Redis, key: str, page_size: int) -> Iterator[dict[bytes, bytes]]:
    """The unacked hash's entries (delivery tag: raw ``[message, exchange, routing_key]``),
    a page at a time."""
    cursor = 0
    while True:
        cursor, entries = cast(
            tuple[int, dict[bytes, bytes]], client.hscan(key, cursor, count=page_size)
        )
        if entries:
            yield entries
        if cursor == 0:
            return


def _delivered(
    client: redis.Redis, index: str, entries: dict[bytes, bytes], wanted: set[str]
) -> dict[str, float | None]:
    """The IDs of ``wanted`` that ``entries`` (unacked) hold, each with its delivery's
    score in the sorted set ``index`` (None: acked or restored since the hash was read,
    or not written by kombu; held as far as this look can tell)."""
    found = {
        tag: ids for tag, raw in entries.items() if (ids := wanted.intersection(_task_ids([raw])))
    }
    if not found:
        return {}
    with client.pipeline(transaction=False) as pipe:
        for tag in found:
            pipe.zscore(index, tag)
        scores = cast(list[float | None], pipe.execute())
    return {
        task_id: score for ids, score in zip(found.values(), scores, strict=True) for task_id in ids
    }


def _newer(first: float | None, second: float | None) -> float | None:
    """The newer of two deliveries' scores; None (as recent as can be) wins."""
    if first is None or second is None:
        return None
    return max(first, second)


def _find(wanted: set[str], pages: Iterable[list[bytes]]) -> set[str]:
    """The IDs of ``wanted`` seen in ``pages``; stops reading once all are seen."""
    missing = set(wanted)
    for page in pages:
        missing.difference_update(_task_ids(page))
        if not missing:
            break
    return wanted - missing


def _task_ids(raw_messages: list[bytes]) -> Iterator[str]:
    for match in _TASK_ID.finditer(b"\n".join(raw_messages)):
        raw = match.group(1)
        # A task ID with a quote or backslash in it is JSON-escaped in the envelope.
        yield json.loads(b'"' + raw + b'"') if b"\\" in raw else raw.decode()
