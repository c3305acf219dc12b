"""Celery's reports of an app's configuration (``celery inspect conf``, Flower's worker
pages, ``celery report``) mask this package's URL settings: done once by
``beat.config`` when it is imported, so in every process that reads them."""

from __future__ import annotations

import re


def hide_urls_in_celery_reports() -> None:
    """Make Celery mask this package's URL settings wherever it shows the configuration.

    Celery masks settings by name only (``API|TOKEN|KEY|SECRET|PASS|...|DATABASE``) and
    broker or backend URLs: ``habeat_redis_url`` and any URL named otherwise would reach
    ``celery inspect conf``, Flower's worker pages and ``celery report`` with their
    passwords. Its pattern is a module global read on every call, so widening it here
    (once, in every process that imports this package) covers all of them.
    """
    from celery.app import utils

    if _OUR_URLS not in utils.HIDDEN_SETTINGS.pattern:
        utils.HIDDEN_SETTINGS = re.compile(
            f"{utils.HIDDEN_SETTINGS.pattern}|{_OUR_URLS}", utils.HIDDEN_SETTINGS.flags
        )


#: Names of settings Celery must mask (case-insensitive), added to its own pattern.
_OUR_URLS = "HABEAT_[A-Z_]*URL"
