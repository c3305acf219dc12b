"""Celery's documentation, "Entries": ``add_periodic_task`` in ``on_after_configure``,
named with spaces or left unnamed (Celery then names the entry after the signature)."""
