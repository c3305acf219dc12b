"""Every SQL statement, on PostgreSQL. Time is the database's ``now()``: one clock
for every node.

- The engine and its errors (``db``), the tables (``tables``), their migrations
  (``schema``) and the row mapping every store shares (``rows``), so no store
  imports another store's helpers.
- The schedules (``schedules``), composed of the sync of schedules defined in code
  (``code_sync``) and the runs an operator queues (``operator_runs``); a schedule
  read from its row (``stored_schedules``) and what a change does to its runs
  claimed ahead (``unreleased_runs``).
- What workers write (``runs``): the idempotency guard (``run_guard``), plain
  tasks' runs (``plain_runs``), leases, completion and presence; and the run
  history's reads (``history``).
- Run statistics (``stats``, ``percentiles``).
- What the leader writes, each statement fenced by its epoch (``leader``).
- ``all_roles`` puts every role's store on one engine, for tools and tests.
"""
