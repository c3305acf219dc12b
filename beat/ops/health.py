"""The health of a cluster: PostgreSQL, the schema, Redis, the leader and the
schedules, each check passing or saying what is wrong and what to do; and who
leads, as the leader row (PostgreSQL) and the lease (Redis) tell it.

Plain values, computed here and rendered elsewhere (:mod:`beat.ops.rendering`):
``celery -A app schedules health`` prints them, a web page may show them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy.exc import SQLAlchemyError

from beat.errors import HABeatError, LeaseUnavailable
from beat.lease.status import LeaseStatus
from beat.models import Incident, IncidentKind
from beat.store.all_roles import Store
from beat.store.db import first_line
from beat.store.leader import LeaderInfo, UnrecordedConsumer
from beat.store.tables import ALL_QUEUES


@dataclass(frozen=True, kw_only=True, slots=True)
class Check:
    """One check: passed or not, and what it found (what to do, when it failed)."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Health:
    """The checks of :func:`health_checks`, in order."""

    checks: list[Check]

    @property
    def ok(self) -> bool:
        """Every check passed."""
        return all(check.ok for check in self.checks)


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterStatus:
    """Who leads: the leader row (None before the first leader), the lease, and the
    database's now when they were read."""

    leader: LeaderInfo | None
    lease: LeaseStatus
    now: datetime

    @property
    def valid(self) -> bool:
        return lease_is_valid(self.leader, self.lease)

    @property
    def status(self) -> str:
        """``leading``, or what is wrong and what to do."""
        return leader_status(self.leader, self.lease)


def lease_is_valid(info: LeaderInfo | None, lease: LeaseStatus) -> bool:
    """A leader holds a valid lease: the lock exists and names the holder of the leader row."""
    return info is not None and lease.holder is not None and lease.holder == info.holder


def leader_status(info: LeaderInfo | None, lease: LeaseStatus) -> str:
    """``leading`` if a leader holds a valid lease, else what is wrong and what to do."""
    if lease_is_valid(info, lease):
        return "leading"
    if lease.holder is None:
        return (
            f"nobody holds the lease {lease.key}: start `celery -A app beat`"
            " (a standby takes over within the lock TTL)"
        )
    recorded = "no process" if info is None else info.holder
    return (
        f"the lease is held by {lease.holder} but the leader row names {recorded}:"
        " a takeover is in progress, check again in a few seconds"
    )


#: Incidents a health line names.
INCIDENTS_LISTED = 5


def health_checks(
    store: Store,
    read_lease: Callable[[], LeaseStatus],
    *,
    overdue_grace: timedelta,
    fail_on: Collection[IncidentKind] = (),
) -> Health:
    """postgres, schema, redis, leader, claims, schedules: each passes or says what is
    wrong.

    ``read_lease`` reads the lease's status from Redis (LeaseUnavailable if Redis
    does not answer); a check whose service does not answer leaves those that
    depend on it not checked. ``overdue_grace``: how late a fire time may be before
    the claims check fails (``beat.ops.cluster.default_overdue_grace``); ``fail_on``:
    the kinds of incident that fail the incidents check while open (a stall, and a
    schedule the scheduler paused, always do)."""
    checks = _service_checks(store, read_lease)
    checks = [*checks, _claims_check(store, checks, overdue_grace)]
    checks = [*checks, _quarantine_check(store, checks)]
    return Health(
        checks=[
            *checks,
            *_consumers_check(store, checks),
            *_incidents_check(store, checks, fail_on),
        ]
    )


def _service_checks(store: Store, read_lease: Callable[[], LeaseStatus]) -> list[Check]:
    """postgres, schema, redis, leader."""
    postgres = _probe("postgres", store.ping, f"PostgreSQL at {store.url} answers")
    schema = (
        _probe("schema", store.check_schema, "schema is current")
        if postgres.ok
        else _not_checked("schema", "PostgreSQL does not answer")
    )
    try:
        lease = read_lease()
    except LeaseUnavailable as exc:
        redis_down = Check(name="redis", ok=False, detail=str(exc))
        return [postgres, schema, redis_down, _leader_on_the_row_check(store, schema)]
    redis_up = Check(name="redis", ok=True, detail=f"Redis at {lease.where} answers")
    if not schema.ok:
        return [postgres, schema, redis_up, _not_checked("leader", "the schema is not current")]
    return [postgres, schema, redis_up, _leader_check(store, lease)]


def _leader_check(store: Store, lease: LeaseStatus) -> Check:
    try:
        info = store.leader_info()
    except (HABeatError, SQLAlchemyError) as exc:
        return Check(name="leader", ok=False, detail=first_line(exc))
    if info is not None and lease_is_valid(info, lease):
        expiry = "" if lease.ttl_ms is None else f", lease expires in {lease.ttl_ms / 1000:.1f}s"
        return Check(
            name="leader", ok=True, detail=f"{info.holder} leads (epoch {info.epoch}{expiry})"
        )
    return Check(name="leader", ok=False, detail=leader_status(info, lease))


def _leader_on_the_row_check(store: Store, schema: Check) -> Check:
    """Redis does not answer: a process may lead on the leader row alone
    (``habeat_lead_without_redis``), holding it by PostgreSQL's clock."""
    if not schema.ok:
        return _not_checked("leader", "Redis does not answer")
    try:
        info = store.leader_info()
    except (HABeatError, SQLAlchemyError) as exc:
        return Check(name="leader", ok=False, detail=first_line(exc))
    if info is None or info.held_for is None or info.held_for <= 0:
        return Check(
            name="leader",
            ok=False,
            detail="Redis does not answer and no process holds the leader row: nothing is"
            " claimed until a beat takes the row (habeat_lead_without_redis) or Redis answers",
        )
    return Check(
        name="leader",
        ok=True,
        detail=f"{info.holder} leads on the leader row in PostgreSQL alone (epoch {info.epoch},"
        f" held for {info.held_for:.1f}s): scheduling goes on; restore Redis",
    )


def _claims_check(store: Store, checks: list[Check], grace: timedelta) -> Check:
    """Red while enabled schedules wait unclaimed longer than ``grace`` after their fire
    time, by the database's clock: a leader that leads but whose every claim fails
    (one unreadable row once stopped them all) looks healthy by its lease alone."""
    failed = [
        check.name for check in checks if check.name in ("postgres", "schema") and not check.ok
    ]
    if failed:
        return _not_checked("claims", f"the {failed[0]} check failed")
    try:
        found = store.overdue(grace=grace, limit=3)
    except (HABeatError, SQLAlchemyError) as exc:
        return Check(name="claims", ok=False, detail=first_line(exc))
    late = f"{grace.total_seconds():g}s"
    if not found.total:
        return Check(name="claims", ok=True, detail=f"no schedule waits unclaimed past {late}")
    oldest = ", ".join(
        f"{entry.name} due {entry.overdue_by.total_seconds():.0f}s ago" for entry in found.schedules
    )
    count = "1 schedule is" if found.total == 1 else f"{found.total} schedules are"
    return Check(
        name="claims",
        ok=False,
        detail=f"{count} due and unclaimed for more than {late} (oldest: {oldest}): no leader"
        " claims; if one leads, its log says why (`beat tick failed`)",
    )


def _quarantine_check(store: Store, checks: list[Check]) -> Check:
    """Red while any schedule is quarantined (it fires no more until it is resumed)."""
    failed = [
        check.name for check in checks if check.name in ("postgres", "schema") and not check.ok
    ]
    if failed:
        return _not_checked("schedules", f"the {failed[0]} check failed")
    try:
        found = store.quarantined()
    except (HABeatError, SQLAlchemyError) as exc:
        return Check(name="schedules", ok=False, detail=first_line(exc))
    if not found:
        return Check(name="schedules", ok=True, detail="no schedule is quarantined")
    listed = "; ".join(
        f"{entry.name} since {entry.quarantined_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
        f" ({entry.reason})"
        for entry in found
    )
    return Check(
        name="schedules",
        ok=False,
        detail=f"{len(found)} quarantined, not firing: {listed}:"
        " fix each, then `celery -A app schedules resume NAME`",
    )


def _consumers_check(store: Store, checks: list[Check]) -> list[Check]:
    """A failing ``consumers`` line while the leader finds that some consumer of a queue
    does not record runs (``beat.leader.lost_messages``); no line otherwise, or when the schema
    cannot be read."""
    if not all(check.ok for check in checks if check.name in ("postgres", "schema")):
        return []
    try:
        found = [entry for entry in store.unrecorded_consumers() if entry.gone_at is None]
    except (HABeatError, SQLAlchemyError):
        return []
    if not found:
        return []
    return [Check(name="consumers", ok=False, detail=consumers_text(found))]


def _incidents_check(
    store: Store, checks: list[Check], fail_on: Collection[IncidentKind]
) -> list[Check]:
    """An ``incidents`` line while incidents are open: failing (red) while the cluster
    stalls, while the scheduler has paused a schedule because of one (it runs no more:
    ``pause_after_failures`` says which incidents are that critical), or while one of a
    kind in ``fail_on`` is open; passing otherwise (the schedules still fire); no line
    without open incidents, or when the schema cannot be read."""
    if not all(check.ok for check in checks if check.name in ("postgres", "schema")):
        return []
    try:
        found = store.incidents(limit=INCIDENTS_LISTED + 1)
    except (HABeatError, SQLAlchemyError):
        return []
    if not found:
        return []
    stalled = [incident for incident in found if incident.kind is IncidentKind.STALL]
    if stalled:
        return [
            Check(
                name="incidents",
                ok=False,
                detail=f"no fire time is being claimed: {stalled[0].last_error} (since"
                f" {stalled[0].opened_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC)",
            )
        ]
    paused = [incident for incident in found if incident.paused_at is not None]
    if paused:
        return [
            Check(
                name="incidents",
                ok=False,
                detail=f"paused by the scheduler after failures in a row: {_listed(paused)};"
                " fix each, then `celery -A app schedules resume NAME`",
            )
        ]
    critical = [incident for incident in found if incident.kind in fail_on]
    shown = critical or found
    return [
        Check(
            name="incidents",
            ok=not critical,
            detail=f"{'' if critical else 'still firing: '}{_listed(shown)}"
            " (`schedules incidents`)",
        )
    ]


def _listed(incidents: Sequence[Incident]) -> str:
    """The first ``INCIDENTS_LISTED`` incidents, each its schedule and what is wrong."""
    listed = ", ".join(
        f"{incident.schedule_name} ({_wrong(incident)})"
        for incident in incidents[:INCIDENTS_LISTED]
    )
    return listed + ("" if len(incidents) <= INCIDENTS_LISTED else ", ...")


def _wrong(incident: Incident) -> str:
    if incident.kind is IncidentKind.FAILING:
        return f"failed {incident.failures} times in a row"
    return incident.kind.value


def consumers_text(found: Sequence[UnrecordedConsumer]) -> str:
    """What the leader found about consumers that do not record runs, and what to do."""
    listed = "; ".join(_consumer_text(entry) for entry in found)
    return (
        f"{listed}: lost-message recovery for these queues falls back to the visibility"
        " timeout (a run taken there is not sent again, a message really lost waits for"
        " it); install celery-habeat in those workers (beat.worker in their imports)"
        " or keep them off beat's queues"
    )


def _consumer_text(entry: UnrecordedConsumer) -> str:
    seen = f"{entry.seen_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    if entry.queue == ALL_QUEUES:
        return f"no worker answered Celery's remote control (last asked {seen})"
    return (
        f"queue {entry.queue} is consumed by {entry.consumer}, which does not record runs"
        f" (seen {seen})"
    )


def _probe(name: str, action: Callable[[], object], success: str) -> Check:
    try:
        action()
    except (HABeatError, SQLAlchemyError) as exc:
        return Check(name=name, ok=False, detail=first_line(exc))
    return Check(name=name, ok=True, detail=success)


def _not_checked(name: str, because: str) -> Check:
    return Check(name=name, ok=False, detail=f"not checked: {because}")
