"""Messages stamped from a template are the messages ``send_task`` publishes.

Each run is published twice to the real Redis broker, once with ``send_task`` and once
from its schedule's template, and what lands in Redis is compared: the same lists
(queue and priority), and the same JSON envelope, key order included, except for
what differs from one publish to the next whatever the path (``PER_PUBLISH``).
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Exchange, Queue

from app.factory import create_app
from beat.models import RunToPublish
from beat.publish import dispatch, messages
from beat.records import DatabaseClock
from tests.conftest import SessionEnv
from tests.integration.helpers import broker_messages, count_stamped_pushes, task_ids

pytestmark = [
    pytest.mark.integration,
    # Celery 5 still honours a task's own priority (deprecated for Celery 6).
    pytest.mark.filterwarnings("ignore::celery.exceptions.CDeprecationWarning"),
]

TASK = "tasks.demo.add"
FIRE_AT = datetime(2030, 5, 4, 3, 2, 1, 123456, tzinfo=UTC)

#: Envelope properties set by each publish, whatever builds the message:
#: ``delivery_tag``, a random UUID kombu's virtual channel draws per message, and
#: ``expiration``, the milliseconds left until ``expires`` at the moment of the send
#: (by the database's clock; compared within ``EXPIRATION_SLACK_MS``).
PER_PUBLISH = ("delivery_tag", "expiration")
EXPIRATION_SLACK_MS = 5_000


@pytest.fixture
def app(test_env: SessionEnv, redis_client: redis.Redis) -> Iterator[Celery]:
    app = create_app(test_env.settings())
    app.conf.task_routes = {"tasks.routed": {"queue": "routed"}}
    app.conf.task_queues = [
        Queue("celery"),
        Queue("bound", Exchange("jobs", type="direct"), routing_key="jobs.bound"),
        Queue("short-lived", expires=600),  # kombu adds a PEXPIRE to each push
    ]

    @app.task(name="tasks.local.tuned", priority=7, time_limit=30, soft_time_limit=20, shared=False)
    def tuned() -> None: ...

    @app.task(name="tasks.local.expiring", expires=120, shared=False)
    def expiring() -> None: ...

    app.finalize()
    with app.connection_for_write() as connection:
        # The binding an exchange-only route is delivered through.
        Queue("bound", Exchange("jobs", type="direct"), routing_key="jobs.bound")(
            connection.default_channel
        ).declare()
    yield app
    app.close()


def make_run(task: str = TASK, **fields: Any) -> RunToPublish:
    values: dict[str, Any] = {
        "id": uuid.uuid4(),
        "task": task,
        "args": [1, 2],
        "kwargs": {},
        "options": {},
        "schedule_name": "every-minute",
        "fire_at": FIRE_AT,
        "attempt": 0,
    }
    values.update(fields)
    return RunToPublish(**values)


CASES = [
    pytest.param(make_run(), id="plain"),
    pytest.param(
        make_run(
            args=["héllo ✓", {"a": [1, {"b": None, "c": [True, 1.5]}]}, -3],
            kwargs={"naïve": {"x": ["y", 2, {"z": "🙂"}]}, "empty": {}, "list": []},
        ),
        id="unicode-nested-args",
    ),
    pytest.param(make_run(args=[], kwargs={}), id="no-args"),
    pytest.param(make_run(args=["x" * 3000]), id="repr-cut"),
    pytest.param(make_run(options={"queue": "named"}), id="queue"),
    pytest.param(
        make_run(options={"queue": "bound", "exchange": "jobs", "routing_key": "jobs.bound"}),
        id="queue-exchange-routing-key",
    ),
    pytest.param(
        make_run(options={"exchange": "jobs", "routing_key": "jobs.bound"}),
        id="exchange-routing-key",
    ),
    pytest.param(make_run(options={"priority": 5}), id="priority"),
    pytest.param(make_run(options={"priority": 0}), id="priority-0"),
    pytest.param(make_run(options={"expires": 3600}), id="expires-relative"),
    pytest.param(
        make_run(options={"expires": 30}, fire_at=datetime.now(UTC)), id="expires-relative-now"
    ),
    pytest.param(make_run(options={"expires": "2099-01-01T00:00:00+02:00"}), id="expires-absolute"),
    pytest.param(
        make_run(options={"expires": "2001-01-01T00:00:00+00:00"}), id="expires-absolute-past"
    ),
    pytest.param(
        make_run(options={"headers": {"tenant": "acmé", "n": 3, "ok": True, "none": None}}),
        id="headers",
    ),
    pytest.param(make_run("tasks.routed"), id="task-routes"),
    pytest.param(make_run("tasks.routed", options={"queue": "named"}), id="option-over-route"),
    pytest.param(make_run("tasks.nowhere.unknown"), id="unknown-task"),
    pytest.param(make_run("tasks.local.tuned"), id="task-own-options"),
    pytest.param(make_run("tasks.local.tuned", options={"priority": 2}), id="option-over-task"),
    pytest.param(make_run(attempt=2, retries=3), id="retries"),
    pytest.param(make_run(task_id="caller-chosen-id"), id="caller-task-id"),
    pytest.param(
        make_run(
            options={
                "queue": "named",
                "priority": 9,
                "expires": 600,
                "headers": {"tenant": "acme"},
            },
            kwargs={"k": [1, 2]},
            attempt=1,
        ),
        id="everything",
    ),
]


@pytest.mark.parametrize("run", CASES)
def test_a_message_from_its_template_is_the_message_send_task_publishes(
    app: Celery,
    test_env: SessionEnv,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    run: RunToPublish,
) -> None:
    plain = published(app, test_env, redis_client, monkeypatch, run, templates=False)
    stamped = published(app, test_env, redis_client, monkeypatch, run, templates=True)

    assert templates_built(app) == 1, "the message was built from a template"
    assert_same_messages(plain, stamped)


def test_a_template_is_built_once_per_schedule_definition_and_stamped_per_run(
    app: Celery,
    test_env: SessionEnv,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = make_run(options={"expires": 60, "headers": {"tenant": "acme"}})
    runs = [
        first,
        replace(first, id=uuid.uuid4(), fire_at=FIRE_AT + timedelta(minutes=1), attempt=1),
        replace(first, id=uuid.uuid4(), schedule_name="twin", fire_at=FIRE_AT - timedelta(days=1)),
    ]
    for run in runs:
        plain = published(app, test_env, redis_client, monkeypatch, run, templates=False)
        stamped = published(app, test_env, redis_client, monkeypatch, run, templates=True)
        assert_same_messages(plain, stamped)
    assert templates_built(app) == 1


#: Arguments of schedules of one task and options: each message is stamped from one template.
DISTINCT_ARGUMENTS = [
    ([1, 2], {}),
    (["x" * 3000], {"long": "y" * 5000}),  # both reprs cut at the limit
    (["héllo ✓", {"a": [1, {"b": None, "c": [True, 1.5]}]}, -3], {"naïve": {"z": "🙂"}}),
    ([], {}),
    ([[[[[["deep"]]]]]], {"list": [], "empty": {}, "n": -1.25e-7}),
    (['\u2028 " \\ \t'], {"é" * 400: "🙂" * 400}),
]


def test_schedules_of_one_task_and_options_share_a_template_whatever_their_arguments(
    app: Celery,
    test_env: SessionEnv,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options = {"queue": "named", "expires": 60, "headers": {"tenant": "acme"}}
    for index, (args, kwargs) in enumerate(DISTINCT_ARGUMENTS):
        run = make_run(
            args=args,
            kwargs=kwargs,
            options=options,
            schedule_name=f"schedule-{index}",
            fire_at=FIRE_AT + timedelta(seconds=index),
        )
        plain = published(app, test_env, redis_client, monkeypatch, run, templates=False)
        stamped = published(app, test_env, redis_client, monkeypatch, run, templates=True)
        assert_same_messages(plain, stamped)
        headers = json.loads(stamped["named"][0])["headers"]
        assert len(headers["argsrepr"]) <= dispatch.REPR_LIMIT
        assert len(headers["kwargsrepr"]) <= dispatch.REPR_LIMIT
    assert templates_built(app) == 1

    other = make_run(options={**options, "priority": 3})
    assert_same_messages(
        published(app, test_env, redis_client, monkeypatch, other, templates=False),
        published(app, test_env, redis_client, monkeypatch, other, templates=True),
    )
    assert templates_built(app) == 2, "other options, another template"


def test_a_batch_of_schedules_with_distinct_arguments_is_stamped_from_one_template(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = [
        make_run(args=args, kwargs=kwargs, schedule_name=f"schedule-{index}")
        for index, (args, kwargs) in enumerate(DISTINCT_ARGUMENTS)
    ]
    monkeypatch.setattr(dispatch, "TEMPLATES", False)
    dispatch.publish_runs(app, runs)
    queue = f"{test_env.broker_key_prefix}celery"
    plain: list[bytes] = list(redis_client.lrange(queue, 0, -1))  # type: ignore[arg-type]
    redis_client.delete(queue)
    monkeypatch.setattr(dispatch, "TEMPLATES", True)

    result = dispatch.publish_runs(app, runs)

    assert result.published == [run.id for run in runs]
    stamped: list[bytes] = list(redis_client.lrange(queue, 0, -1))  # type: ignore[arg-type]
    assert len(stamped) == len(plain) == len(runs)
    for expected, got in zip(plain, stamped, strict=True):
        assert_same_envelope(expected, got)
    assert templates_built(app) == 1


def route_by_arguments(
    name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **rest: Any
) -> dict[str, str] | None:
    """A router that looks at the arguments, not only at the task's name."""
    if name == TASK and args and args[0] == "urgent":
        return {"queue": "urgent"}
    return None


@pytest.mark.parametrize(
    "routes",
    [
        pytest.param([route_by_arguments, {"tasks.routed": {"queue": "routed"}}], id="function"),
        pytest.param(
            [f"{__name__}.route_by_arguments", {"tasks.routed": {"queue": "routed"}}],
            id="import-path",
        ),
    ],
)
def test_a_router_that_may_look_at_the_arguments_gets_one_template_per_definition(
    app: Celery,
    test_env: SessionEnv,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    routes: list[Any],
) -> None:
    set_routes(app, routes)
    assert not messages.routes_by_name(app)
    runs = [
        make_run(args=["urgent", 1], schedule_name="a"),
        make_run(args=["normal", 1], schedule_name="b"),
        make_run(args=["urgent", 2], schedule_name="c"),
        make_run("tasks.routed", args=["urgent", 1], schedule_name="d"),
    ]
    lists = []
    for run in runs:
        plain = published(app, test_env, redis_client, monkeypatch, run, templates=False)
        stamped = published(app, test_env, redis_client, monkeypatch, run, templates=True)
        assert_same_messages(plain, stamped)
        lists.append(list(stamped))
    assert lists == [["urgent"], ["celery"], ["urgent"], ["routed"]]
    assert templates_built(app) == 4, "one per schedule definition, arguments included"


def test_task_routes_by_name_and_glob_share_templates_across_arguments(app: Celery) -> None:
    set_routes(app, [{"tasks.routed": {"queue": "routed"}, "tasks.glob.*": "globbed"}])
    assert messages.routes_by_name(app)
    templates = messages.Templates(app)
    keys = {templates.key(make_run(args=[index], kwargs={"k": index})) for index in range(3)}
    assert len(keys) == 1


def test_a_task_whose_own_options_expire_it_is_sent_with_send_task(
    app: Celery,
    test_env: SessionEnv,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The task's ``expires`` counts from each send: no template can hold it."""
    run = make_run("tasks.local.expiring")
    sent: list[str] = []
    monkeypatch.setattr(dispatch, "TEMPLATES", True)
    monkeypatch.setattr(
        dispatch,
        "send_plain",
        lambda *args, **kwargs: sent.append(args[2].task) or send_plain(*args, **kwargs),
    )

    result = dispatch.publish_runs(app, [run])

    assert result.published == [run.id]
    assert sent == ["tasks.local.expiring"]
    assert redis_client.llen(f"{test_env.broker_key_prefix}celery") == 1


def test_a_task_s_own_expiry_counts_from_the_send_by_the_database_s_clock(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis
) -> None:
    """issue 38, finding 11: a task whose own options expire it (``expires=120``) counts
    them from the send by the database's clock, not this host's: with the database's
    clock 2 minutes behind this host's, the ``expires`` header is the database's now +
    120 s, and the time to live 120 s."""
    run = make_run("tasks.local.expiring")
    database_now = datetime.now(UTC) - timedelta(minutes=2)
    reading = DatabaseClock(now=database_now, clock=time.monotonic())

    result = dispatch.publish_runs(app, [run], database=reading)

    assert result.published == [run.id]
    (message,) = broker_messages(redis_client, test_env.broker_key_prefix)
    expires = datetime.fromisoformat(message["headers"]["expires"])
    expected = database_now + timedelta(seconds=120)
    assert abs((expires - expected).total_seconds()) <= EXPIRATION_SLACK_MS / 1000
    assert 120_000 - EXPIRATION_SLACK_MS <= int(message["properties"]["expiration"]) <= 120_000


def test_a_run_whose_options_cannot_be_built_is_rejected_and_the_others_are_stamped(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis
) -> None:
    good = make_run()
    unserialisable = make_run(args=[object()])
    not_a_list = make_run(args="oops")
    batch = [unserialisable, good, not_a_list, replace(good, id=uuid.uuid4())]

    result = dispatch.publish_runs(app, batch)

    assert result.error is None
    assert [(entry.run.id, entry.error.split(":")[0]) for entry in result.rejected] == [
        (unserialisable.id, "EncodeError"),
        (not_a_list.id, "TypeError"),
    ]
    assert result.published == [good.id, batch[3].id]
    assert redis_client.llen(f"{test_env.broker_key_prefix}celery") == 2
    assert templates_built(app) == 1


def variants(run: RunToPublish, count: int) -> list[RunToPublish]:
    """``run`` and more runs of its template: other schedules, fire times, attempts,
    retries and (its template holds for any) arguments."""
    made = [run]
    for index in range(1, count):
        args, kwargs = DISTINCT_ARGUMENTS[index % len(DISTINCT_ARGUMENTS)]
        made.append(
            replace(
                run,
                id=uuid.uuid4(),
                schedule_name=f"{run.schedule_name}-é{index}✓",
                fire_at=run.fire_at + timedelta(minutes=index) if run.fire_at else None,
                attempt=index % 3,
                retries=index % 2,
                args=args if index % 2 else run.args,
                kwargs=kwargs if index % 2 else run.kwargs,
            )
        )
    return made


@pytest.mark.parametrize("run", CASES)
def test_a_batch_of_a_template_s_runs_lands_as_send_task_publishes_it_stamped_from_kombu_s_envelope(
    app: Celery,
    test_env: SessionEnv,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    run: RunToPublish,
) -> None:
    """kombu publishes the first three runs of the template in the batch; the others
    are pushed as envelopes stamped from the third's (``beat.publish.redis_envelopes``)."""
    runs = variants(run, 6)
    plain = published_batch(app, test_env, redis_client, monkeypatch, runs, templates=False)
    stamped_pushes = count_stamped_pushes(monkeypatch)

    stamped = published_batch(app, test_env, redis_client, monkeypatch, runs, templates=True)

    assert stamped_pushes == [len(runs) - 3]
    assert_same_lists(plain, stamped)


def test_runs_of_templates_interleaved_land_in_order_and_as_send_task_publishes_them(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds = [
        make_run(),
        make_run(options={"expires": 600, "priority": 5}),
        make_run(options={"queue": "named"}),
        make_run("tasks.routed"),
    ]
    runs: list[RunToPublish] = []
    for round_ in zip(*(variants(kind, 5) for kind in kinds), strict=True):
        runs += round_
    ad_hoc = make_run(schedule_name=None, fire_at=None)  # sent with send_task
    runs.insert(7, ad_hoc)
    plain = published_batch(app, test_env, redis_client, monkeypatch, runs, templates=False)
    stamped_pushes = count_stamped_pushes(monkeypatch)

    stamped = published_batch(app, test_env, redis_client, monkeypatch, runs, templates=True)

    assert stamped_pushes == [len(kinds) * 2]
    assert_same_lists(plain, stamped)


def test_a_push_kombu_makes_with_more_commands_teaches_no_stamp_and_kombu_publishes_each(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue with an expiry: kombu adds a PEXPIRE per priority to each push."""
    runs = variants(make_run(options={"queue": "short-lived"}), 5)
    plain = published_batch(app, test_env, redis_client, monkeypatch, runs, templates=False)
    stamped_pushes = count_stamped_pushes(monkeypatch)
    queue = f"{test_env.broker_key_prefix}short-lived"

    assert dispatch.publish_runs(app, runs).published == [run.id for run in runs]

    assert stamped_pushes == [0]
    assert 590_000 < redis_client.pttl(queue) <= 600_000, "the queue's expiry is set"
    assert_same_lists(plain, broker_lists(test_env, redis_client))


def test_a_value_that_differs_per_run_and_is_not_stamped_teaches_no_stamp(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stamp is cut from the third run's push and must render the second's too: a
    per-run header left out of what is stamped (here ``retries``) differs between the
    two, and kombu goes on publishing each run (a stamp would repeat the value)."""
    runs = variants(make_run(), 6)
    assert runs[1].retries != runs[2].retries
    plain = published_batch(app, test_env, redis_client, monkeypatch, runs, templates=False)
    unstamped = tuple(name for name in messages._STAMPED_HEADERS if name != "retries")
    monkeypatch.setattr(messages, "_STAMPED_HEADERS", unstamped)
    stamped_pushes = count_stamped_pushes(monkeypatch)

    stamped = published_batch(app, test_env, redis_client, monkeypatch, runs, templates=True)

    assert stamped_pushes == [0]
    assert_same_lists(plain, stamped)


def test_stamped_pushes_count_in_kombu_s_batch_and_go_with_its_flushes(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis
) -> None:
    """kombu flushes a batch when it holds ``max_size`` commands, and only if it counts
    some: a stamped push counts as kombu's own, so none is left in the pipeline."""
    runs = variants(make_run(), 25)
    sent: list[RunToPublish] = []
    with app.producer_or_acquire() as producer, producer.batch(max_size=4):
        dispatch._send_all(sending(app, producer), runs, into=sent)
        in_pipeline = len(producer._batch_local.current.session.pipeline.command_stack)
    assert len(sent) == len(runs)
    assert in_pipeline == len(runs) % 4 == 1, "flushed every 4 pushes, stamped ones included"
    landed = broker_messages(redis_client, test_env.broker_key_prefix)
    assert task_ids(landed) == [run.celery_task_id for run in runs]


def test_a_flush_while_a_stamp_is_learnt_teaches_none_and_loses_nothing(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu flushes a batch of ``max_size`` 2 on the second push: the pipeline is a new
    one by the third run, no stamp is learnt from it, and every message lands."""
    runs = variants(make_run(), 12)
    stamped = count_stamped_pushes(monkeypatch)
    sent: list[RunToPublish] = []
    with app.producer_or_acquire() as producer, producer.batch(max_size=2):
        dispatch._send_all(sending(app, producer), runs, into=sent)
    assert len(sent) == len(runs)
    assert stamped == [0]
    landed = broker_messages(redis_client, test_env.broker_key_prefix)
    assert task_ids(landed) == [run.celery_task_id for run in runs]


def test_a_batch_that_kombu_aborted_takes_no_stamped_push(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As kombu refuses a publish through an aborted batch, so does a stamped push: the
    run is not taken for sent."""
    runs = variants(make_run(), 5)
    stamped = count_stamped_pushes(monkeypatch)
    with app.producer_or_acquire() as producer, producer.batch(max_size=100):
        batch = sending(app, producer)
        for run in runs[:4]:  # three through kombu, the fourth stamped
            dispatch._send(batch, run)
        assert stamped == [1]
        producer._batch_local.current.abort()
        with pytest.raises(RuntimeError, match="aborted"):
            dispatch._send(batch, runs[4])
    assert stamped == [1]
    assert redis_client.llen(f"{test_env.broker_key_prefix}celery") == 0


def sending(app: Celery, producer: Any) -> Any:
    """The messages of one publish into the batch open on ``producer``, from templates
    and stamps, their expiry timed by the database's clock (this host's, in step)."""
    batch = dispatch._Sending(app, producer, [], messages.templates_of(app), database_clock_now())
    batch.envelopes = dispatch._envelopes(producer)
    return batch


def database_clock_now() -> DatabaseClock:
    """A reading of the database's clock, taken as this host's (the test's servers run
    here, in step)."""
    return DatabaseClock(now=datetime.now(UTC), clock=time.monotonic())


def published_batch(
    app: Celery,
    test_env: SessionEnv,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    runs: list[RunToPublish],
    *,
    templates: bool,
) -> dict[str, list[bytes]]:
    """Publish ``runs`` in one batch with ``send_task`` each, or from templates and
    stamped envelopes; the broker's lists then, emptied."""
    monkeypatch.setattr(dispatch, "TEMPLATES", templates)
    monkeypatch.setattr(dispatch, "ENVELOPES", templates)
    monkeypatch.setattr(dispatch, "send_plain", send_plain)
    result = dispatch.publish_runs(app, runs, database=database_clock_now())
    assert result.error is None
    assert result.rejected == []
    assert result.published == [run.id for run in runs]
    return broker_lists(test_env, redis_client)


def assert_same_lists(plain: dict[str, list[bytes]], stamped: dict[str, list[bytes]]) -> None:
    assert list(stamped) == list(plain), "the same queue and priority lists"
    for key, payloads in plain.items():
        assert len(stamped[key]) == len(payloads), key
        for expected, got in zip(payloads, stamped[key], strict=True):
            assert_same_envelope(expected, got)


send_plain = dispatch.send_plain


def set_routes(app: Celery, routes: Any) -> None:
    """``task_routes`` changed after the app may have routed: Celery keeps its router."""
    app.conf.task_routes = routes
    app.amqp.flush_routes()
    del app.amqp.router


def templates_built(app: Celery) -> int:
    return sum(1 for template in messages.templates_of(app).all() if template is not None)


def published(
    app: Celery,
    test_env: SessionEnv,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    run: RunToPublish,
    *,
    templates: bool,
) -> dict[str, list[bytes]]:
    """Publish ``run`` alone through ``publish_runs``, with or without templates; the
    broker's lists then (key without the session prefix: raw payloads), emptied."""
    monkeypatch.setattr(dispatch, "TEMPLATES", templates)
    if templates:

        def refused(*args: object) -> None:
            raise AssertionError("sent with send_task, not from a template")

        monkeypatch.setattr(dispatch, "send_plain", refused)
    else:
        monkeypatch.setattr(dispatch, "send_plain", send_plain)
    result = dispatch.publish_runs(app, [run], database=database_clock_now())
    assert result.error is None
    assert result.rejected == []
    assert result.published == [run.id]
    return broker_lists(test_env, redis_client)


def broker_lists(test_env: SessionEnv, redis_client: redis.Redis) -> dict[str, list[bytes]]:
    """The broker's lists (key without the session prefix: raw payloads), emptied."""
    prefix = test_env.broker_key_prefix
    lists: dict[str, list[bytes]] = {}
    for key in sorted(redis_client.scan_iter(match=f"{prefix}*")):
        if redis_client.type(key) != b"list":
            continue  # kombu's bindings (sets)
        lists[key.decode()[len(prefix) :]] = list(redis_client.lrange(key, 0, -1))  # type: ignore[arg-type]
        redis_client.delete(key)
    return lists


def assert_same_messages(plain: dict[str, list[bytes]], stamped: dict[str, list[bytes]]) -> None:
    assert list(stamped) == list(plain), "the same queue and priority lists"
    for key, payloads in plain.items():
        assert len(payloads) == len(stamped[key]) == 1, key
        assert_same_envelope(payloads[0], stamped[key][0])


def assert_same_envelope(plain: bytes, stamped: bytes) -> None:
    """Field by field, then byte for byte once the per-publish values are set aside."""
    expected, got = json.loads(plain), json.loads(stamped)
    expected_properties, got_properties = expected["properties"], got["properties"]
    uuid.UUID(expected_properties["delivery_tag"])
    uuid.UUID(got_properties["delivery_tag"])
    assert ("expiration" in expected_properties) == ("expiration" in got_properties)
    if "expiration" in expected_properties:
        left = int(expected_properties["expiration"]), int(got_properties["expiration"])
        assert abs(left[0] - left[1]) <= EXPIRATION_SLACK_MS, left
    for name in PER_PUBLISH:
        expected_properties.pop(name, None)
        got_properties.pop(name, None)
    assert set(got) == set(expected)
    for field in expected:
        if field == "body":
            continue
        assert got[field] == expected[field], field
    assert json.loads(_base64(got["body"])) == json.loads(_base64(expected["body"]))
    assert got["body"] == expected["body"]
    assert _without_per_publish(stamped) == _without_per_publish(plain)


def _base64(text: str) -> bytes:
    return base64.b64decode(text)


def _without_per_publish(payload: bytes) -> bytes:
    for name in PER_PUBLISH:
        payload = re.sub(rb'"%s": "[^"]*"' % name.encode(), b'"%s": "-"' % name.encode(), payload)
    return payload
