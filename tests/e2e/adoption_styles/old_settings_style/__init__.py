"""Django settings loaded without a namespace, in Celery's old names (as Sentry does):
``app.config_from_object(settings)``, ``CELERYBEAT_SCHEDULE``, ``CELERY_*``."""
