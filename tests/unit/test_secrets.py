"""Credentials in any URL form are masked wherever Celery or this package shows them."""

from __future__ import annotations

import pytest
from celery.app.utils import filter_hidden_settings

import beat  # noqa: F401  (importing the package widens Celery's list of hidden settings)
from beat.db import masked_url

SECRET = "s3cret-pw"
URLS = [
    f"redis://:{SECRET}@10.0.0.7:6379/0",
    f"redis://alice:{SECRET}@10.0.0.7:6379/1",
    f"rediss://:{SECRET}@cache.example:6380/0?ssl_cert_reqs=required",
    f"rediss://alice:{SECRET}@cache.example:6380/0?ssl_ca_certs=/etc/ca.pem",
    f"redis://10.0.0.7:6379/0?password={SECRET}",
    f"postgresql+psycopg://app:{SECRET}@db:5432/habeat?sslmode=verify-full",
]


@pytest.mark.parametrize("url", URLS)
def test_logs_and_messages_mask_the_password(url: str) -> None:
    shown = masked_url(url)
    assert SECRET not in shown
    assert shown != url


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("key", ["habeat_redis_url", "habeat_database_url"])
def test_celery_masks_our_url_settings(url: str, key: str) -> None:
    """What ``celery inspect conf``, Flower's worker pages and ``celery report`` show."""
    shown = filter_hidden_settings({key: url, "habeat_lock_ttl": 10})
    assert shown == {key: "********", "habeat_lock_ttl": 10}
