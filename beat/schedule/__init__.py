"""What a schedule is and when it fires. Pure: no I/O, no clock but the one given.
Every other layer may import it; it imports only the kernel (``beat.errors``,
``beat.limits``, ``beat.models``).

- ``timing``: triggers (cron, intervals, one-offs) and their next fire times, a
  package of its own (cron expressions, wall clocks, zones, daylight saving time).
- ``define``: a definition checked, and its first fire time; ``document``: a
  definition as the fields it sets.
- ``options`` and ``payload``: the publish options and the args and kwargs a
  schedule may carry.
- ``code``: schedules defined in code (``beat_schedule``, ``@periodic``).
"""
