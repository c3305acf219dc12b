"""Builds the Celery app from the environment."""

from __future__ import annotations

from celery import Celery

from app.settings import Settings


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or Settings.from_env()
    app = Celery("app")
    app.conf.update(settings.celery_config())
    return app
