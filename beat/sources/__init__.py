"""The schedulers a cluster moves in from, read as they are: django-celery-beat's
tables (``django_celery_beat``, plain SQL: the importing process needs no Django),
RedBeat's Redis keys (``redbeat``) and celery beat's shelve file with the app's
``beat_schedule`` (``celery_beat``). Layer 2, beside the store: each reader turns
what its source holds into :class:`~beat.sources.records.SourceSchedule` values (a
definition, its history, where it came from) or a
:class:`~beat.sources.records.Refusal` saying why a row cannot be carried over;
writing them is ``beat.ops.importing``'s, through the store.

- ``records``: what a reader returns, and what it is given (:class:`ReadContext`).
- ``continuing``: the next fire time a source would use after its last run, so the
  first leader neither fires a schedule again nor skips one (pure).
- ``translate``: Celery's own schedule objects and a source's fields as definitions.
- ``django_celery_beat``, ``redbeat``, ``celery_beat``: the readers.
"""
