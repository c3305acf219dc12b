"""The Celery app: ``celery -A app worker|beat|flower|schedules``.

Configured from the environment (see ``app.settings``); beat uses the
highly-available scheduler (``beat.scheduler:HAScheduler``).
"""

from app.factory import create_app

celery_app = create_app()

__all__ = ["celery_app"]
