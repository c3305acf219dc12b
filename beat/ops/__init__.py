"""What operators use: the Python API (``schedules``, the facade that the
``schedules`` command, ``beat.cli``, and the schedules UI, ``beat.ui``, share), the
cluster's health checks (``health``), what people type (``user_input``) and the
documents and text the scheduler reports (``rendering``)."""
