from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.e2e.cluster import Cluster


@pytest.fixture
def cluster(
    test_env: SessionEnv, store: Store, tmp_path: Path, redis_client: object
) -> Iterator[Cluster]:
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS e2e_effects"
                " (task_id text NOT NULL, label text, at timestamptz DEFAULT now())"
            )
        )
        conn.execute(text("TRUNCATE e2e_effects"))
    cluster = Cluster(env=test_env, store=store, workdir=tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop_all()
        print(cluster.logs()[-20000:])
