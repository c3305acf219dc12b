"""Credentials in any URL form are masked wherever Celery or this package shows them."""

from __future__ import annotations

import pytest
from celery.app.utils import filter_hidden_settings

import beat  # noqa: F401  (importing the package widens Celery's list of hidden settings)
from beat.store.db import masked_url

SECRET = "s3cret-pw"
URLS = [
    f"redis://:{SECRET}@10.0.0.7:6379/0",
    f"redis://alice:{SECRET}@10.0.0.7:6379/1",
    f"rediss://:{SECRET}@cache.example:6380/0?ssl_cert_reqs=required",
    f"rediss://alice:{SECRET}@cache.example:6380/0?ssl_ca_certs=/etc/ca.pem",
    f"redis://10.0.0.7:6379/0?password={SECRET}",
    f"postgresql+psycopg://app:{SECRET}@db:5432/habeat?sslmode=verify-full",
]
#: Forms the driver reads as carrying a secret that an earlier masking showed (issue 29,
#: finding 8): userinfo runs to the last ``@``; secrets ride in the query too.
HIDDEN_FORMS = [
    f"redis://:pa@{SECRET}@10.0.0.7:6379/0",
    f"redis://alice:pa@{SECRET}@10.0.0.7:6379/0",
    f"postgresql+psycopg://app:pa@{SECRET}@db:5432/habeat",
    f"postgresql+psycopg://app@db:5432/habeat?sslmode=require&sslpassword={SECRET}",
    f"postgresql+psycopg://app@db:5432/habeat?SSLPassword={SECRET}&sslmode=require",
    f"postgresql+psycopg://app@db:5432/habeat?ssl%70assword={SECRET}",
    f"rediss://cache.example:6380/0?ssl_password={SECRET}",
    f"rediss://:{SECRET}@cache.example:6380/0?password={SECRET}",
    f"postgresql+psycopg://app:ab/c?d#{SECRET}@db:5432/habeat",
    f"postgresql+psycopg://app:{SECRET}@db/habeat?application_name=ops@example",
    f"host=db dbname=habeat password={SECRET}",
    f"host=db dbname=habeat password='{SECRET} x'",
    f"{SECRET}@db:5432",
    # libpq allows spaces around '='; a space written unencoded in a URL's query value
    f"host=db dbname=habeat password = {SECRET}",
    f"redis://10.0.0.7:6379/0?password=pw {SECRET}&db=1",
]


@pytest.mark.parametrize("url", URLS + HIDDEN_FORMS)
def test_logs_and_messages_mask_the_password(url: str) -> None:
    shown = masked_url(url)
    assert SECRET not in shown
    assert shown != url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pa@ss@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("redis://alice:pa@ss@[::1]:6379/0", "redis://alice:***@[::1]:6379/0"),
        ("redis://alice@cache:6379/0", "redis://alice@cache:6379/0"),
        ("redis://10.0.0.7:6379/0?password=pw", "redis://10.0.0.7:6379/0?password=***"),
        (
            "postgresql+psycopg://app@db/habeat?sslmode=require&sslpassword=pw&sslkey=/k.pem",
            "postgresql+psycopg://app@db/habeat?sslmode=require&sslpassword=***&sslkey=/k.pem",
        ),
        ("postgresql+psycopg://postgres@127.0.0.1:5432/habeat", None),
        ("unix:///run/redis.sock?db=0", None),
    ],
)
def test_a_masked_url_still_says_where(url: str, shown: str | None) -> None:
    """issue 29, finding 8: the user, host, port, database and harmless parameters stay."""
    assert masked_url(url) == (shown or url)


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("key", ["habeat_redis_url", "habeat_database_url"])
def test_celery_masks_our_url_settings(url: str, key: str) -> None:
    """What ``celery inspect conf``, Flower's worker pages and ``celery report`` show."""
    shown = filter_hidden_settings({key: url, "habeat_lock_ttl": 10})
    assert shown == {key: "********", "habeat_lock_ttl": 10}
