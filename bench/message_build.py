"""Building messages: ``send_task`` for each run against templates stamped per run.

``python -m bench.message_build [--messages N] [--schedules S]``: N runs of S schedule
definitions (each with its own arguments) are added to a kombu producer batch on Redis
that is never flushed (it is discarded: nothing reaches the broker), once with
``send_task`` per message, then from templates: N runs that are all distinct
definitions (distinct arguments, one task and options: one template), the same with a
router function (it may read the arguments: a template per definition, built in the
pass), the N runs of S definitions (first pass, then with all templates already built,
then the same with kombu publishing each message rather than stamping its envelope
from the first ones kombu built in the batch: ``beat.publish.redis_envelopes``).
Prints µs per message; nothing is asserted.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from app.factory import create_app
from app.settings import Settings
from beat.models import RunToPublish, UnpublishableRun
from beat.publish import dispatch, messages
from bench.common import REDIS_URL, table


class _Discard(Exception):
    """Leaves the producer batch without flushing it."""


def make_runs(count: int, schedules: int) -> list[RunToPublish]:
    start = datetime.now(UTC)
    return [
        RunToPublish(
            id=uuid.uuid4(),
            task="tasks.demo.add",
            args=[index % schedules, 1],
            kwargs={"label": f"s{index % schedules:05d}"},
            options={"expires": 300, "headers": {"tenant": "acme"}},
            schedule_name=f"s{index % schedules:05d}",
            fire_at=start + timedelta(seconds=index // schedules),
            attempt=0,
        )
        for index in range(count)
    ]


def route_nowhere(*args: Any, **kwargs: Any) -> None:
    """A router function: Celery's routing then stays with each definition's arguments."""
    return None


def set_routes(app: Any, routes: Any) -> None:
    """``task_routes`` changed after the app has routed: Celery keeps its router."""
    app.conf.task_routes = routes
    app.amqp.flush_routes()
    del app.amqp.router


def time_building(
    app: object, runs: Sequence[RunToPublish], *, templates: bool, envelopes: bool = True
) -> float:
    """Seconds to add the messages of ``runs`` to a batch that is then discarded."""
    dispatch.TEMPLATES = templates
    dispatch.ENVELOPES = envelopes
    rejected: list[UnpublishableRun] = []
    sent: list[RunToPublish] = []
    with app.producer_or_acquire() as producer:  # type: ignore[attr-defined]
        try:
            with producer.batch(max_size=dispatch.NEVER_FLUSH):
                started = time.perf_counter()
                kept = dispatch._templates(app)
                sending = dispatch._Sending(app, producer, rejected, kept, None)
                sending.envelopes = dispatch._envelopes(producer)
                dispatch._send_all(sending, runs, into=sent)
                elapsed = time.perf_counter() - started
                raise _Discard
        except _Discard:
            pass
    if len(sent) != len(runs):
        raise RuntimeError(f"messages not built: {rejected[:3]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.message_build")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--schedules", type=int, default=1_000)
    options = parser.parse_args(argv)
    prefix = f"habeat-bench-{uuid.uuid4().hex[:8]}:broker:"
    settings = Settings.from_env()
    app = create_app(settings)
    app.conf.broker_url = REDIS_URL
    app.conf.broker_transport_options = {
        **app.conf.broker_transport_options,
        "global_keyprefix": prefix,
    }
    runs = make_runs(options.messages, options.schedules)
    distinct = make_runs(options.messages, options.messages)
    time_building(app, runs[:100], templates=False)  # connection, imports
    templates = messages.templates_of(app)
    templates.clear()
    rows: list[list[str]] = []
    plain = time_building(app, runs, templates=False)
    all_distinct = time_building(app, distinct, templates=True)
    templates.clear()
    set_routes(app, [route_nowhere])
    per_definition = time_building(app, distinct, templates=True)
    set_routes(app, None)
    templates.clear()
    cold = time_building(app, runs, templates=True)
    warm = time_building(app, runs, templates=True)
    through_kombu = time_building(app, runs, templates=True, envelopes=False)
    for label, seconds in (
        ("send_task per message", plain),
        ("templates, every run a distinct definition (args)", all_distinct),
        ("  the same, a router function: one per definition", per_definition),
        (f"templates, {options.schedules} definitions, first pass", cold),
        ("templates, all built before", warm),
        ("  the same, kombu publishing each (no stamped envelopes)", through_kombu),
    ):
        per_message = seconds / len(runs) * 1e6
        rows.append([label, f"{per_message:.1f}", f"{len(runs) / seconds:,.0f}"])
    print(f"{len(runs):,} messages of {options.schedules:,} schedule definitions, not flushed\n")
    print(table(["path", "µs/message", "messages/s"], rows))
    dispatch.TEMPLATES = True
    dispatch.ENVELOPES = True
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
