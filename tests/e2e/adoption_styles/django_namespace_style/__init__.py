"""Django settings with ``namespace="CELERY"`` that set only Django's ``TIME_ZONE``
(Celery reads it when ``CELERY_TIMEZONE`` is unset)."""
