"""What a Celery worker does with a run's message: the idempotent task base
(``task``), plain tasks' runs recorded from Celery's own signals
(``tracking``), and the guard that sets aside messages the worker cannot decode
(``poison``). ``beat.worker`` installs them."""
