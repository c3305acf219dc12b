"""The PostgreSQL tables, defined once (SQLAlchemy Core); those of the run
statistics' summary in ``beat.store.summary_tables``, named here too.

The Alembic migrations in ``beat/migrations`` create exactly these; a test
compares the two so they cannot drift apart.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Double,
    ForeignKey,
    Identity,
    Index,
    Integer,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from beat.models import (
    ChangeAction,
    ChangeEntry,
    ChannelKind,
    IncidentKind,
    MisfirePolicy,
    NotificationEvent,
    Origin,
    OverlapPolicy,
    Role,
    RunState,
    TriggerKind,
)
from beat.store.metadata import ACTIVE_SQL as ACTIVE_SQL
from beat.store.metadata import FAILED_SQL as FAILED_SQL
from beat.store.metadata import FINISHED_SQL as FINISHED_SQL
from beat.store.metadata import SCHEDULES_CHANNEL as SCHEDULES_CHANNEL
from beat.store.metadata import TZ as TZ
from beat.store.metadata import VERSION_TABLE as VERSION_TABLE
from beat.store.metadata import in_values
from beat.store.metadata import metadata as metadata
from beat.store.summary_tables import run_blocks as run_blocks
from beat.store.summary_tables import run_minutes as run_minutes
from beat.store.summary_tables import run_summary as run_summary
from beat.store.summary_tables import schedule_outcomes as schedule_outcomes

schedules = Table(
    "beat_schedules",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    Column("task", Text, nullable=False),
    Column("trigger_kind", Text, nullable=False),
    Column("cron", Text),
    #: When both day fields of ``cron`` are restricted, a day must match both (how
    #: Celery's crontab reads them) rather than either (cron's own rule).
    Column("cron_both_days", Boolean, nullable=False, server_default=text("false")),
    Column("every_seconds", Double),
    Column("anchor_at", TZ),
    Column("run_at", TZ),
    Column("timezone", Text, nullable=False, server_default="UTC"),
    Column("args", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("kwargs", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("options", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("origin", Text, nullable=False, server_default=Origin.API.value),
    Column("code_hash", Text),
    Column("misfire_policy", Text, nullable=False, server_default=MisfirePolicy.FIRE_ONCE.value),
    Column("max_attempts", Integer, nullable=False, server_default=text("3")),
    Column("next_fire_at", TZ),
    Column("last_fire_at", TZ),
    Column("overlap_policy", Text, nullable=False, server_default=OverlapPolicy.ALLOW.value),
    Column("jitter_seconds", Double, nullable=False, server_default="0"),
    #: The window: no fire time before start_at or after end_at, at most max_runs runs.
    Column("start_at", TZ),
    Column("end_at", TZ),
    Column("max_runs", Integer),
    Column("runs_count", Integer, nullable=False, server_default="0"),
    #: Why the scheduler disabled the schedule (its window ended, or it was
    #: quarantined), for people to read.
    Column("disabled_reason", Text),
    #: Set when the scheduler disabled the schedule because it could not be planned or
    #: published (see ``disabled_reason``); health is red while any schedule is.
    Column("quarantined_at", TZ),
    #: Where `schedules import` read it (django-celery-beat, redbeat, celery-beat) and
    #: its identity there (a row id, a Redis key, an entry name); NULL if made here.
    Column("source", Text),
    Column("source_id", Text),
    #: What the schedule is for, in people's words (django-celery-beat's description).
    Column("description", Text),
    #: Its failing monitor (``beat.monitors``): NULL, the cluster's default; 0, never.
    Column("alert_after_failures", Integer),
    Column("pause_after_failures", Integer),
    #: What its failing monitor counts as failures; NULL: failed, lost and expired.
    Column("failure_states", ARRAY(Text)),
    #: Its run monitors (``beat.monitors.timing``), in seconds; NULL: none. A run still
    #: running ``max_runtime_seconds`` after it started overran (and is revoked if
    #: ``revoke_after_max_runtime``); one started ``late_after_seconds`` after its fire
    #: time is late; a fire time not sent ``missed_after_seconds`` after it was missed.
    Column("max_runtime_seconds", Double),
    Column("revoke_after_max_runtime", Boolean, nullable=False, server_default=text("false")),
    Column("late_after_seconds", Double),
    Column("missed_after_seconds", Double),
    #: The notification channels its incidents go to; NULL: every channel.
    Column("channels", ARRAY(Text)),
    Column("created_at", TZ, nullable=False, server_default=text("now()")),
    Column("updated_at", TZ, nullable=False, server_default=text("now()")),
    #: Raised by each recorded change (``schedule_changes``; set by its triggers).
    Column("version", Integer, nullable=False, server_default=text("1")),
    CheckConstraint(in_values("trigger_kind", TriggerKind), name="ck_beat_schedules_trigger_kind"),
    CheckConstraint(in_values("origin", Origin), name="ck_beat_schedules_origin"),
    CheckConstraint(
        in_values("misfire_policy", MisfirePolicy), name="ck_beat_schedules_misfire_policy"
    ),
    CheckConstraint(
        "(trigger_kind = 'cron' AND cron IS NOT NULL)"
        " OR (trigger_kind = 'every' AND every_seconds > 0 AND anchor_at IS NOT NULL)"
        " OR (trigger_kind = 'once' AND run_at IS NOT NULL)",
        name="ck_beat_schedules_trigger_fields",
    ),
    CheckConstraint("max_attempts >= 1", name="ck_beat_schedules_max_attempts"),
    CheckConstraint(
        in_values("overlap_policy", OverlapPolicy), name="ck_beat_schedules_overlap_policy"
    ),
    CheckConstraint("jitter_seconds >= 0", name="ck_beat_schedules_jitter"),
    CheckConstraint("max_runs IS NULL OR max_runs >= 1", name="ck_beat_schedules_max_runs"),
    CheckConstraint(
        "alert_after_failures >= 0 AND pause_after_failures >= 0",
        name="ck_beat_schedules_failure_thresholds",
    ),
    CheckConstraint(
        "max_runtime_seconds > 0 AND late_after_seconds > 0 AND missed_after_seconds > 0",
        name="ck_beat_schedules_run_monitors",
    ),
)
# The schedules whose fire times the run monitors look at (few: it is set per schedule).
Index(
    "ix_beat_schedules_timed",
    schedules.c.id,
    postgresql_where=text("late_after_seconds IS NOT NULL OR missed_after_seconds IS NOT NULL"),
)

# Cost per tick is proportional to the runs due, not to the schedules stored.
Index(
    "ix_beat_schedules_due",
    schedules.c.next_fire_at,
    postgresql_where=text("enabled AND next_fire_at IS NOT NULL"),
)

runs = Table(
    "beat_runs",
    metadata,
    # The run ID is the Celery task ID.
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("schedule_id", BigInteger, ForeignKey("beat_schedules.id", ondelete="SET NULL")),
    Column("schedule_name", Text),
    Column("task", Text, nullable=False),
    Column("args", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("kwargs", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("options", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("fire_at", TZ),
    Column("state", Text, nullable=False),
    Column("reason", Text),
    Column("epoch", BigInteger),
    #: Times a worker has started the run (deliveries that passed the idempotency guard).
    Column("attempt", Integer, nullable=False, server_default=text("0")),
    #: Celery retries so far: a delivery from before the latest retry is a stale duplicate.
    Column("retries", Integer, nullable=False, server_default=text("0")),
    #: Deliveries refused by the idempotency guard.
    Column("duplicate_deliveries", Integer, nullable=False, server_default=text("0")),
    Column("duration_seconds", Double),
    #: A jittered run is published no earlier than this.
    Column("not_before", TZ),
    Column("max_attempts", Integer, nullable=False, server_default=text("3")),
    Column("claimed_at", TZ, nullable=False, server_default=text("now()")),
    Column("published_at", TZ),
    Column("started_at", TZ),
    #: The first publish and the first start of the run, whatever came after (a reaper's
    #: send again, a retry): what the run monitors judge a fire time by.
    Column("first_published_at", TZ),
    Column("first_started_at", TZ),
    #: Made by an operator (``trigger``, ``backfill``), not by the schedule's timing.
    Column("by_operator", Boolean, nullable=False, server_default=text("false")),
    Column("finished_at", TZ),
    #: The return value a succeeded run's callbacks and chain are sent with, while they
    #: may be unsent (``beat.delivery.links``); NULL once sent, or if it has none.
    Column("unsent_links", JSONB),
    Column("lease_owner", Text),
    Column("lease_expires_at", TZ),
    #: Written by the release before ``beat_beacons`` (left empty now).
    Column("session_pid", Integer),
    #: The beacon of the worker process running it (``beat_beacons.name``): once both
    #: its halves are proven gone, the run is reclaimed without waiting for its lease.
    #: NULL: not known, the lease decides.
    Column("beacon", Text),
    Column("worker", Text),
    Column("error", Text),
    #: The Celery task ID when the caller chose one that is not a UUID (``id`` is then
    #: derived from it); None: the task ID is ``str(id)``.
    Column("task_id", Text),
    #: When a worker took the run's message (plain tasks are recorded at receipt).
    Column("received_at", TZ),
    #: The task does not use the idempotent base: once a worker took the run, it is
    #: never published again.
    Column("plain", Boolean, nullable=False, server_default=text("false")),
    #: Attempts ended by their worker's death (killed, restarted): not the run's fault,
    #: they do not use up ``max_attempts`` (at most ``MAX_INTERRUPTIONS`` are excused).
    Column("interruptions", Integer, nullable=False, server_default=text("0")),
    #: When the retry a worker asked for is due (``retrying``): past it, the leader
    #: looks for its message.
    Column("retry_due_at", TZ),
    #: Times lost-message recovery sent the run again because no worker recorded it
    #: and its message was not found (``beat.leader.lost_messages``): bounded.
    Column("recovery_sends", Integer, nullable=False, server_default=text("0")),
    #: A step of a workflow run (``beat.schedule.workflow``): that run, the step's path in
    #: its canvas (NULL: not a step). The run follows its steps (migration 0021's trigger).
    Column("workflow_run_id", UUID(as_uuid=True)),
    Column("step", Text),
    UniqueConstraint("schedule_id", "fire_at", name="uq_beat_runs_schedule_fire_at"),
    CheckConstraint(in_values("state", RunState), name="ck_beat_runs_state"),
)

# The outbox: runs claimed but not yet published.
Index(
    "ix_beat_runs_pending",
    runs.c.claimed_at,
    postgresql_where=text("state = 'pending'"),
)
# Run history by schedule, newest first. It carries each run's state and the time it
# was sent, so that what reads only those (a schedule's newest run for the "failing"
# filter, the statistics of one schedule) reads the index alone, not a table page a
# run. A transition rewrites the run's entries anyway: the state is in the predicates
# of the partial indexes, so no update of it is a heap-only one.
Index(
    "ix_beat_runs_schedule_name_fire_at",
    runs.c.schedule_name,
    runs.c.fire_at.desc(),
    postgresql_include=["state", "published_at"],
)
# The overlap policies look up a schedule's active runs in every claim.
Index(
    "ix_beat_runs_active_by_schedule",
    runs.c.schedule_id,
    postgresql_where=text(ACTIVE_SQL),
)
# Which schedules have failed runs: the "failing" filter of the schedule list probes
# their newest run only, not every schedule's. Partial, so a claim's insert (a pending
# run) adds no entry to it.
Index("ix_beat_runs_failed_by_schedule", runs.c.schedule_name, postgresql_where=text(FAILED_SQL))
# A workflow run's steps (its page, its trigger); runs whose links are left undone (the
# leader's re-send looks at them every pass: few rows, never a scan of the table).
_STEPS, _UNSENT = text("workflow_run_id IS NOT NULL"), text("unsent_links IS NOT NULL")
Index("ix_beat_runs_workflow_steps", runs.c.workflow_run_id, runs.c.step, postgresql_where=_STEPS)
Index("ix_beat_runs_links_unsent", runs.c.finished_at, postgresql_where=_UNSENT)
# Runs stuck in the broker.
Index(
    "ix_beat_runs_queued_published_at",
    runs.c.published_at,
    postgresql_where=text("state = 'queued'"),
)
# Retries that are overdue (their message may be lost).
Index(
    "ix_beat_runs_retrying_due",
    runs.c.retry_due_at,
    postgresql_where=text("state = 'retrying'"),
)
# Leases to reclaim.
Index(
    "ix_beat_runs_running_lease",
    runs.c.lease_expires_at,
    postgresql_where=text("state = 'running'"),
)
# Finished runs by age, oldest first: retention deletes batches without a table scan.
Index(
    "ix_beat_runs_finished_age",
    func.coalesce(runs.c.finished_at, runs.c.claimed_at),
    postgresql_where=text(FINISHED_SQL),
)


leader = Table(
    "beat_leader",
    metadata,
    # One row per lease key prefix, so several independent clusters can share a database.
    Column("name", Text, primary_key=True),
    Column("epoch", BigInteger, nullable=False),
    Column("holder", Text, nullable=False),
    Column("acquired_at", TZ, nullable=False, server_default=text("now()")),
    #: Written by the release before ``beat_beacons`` (left empty now).
    Column("session_pid", Integer),
    Column("session_started_at", TZ),
    #: The beacon the leader keeps for its term (``beat_beacons.name``): once both its
    #: halves are proven gone, the leader's process is dead and a standby takes over
    #: without waiting for the lease. NULL: not known, wait for the lease.
    Column("beacon", Text),
    #: Until when the leader of ``held_epoch`` holds this row, by PostgreSQL's clock:
    #: renewed with its lease; once it has passed, a process that cannot reach the
    #: lease's Redis may take the row with the next epoch (``beat.lease.database_hold``).
    #: NULL, or a ``held_epoch`` that is not ``epoch`` (a leader of an earlier release
    #: took over): never.
    Column("held_until", TZ),
    Column("held_epoch", BigInteger),
    #: The holder leads on the row alone: no process records a newer epoch through the
    #: Redis lease until the hold ends (the holder hands the lease back itself).
    Column("held_on_database", Boolean),
)

workers = Table(
    "beat_workers",
    metadata,
    # A worker's Celery node name (``worker1@host``): ``beat_runs.worker``.
    Column("name", Text, primary_key=True),
    Column("pid", Integer, nullable=False),
    #: When the worker process that renews this row started, by the database's clock
    #: (PostgreSQL's time less the process's monotonic uptime: a host clock decides nothing).
    Column("booted_at", TZ, nullable=False),
    #: Renewed by the worker's main process every third of the lease timeout.
    Column("seen_at", TZ, nullable=False),
    #: Written by the release before ``beat_beacons`` (left empty now).
    Column("session_pid", Integer),
    #: The beacon of the worker's main process (``beat_beacons.name``).
    Column("beacon", Text),
)

#: The halves of each process's crash-detection beacon (``beat.lease.beacon``), written by
#: the beacon's own database session whenever it opens a half again: whatever names
#: the beacon follows its newest session.
beacons = Table(
    "beat_beacons",
    metadata,
    #: The beacon's name, also its Redis connection's (``CLIENT SETNAME``).
    Column("name", Text, primary_key=True),
    #: Its database session: ``pg_stat_activity.pid`` and ``backend_start``.
    Column("session_pid", Integer, nullable=False),
    Column("session_started_at", TZ, nullable=False),
    #: The identity of the PostgreSQL server the session was opened on
    #: (``beat.store.db.SERVER_INCARNATION``).
    Column("postgres_server", Text, nullable=False),
    #: The ``run_id`` of the Redis server its connection was opened on.
    Column("redis_server", Text, nullable=False),
    Column("recorded_at", TZ, nullable=False, server_default=text("now()")),
)

#: Consumers of beat's queues that do not record runs (a worker without this package),
#: as the leader found them from Celery's remote control (``beat.leader.lost_messages``): while
#: a row of a queue is kept (twice the visibility timeout after it was last seen),
#: lost-message recovery sends no run of that queue again. Queue ``*`` with an empty
#: consumer: no worker answered the control although some record runs (no run is sent
#: again until they answer).
#: The queue of a finding about every queue (``beat_unrecorded_consumers``).
ALL_QUEUES = "*"

unrecorded_consumers = Table(
    "beat_unrecorded_consumers",
    metadata,
    Column("queue", Text, primary_key=True),
    #: The consumer's Celery node name (``celery@host``).
    Column("consumer", Text, primary_key=True),
    Column("first_seen_at", TZ, nullable=False, server_default=text("now()")),
    #: The last check that found it (database time).
    Column("seen_at", TZ, nullable=False, server_default=text("now()")),
    #: The first check that no longer found it; NULL while it is found.
    Column("gone_at", TZ),
)

#: What went wrong with a schedule (``beat.monitors``): opened and resolved by the leader
#: in fenced transactions, at most one open per schedule and kind.
incidents = Table(
    "beat_incidents",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    #: NULL once the schedule is removed (the leader then resolves it), and for an
    #: incident of the whole cluster (a stall); its name stays.
    Column("schedule_id", BigInteger, ForeignKey("beat_schedules.id", ondelete="SET NULL")),
    Column("schedule_name", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("opened_at", TZ, nullable=False, server_default=text("now()")),
    #: The leader's epoch that opened it.
    Column("epoch", BigInteger, nullable=False),
    #: Failures in a row: when it opened, then the newest count the leader saw.
    Column("failures", Integer, nullable=False),
    #: The fire time of the first failure of the streak, and the newest failure's error.
    Column("first_failure_at", TZ),
    Column("last_error", Text),
    #: When the scheduler paused the schedule because of it, and the fire time of the
    #: failure that did: after a resume, as many failures again pause it again.
    Column("paused_at", TZ),
    Column("paused_after_fire_at", TZ),
    Column("resolved_at", TZ),
    #: Why it closed, for people: the run that succeeded, the schedule removed...
    Column("resolution", Text),
    CheckConstraint(in_values("kind", IncidentKind), name="ck_beat_incidents_kind"),
)
# One open incident per schedule and kind: opening is an insert that does nothing when
# one is open.
Index(
    "uq_beat_incidents_open",
    incidents.c.schedule_id,
    incidents.c.kind,
    unique=True,
    postgresql_where=text("resolved_at IS NULL"),
)
# One open incident of the whole cluster (a stall), whichever process opens it.
Index(
    "uq_beat_incidents_cluster_open",
    incidents.c.kind,
    unique=True,
    postgresql_where=text("kind = 'stall' AND resolved_at IS NULL"),
)
# Incidents newest first (the list, the UI).
Index("ix_beat_incidents_opened_at", incidents.c.opened_at.desc())

#: How far the failing monitor has looked (one row): every run that finished before
#: ``checked_until`` has been counted (less ``beat.store.leader.monitors.MARGIN``, looked
#: at again for transactions that committed late).
monitor_progress = Table(
    "beat_monitor_progress",
    metadata,
    Column("id", Boolean, primary_key=True, server_default=text("true")),
    Column("checked_until", TZ, nullable=False),
    CheckConstraint("id", name="ck_beat_monitor_progress_one_row"),
)

#: Where the scheduler sends what happens to incidents (``beat.notify``): every channel
#: gets every incident's notifications.
#: The audit log: one row per change to a schedule's fields, written by the triggers of
#: ``beat_schedules`` in the transaction of the change (migration 0019 holds them, and
#: ``beat.store.schedule_changes`` tells them who makes it). ``before`` and ``after``
#: are the schedule's recorded columns as JSON (none before a create, after a delete);
#: an end, a trigger or a backfill is recorded with neither. Kept as long as finished
#: runs.
schedule_changes = Table(
    "beat_schedule_changes",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("schedule_name", Text, nullable=False),
    #: The schedule's version after the change (a delete's: the version deleted).
    Column("version", Integer, nullable=False),
    Column("changed_at", TZ, nullable=False, server_default=text("now()")),
    Column("action", Text, nullable=False),
    #: Who: a user, ``token:<name>``, ``system:<reason>`` or ``sql:<database user>``.
    Column("actor", Text, nullable=False),
    Column("entry", Text, nullable=False),
    #: The machine the change was made on, and the client's address over HTTP.
    Column("host", Text),
    Column("address", Text),
    Column("note", Text),
    Column("before", JSONB),
    Column("after", JSONB),
    CheckConstraint(in_values("action", ChangeAction), name="ck_beat_schedule_changes_action"),
    CheckConstraint(in_values("entry", ChangeEntry), name="ck_beat_schedule_changes_entry"),
)
Index("ix_beat_schedule_changes_schedule", schedule_changes.c.schedule_name, schedule_changes.c.id)
Index("ix_beat_schedule_changes_changed_at", schedule_changes.c.changed_at)

#: The API tokens of the write API: the SHA-256 of each (the token is shown once), its
#: role (``beat.models.Role``), who made it; revoked, never deleted.
api_tokens = Table(
    "beat_api_tokens",
    metadata,
    Column("name", Text, primary_key=True),
    Column("role", Text, nullable=False),
    Column("token_hash", Text, nullable=False, unique=True),
    Column("created_at", TZ, nullable=False, server_default=text("now()")),
    Column("created_by", Text, nullable=False),
    Column("revoked_at", TZ),
    Column("last_used_at", TZ),
    CheckConstraint(in_values("role", Role), name="ck_beat_api_tokens_role"),
)

#: The ``Idempotency-Key`` of each create through the API, with the hash of its request
#: and the schedule it made; pruned with the finished runs.
idempotency_keys = Table(
    "beat_idempotency_keys",
    metadata,
    Column("key", Text, primary_key=True),
    Column("request_hash", Text, nullable=False),
    Column("schedule_name", Text, nullable=False),
    Column("created_at", TZ, nullable=False, server_default=text("now()")),
)
Index("ix_beat_idempotency_keys_created_at", idempotency_keys.c.created_at)

channels = Table(
    "beat_channels",
    metadata,
    Column("name", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    #: The URL posted to (webhook, slack), or the SMTP server's (email: smtp:// or
    #: smtps://, with ``from`` and ``to`` in its query).
    Column("target", Text, nullable=False),
    Column("created_at", TZ, nullable=False, server_default=text("now()")),
    CheckConstraint(in_values("kind", ChannelKind), name="ck_beat_channels_kind"),
)

#: The notification outbox: written in the transaction that opens, pauses or resolves an
#: incident, one row per channel, and sent by the leader until a channel takes it (at
#: least once: a leader that dies between the send and its record sends it again; the
#: receiver tells by the row's ID, sent as the idempotency key).
notifications = Table(
    "beat_notifications",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("channel", Text, ForeignKey("beat_channels.name", ondelete="CASCADE"), nullable=False),
    Column("incident_id", BigInteger, ForeignKey("beat_incidents.id", ondelete="CASCADE")),
    Column("event", Text, nullable=False),
    #: What is sent, as the receiver's document (``beat.notify.messages``).
    Column("payload", JSONB, nullable=False),
    Column("created_at", TZ, nullable=False, server_default=text("now()")),
    #: Not sent before this: a send in flight holds it until then (a lease), a failed
    #: one waits its back-off.
    Column("next_attempt_at", TZ, nullable=False, server_default=text("now()")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    #: The epoch of the leader that took it for a send last: a newer leader takes it at
    #: once (the older one is deposed; it may be sending it still).
    Column("taken_by_epoch", BigInteger),
    Column("last_error", Text),
    Column("sent_at", TZ),
    #: Set when the scheduler gave up (its sends failed for a day).
    Column("given_up_at", TZ),
    CheckConstraint(in_values("event", NotificationEvent), name="ck_beat_notifications_event"),
)
# The outbox's due rows, oldest first.
Index(
    "ix_beat_notifications_due",
    notifications.c.next_attempt_at,
    postgresql_where=text("sent_at IS NULL AND given_up_at IS NULL"),
)
# An incident's notifications: deleting an incident (retention) finds them by it.
Index("ix_beat_notifications_incident", notifications.c.incident_id)
