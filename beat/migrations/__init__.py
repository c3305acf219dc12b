"""Alembic migrations of the scheduler's tables (run with `celery -A app schedules migrate`)."""
