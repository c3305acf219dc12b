"""The schedules UI: ``celery -A app schedules ui`` serves pages and a JSON API over
:class:`beat.ops.schedules.Schedules`, the facade the CLI uses (see ``beat.ui.server``)."""
