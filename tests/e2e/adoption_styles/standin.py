"""What every stand-in takes from the test's environment: this session's database,
broker and a broker key prefix of its own (so what beat publishes stays apart)."""

import os
from typing import Any

DATABASE_URL = os.environ["DATABASE_URL"]
BROKER_URL = os.environ["CELERY_BROKER_URL"]
BROKER_OPTIONS: dict[str, Any] = {"global_keyprefix": os.environ["HABEAT_BROKER_KEY_PREFIX"]}
