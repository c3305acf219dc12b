"""What this package adds to a Celery worker, installed by importing this module.

- ``beat.delivery.tracking``: the receipt of runs beat published, plain tasks' runs
  taken, started and finished, expired deliveries recorded, and the worker's
  heartbeat (its presence and its receipt leases);
- ``beat.delivery.poison``: the guard that sets aside messages the worker cannot
  decode or unpack, instead of dying on them;
- ``beat.delivery.task``: the idempotent task base's worker metrics endpoint.

Every ``celery`` command imports it, through the ``schedules`` command this
package registers (Celery loads the ``celery.commands`` entry points before it
parses the command line), so a worker of an existing project gets it with no
setting of its own. Its handlers act only for an app set up for this scheduler
(``beat.config.uses_this_scheduler``): other apps' workers in the same
environment are left alone. A worker started without the ``celery`` command
(``app.Worker(...)``) gets it from ``app.conf.imports = ["beat.worker"]``.
"""

from __future__ import annotations

from beat.delivery import poison as poison_messages
from beat.delivery import task
from beat.delivery import tracking as run_tracking

__all__ = ["poison_messages", "run_tracking", "task"]
