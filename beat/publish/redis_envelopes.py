"""Redis envelopes of a template's runs, stamped from the one kombu built for its first.

On Redis, kombu publishes a message as one JSON document, its envelope (the body in
base64, the headers, the properties, a delivery tag), pushed on the queue's list: in
a publish batch, one ``LPUSH`` added to the batch's pipeline. The runs of one message
template (``beat.publish.messages``) differ in a few values of that document only, so kombu's
way to it (its publish layers, its routing, the envelope built as a dict and encoded
whole, some 40 µs a message) is taken once per template and batch:

* the template's first runs in a batch are published by kombu, and the ``LPUSH``
  each added is read back: the list it goes to, and its document;
* the third run's document is cut at the values that differ from run to run into
  fixed pieces (a ``Stamp``), trusted only if it gives back, from each of the second
  and third runs' own values, the bytes kombu pushed for it (a value that differs
  between runs and is not stamped would be caught);
* each later run of the template in the batch is those pieces joined with its own
  values, encoded as kombu's JSON encodes them, pushed on the same list in the same
  pipeline, in order (a template routes all its runs alike: ``beat.publish.messages``).

A stamped run goes to the list kombu routed the template's third run to: kombu routes
each message as it is added to the batch, not as the batch is sent, so a binding made
or dropped while a batch is built reaches its later messages through kombu and not
through a stamp (they are all sent together, as if routed at that third run).

A publish that kombu makes otherwise (a queue with an expiry adds ``PEXPIRE``s, a
fanout exchange ``PUBLISH``es, a transport without a Redis pipeline) teaches nothing:
the template's runs go on through kombu. Nothing here is sent: the batch sends it all,
when kombu flushes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any, Final

from kombu.utils import json as kombu_json

from beat.publish.redis_pushes import batch_state, is_command

#: Where a value sits in an envelope: a top-level field, or a header or property.
Path = tuple[str, ...]

BODY: Final[Path] = ("body",)
CONTENT_TYPE: Final[Path] = ("content-type",)
CONTENT_ENCODING: Final[Path] = ("content-encoding",)
DELIVERY_TAG: Final[Path] = ("properties", "delivery_tag")
EXPIRATION: Final = "expiration"

#: A value no envelope holds, put where a per-run value goes to find it in the text.
_MARK: Final = "\x00habeat-stamp-{}\x00"


_ascii: Callable[[str], str] = encode_basestring_ascii


def encode(value: Any) -> str:
    """``value`` as kombu's JSON encoder writes it inside a document."""
    kind = type(value)
    if kind is str:
        return _ascii(value)
    if value is None:
        return "null"
    if kind is int:
        return int.__repr__(value)
    return str(kombu_json.dumps(value))  # type: ignore[no-untyped-call]


@dataclass(frozen=True, slots=True)
class Stamp:
    """An envelope cut at its per-run values: ``pieces`` around the values at ``order``."""

    pieces: tuple[str, ...]
    order: tuple[Path, ...]

    def render(self, values: Mapping[Path, Any]) -> str | None:
        """The envelope with ``values``; None unless they are exactly the stamp's."""
        if len(values) != len(self.order):
            return None
        try:
            found = [values[path] for path in self.order]
        except KeyError:
            return None
        parts: list[str] = [""] * (2 * len(found) + 1)
        parts[0::2] = self.pieces
        # Most values are strings: encoded here without a call to ``encode`` each.
        parts[1::2] = [_ascii(value) if type(value) is str else encode(value) for value in found]
        return "".join(parts)


def cut(document: str, paths: Iterable[Path]) -> Stamp | None:
    """The stamp of an envelope (``document``) at ``paths``; None if one is not in it,
    or if the document does not read back as kombu's JSON writes it."""
    try:
        envelope = json.loads(document)
    except ValueError:
        return None
    marks: dict[str, Path] = {}
    for index, path in enumerate(paths):
        holder: Any = envelope
        for name in path[:-1]:
            holder = holder.get(name) if isinstance(holder, dict) else None
        if not isinstance(holder, dict) or path[-1] not in holder:
            return None
        mark = _MARK.format(index)
        holder[path[-1]] = mark
        marks[encode(mark)] = path
    text = str(kombu_json.dumps(envelope))  # type: ignore[no-untyped-call]
    found: list[tuple[int, str]] = []
    for mark in marks:
        if text.count(mark) != 1:
            return None
        found.append((text.index(mark), mark))
    found.sort()
    pieces: list[str] = []
    start = 0
    for position, mark in found:
        pieces.append(text[start:position])
        start = position + len(mark)
    pieces.append(text[start:])
    return Stamp(pieces=tuple(pieces), order=tuple(marks[mark] for _, mark in found))


@dataclass(frozen=True, slots=True)
class _Push:
    """A push kombu added to the batch for one run: its command, and the run's values."""

    command: tuple[Any, ...]
    options: Mapping[str, Any]
    document: str
    values: Mapping[Path, Any]

    def rendered_by(self, stamp: Stamp) -> bool:
        """Whether ``stamp`` renders this push's document from its run's values."""
        try:
            tag = json.loads(self.document)["properties"]["delivery_tag"]
        except (ValueError, LookupError, TypeError):
            return False
        return stamp.render({**self.values, DELIVERY_TAG: tag}) == self.document


@dataclass(frozen=True, slots=True)
class _Learned:
    template: object
    #: The second run's push, until the third teaches the stamp (or that there is none).
    second: _Push | None = None
    taught: bool = False
    #: None once taught: the template's runs go through kombu in this batch.
    stamp: Stamp | None = None
    #: The push the stamp was cut from: later runs go with its command and options.
    source: _Push | None = None


class Envelopes:
    """The stamps of one open kombu publish batch on Redis, by message template."""

    def __init__(self, producer: Any, state: Any) -> None:
        self._producer = producer
        #: kombu's state of the open batch: its Redis session is made by its first publish.
        self._state = state
        self._session: Any = None
        self._learned: dict[int, _Learned] = {}

    @classmethod
    def of(cls, producer: Any) -> Envelopes | None:
        """The stamps of the batch open on ``producer``; None if there is none."""
        state = batch_state(producer)
        return None if state is None else cls(producer, state)

    def mark(self) -> tuple[list[Any] | None, int]:
        """Where the pipeline stands before kombu publishes a run (for ``published``): its
        commands and their number, or None if the batch has no Redis session yet."""
        session = _redis_session(self._state)
        if session is None:
            return None, 0
        stack: list[Any] = session.pipeline.command_stack
        return stack, len(stack)

    def wants_values(self, template: object) -> bool:
        """Whether a run of ``template`` is to be pushed from its stamp, or teaches it:
        then its ``values`` are to be given to ``push`` or ``published``."""
        learned = self._learned_of(template)
        return learned is not None and (learned.stamp is not None or not learned.taught)

    def published(
        self,
        template: object,
        before: tuple[list[Any] | None, int],
        values: Mapping[Path, Any] | None,
    ) -> None:
        """kombu published a run of ``template`` since ``before`` (``mark``), ``values``
        being the run's (``values``, without the delivery tag) if ``wants_values``.

        The template's second run in the batch is kept, and its third teaches the stamp:
        cut from the third's push, it must render both pushes from their own values (a
        value that differs from run to run and is not among them is caught). A template
        with one run per batch (one per schedule definition, when a router may look at
        the arguments) costs a look-up only."""
        learned = self._learned_of(template)
        if learned is None:
            self._learned[id(template)] = _Learned(template)
            return
        if learned.taught or values is None:
            return
        push = self._pushed(before, values)
        if learned.second is None and push is not None:
            self._learned[id(template)] = _Learned(template, second=push)
            return
        stamp = None
        if learned.second is not None and push is not None:
            stamp = cut(push.document, [*values, DELIVERY_TAG])
            second = learned.second
            if stamp is not None and not (
                push.command == second.command
                and push.options == second.options
                and push.rendered_by(stamp)
                and second.rendered_by(stamp)
            ):
                stamp = None
        source = None if stamp is None else push
        self._learned[id(template)] = _Learned(template, taught=True, stamp=stamp, source=source)

    def _learned_of(self, template: object) -> _Learned | None:
        learned = self._learned.get(id(template))
        if learned is not None and learned.template is not template:
            return None  # another template, since gone, had that id
        return learned

    def push(self, template: object, values: MutableMapping[Path, Any]) -> bool:
        """Add a run of ``template`` (its ``values`` without the delivery tag) to the
        batch from the stamp learnt; False if there is none: kombu is to publish it."""
        learned = self._learned_of(template)
        if learned is None or learned.stamp is None or learned.source is None:
            return False
        session = self._session
        # As kombu's own publish: none through a batch aborted, failed or closed.
        if self._state.aborted:
            raise RuntimeError("Cannot publish through an aborted batch")
        session._check_usable()
        values[DELIVERY_TAG] = session.channel._next_delivery_tag()
        document = learned.stamp.render(values)
        del values[DELIVERY_TAG]
        if document is None:
            return False
        source = learned.source
        session.pipeline.command_stack.append(((*source.command, document), source.options))
        # As kombu's own publish: the push counts in the batch (kombu sends nothing of a
        # batch it counts empty), which is sent once it holds ``max_size`` commands.
        session._buffered += 1
        if session._buffered >= session.max_size:
            session.flush()
        return True

    def values(
        self,
        body: Any,
        content_type: str,
        content_encoding: str,
        headers: Mapping[str, Any],
        header_names: Iterable[str],
        properties: Mapping[str, Any],
        property_names: Iterable[str],
    ) -> dict[Path, Any]:
        """A run's per-run envelope values, but its delivery tag: its body encoded as
        kombu encodes it (``Producer._prepare``, then the channel's body encoding), and
        the named headers and properties (``expiration`` in milliseconds, as kombu's
        ``Producer.publish`` writes it)."""
        if isinstance(body, str):
            body = body.encode(content_encoding or "utf-8")
        channel = self._producer.channel  # the batch's own: kombu refuses another
        found: dict[Path, Any] = {
            BODY: channel.encode_body(body, channel.body_encoding)[0],
            CONTENT_TYPE: content_type,
            CONTENT_ENCODING: content_encoding,
        }
        for name in header_names:
            found["headers", name] = headers[name]
        for name in property_names:
            value = properties[name]
            found["properties", name] = str(int(value * 1000)) if name == EXPIRATION else value
        return found

    def _pushed(
        self, before: tuple[list[Any] | None, int], values: Mapping[Path, Any]
    ) -> _Push | None:
        """The one LPUSH kombu added to the pipeline since ``before``; None if it added
        more or other commands, or flushed the batch meanwhile."""
        session = _redis_session(self._state)
        if session is None or (self._session is not None and session is not self._session):
            return None
        stack = session.pipeline.command_stack
        before_stack, length = before
        if before_stack is not None and stack is not before_stack:
            return None  # kombu flushed the batch meanwhile
        if len(stack) != length + 1 or not is_command(stack[-1]):
            return None  # not one command for one message
        args, options = stack[-1]
        if len(args) != 3 or args[0] != "LPUSH" or not isinstance(args[2], str):
            return None
        self._session = session
        return _Push(command=tuple(args[:2]), options=options, document=args[2], values=values)


def _redis_session(state: Any) -> Any:
    """The Redis session (``PublishBatch``) of kombu's batch ``state``, if it has one laid
    out as expected: a redis-py pipeline, a count of commands, a virtual channel."""
    session = getattr(state, "session", None)
    channel = getattr(session, "channel", None)
    stack = getattr(getattr(session, "pipeline", None), "command_stack", None)
    if (
        not isinstance(stack, list)
        or type(getattr(session, "_buffered", None)) is not int
        or not isinstance(getattr(session, "max_size", None), int)
        or not callable(getattr(session, "flush", None))
        or not callable(getattr(session, "_check_usable", None))
        or not callable(getattr(channel, "_next_delivery_tag", None))
        or not callable(getattr(channel, "encode_body", None))
    ):
        return None
    return session
