"""Stand-ins for the ways existing projects configure Celery beat, each a package
``celery -A`` loads from this directory (it is put on ``PYTHONPATH``)."""
