"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from app.factory import create_app
from beat.scheduler import HAScheduler
from beat.store.all_roles import Store
from tests.conftest import SessionEnv

SchedulerFactory = Callable[..., HAScheduler]


@pytest.fixture
def make_scheduler(
    test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> Iterator[SchedulerFactory]:
    """In-process schedulers on this session's database and lease (a short TTL, wait
    and claim-ahead window), closed at the end:
    ``make_scheduler(conf=..., prepare=..., **settings)``."""
    created: list[HAScheduler] = []

    def factory(
        conf: dict[str, Any] | None = None,
        prepare: Callable[[Any], None] | None = None,
        **settings: Any,
    ) -> HAScheduler:
        # A 1-second claim-ahead window: a tick waits for the fire times it armed.
        defaults = {"lock_ttl": 2.0, "max_wait": 0.2, "claim_ahead": 1.0}
        app = create_app(test_env.settings(**{**defaults, **settings}))
        app.conf.update(conf or {})
        if prepare is not None:
            prepare(app)  # e.g. define tasks, as task modules do before beat starts
        scheduler = HAScheduler(app=app)
        created.append(scheduler)
        return scheduler

    yield factory
    for scheduler in created:
        scheduler.close()
        if scheduler._store is not None:
            scheduler._store.dispose()
