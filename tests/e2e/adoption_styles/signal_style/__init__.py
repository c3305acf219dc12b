"""Schedules added with ``add_periodic_task`` in an ``on_after_finalize`` handler of a
task module that ``autodiscover_tasks()`` finds (as Weblate does)."""
