"""What operators use, beneath the ``schedules`` command (``beat.cli``) and the
schedules UI (``beat.ui``).

- The Python API (``schedules``): the facade ``Schedules``, composed of what
  changes schedules and runs (``schedule_commands``), what reads them
  (``schedule_reads``) and the cluster's reads (``cluster``), on a base that
  declares what they share (``schedules_base``); the documents they return
  (``read_models``).
- The cluster's health checks (``health``), what people type (``user_input``), and
  the documents and text the scheduler reports (``rendering``).
"""
