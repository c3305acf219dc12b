"""Messages to the broker: each claimed run published with its run ID as the
Celery task ID (``dispatch``), built from templates made once per schedule
definition (``messages``), batched on Redis (``redis_envelopes``,
``redis_pushes``); and what the broker still holds (``inventory``), the reaper's
evidence that a message is gone."""
