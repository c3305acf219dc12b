"""Every SQL statement, on PostgreSQL: the engine and its errors (``db``), the
tables (``tables``) and their migrations (``schema``); the schedules
(``schedules``), what workers write and the run history (``runs``), run
statistics (``stats``), and what the leader writes, each statement fenced by
its epoch (``leader``). ``all_roles`` puts every role's store on one engine.
Time is the database's ``now()``: one clock for every node."""
