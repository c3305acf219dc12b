"""What a Celery worker does with a run's message. ``beat.worker`` installs it.

- The idempotent task base (``task``): a run guarded by its row and a lease.
- Plain tasks' runs, recorded from Celery's own signals: ``tracking`` connects the
  handlers; a delivery held, taken or dropped at receipt (``receipts``); a plain
  run started only while its delivery holds it, and its outcome (``plain_runs``);
  a retry Celery could not publish (``unsent_retries``); the worker's presence and
  receipt leases (``heartbeat``).
- Time by the database's clock (``database_clock``, ``message_times``): expiry
  and due instants carried in a message's headers and checked against PostgreSQL's
  now, never the worker's wall clock.
- The guard that sets aside messages the worker cannot decode (``poison``).
"""
