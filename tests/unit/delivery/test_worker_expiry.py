"""A run's ``expires`` moved onto a worker's clock for Celery's own check, its instant
kept for ours; a retry's ``eta`` carried as an instant of the database's clock by the
worker that sends it, and moved onto the clock of the worker that receives it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from beat.delivery.tracking import (
    DUE_HEADER,
    EXPIRES_HEADER,
    EXPIRY_MARGIN,
    WorkerClock,
    carry_database_instants,
    retime,
    retry_due,
    run_expiry,
)
from beat.publish.messages import ATTEMPT_HEADER

EXPIRY = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


class _Clock:
    def __init__(self, ahead: float | None, uncertainty: float) -> None:
        self._ahead = ahead
        self._uncertainty = uncertainty

    def ahead(self) -> float | None:
        return None if self._ahead is None else self._ahead + self._uncertainty

    def ahead_at_least(self) -> float | None:
        return None if self._ahead is None else self._ahead - self._uncertainty


def clock(ahead: float | None, uncertainty: float = 0.0) -> WorkerClock:
    return cast(WorkerClock, _Clock(ahead, uncertainty))


def beat_headers(**headers: Any) -> dict[str, Any]:
    return {ATTEMPT_HEADER: 1, "expires": EXPIRY.isoformat(), **headers}


def test_a_clock_ahead_moves_celerys_expiry_later_and_keeps_the_instant() -> None:
    headers = beat_headers()
    retime(headers, clock(120.0))
    assert run_expiry(headers) == EXPIRY
    assert datetime.fromisoformat(headers["expires"]) == EXPIRY + timedelta(
        seconds=120 + EXPIRY_MARGIN
    )


def test_a_clock_behind_moves_it_earlier() -> None:
    headers = beat_headers()
    retime(headers, clock(-120.0))
    assert datetime.fromisoformat(headers["expires"]) == EXPIRY - timedelta(
        seconds=120 - EXPIRY_MARGIN
    )


def test_a_retry_is_retimed_from_the_instant_it_carries_not_from_its_parents_clock() -> None:
    shifted = (EXPIRY + timedelta(seconds=500)).isoformat()
    headers = beat_headers(expires=shifted, **{EXPIRES_HEADER: EXPIRY.isoformat()})
    retime(headers, clock(0.0))
    assert datetime.fromisoformat(headers["expires"]) == EXPIRY + timedelta(seconds=EXPIRY_MARGIN)


def test_messages_beat_did_not_publish_and_unmeasured_clocks_are_left_alone() -> None:
    other = {"expires": EXPIRY.isoformat()}
    retime(other, clock(120.0))
    assert other == {"expires": EXPIRY.isoformat()}
    unmeasured = beat_headers()
    retime(unmeasured, clock(None))
    assert unmeasured == beat_headers()


DUE = datetime(2026, 12, 4, 12, 0, 10, tzinfo=UTC)


def sent_retry(sender_ahead: float, uncertainty: float = 0.0) -> dict[str, Any]:
    """The headers of a retry due at ``DUE`` (the database's clock), as a worker whose
    clock is ``sender_ahead`` seconds ahead publishes it."""
    eta = (DUE + timedelta(seconds=sender_ahead)).isoformat()
    headers = beat_headers(eta=eta)
    carry_database_instants(headers, clock(sender_ahead, uncertainty))
    return headers


def test_a_retry_from_a_worker_behind_waits_for_its_due_time_on_a_worker_in_step() -> None:
    """issue 38, finding 1: the retry's ETA, written 120 s early by a worker behind, is
    moved onto the receiving worker's clock from the instant the sender carried."""
    headers = sent_retry(-120.0)
    assert retry_due(headers) == DUE
    retime(headers, clock(0.0))
    assert datetime.fromisoformat(headers["eta"]) == DUE
    assert retry_due(headers) == DUE, "the instant still names the message's eta"
    ahead = sent_retry(-120.0)
    retime(ahead, clock(30.0))
    assert datetime.fromisoformat(ahead["eta"]) == DUE + timedelta(seconds=30)


def test_a_retry_from_a_skewed_worker_is_sent_due_by_the_database_s_clock() -> None:
    """A worker without this package cannot retime a retry: the chaos suite's fleet had
    one start retries asked for by a worker 120 s behind at once, 10 s early. The sender
    writes the ``eta`` itself as the due instant by the database's clock, so a worker
    whose clock is the database's waits for it as it is."""
    for sender_ahead in (-120.0, 0.0, 120.0):
        headers = sent_retry(sender_ahead)
        assert datetime.fromisoformat(headers["eta"]) == DUE
        assert retry_due(headers) == DUE


def test_a_retrys_due_instant_is_never_early_for_the_uncertainty_of_either_clock() -> None:
    headers = sent_retry(-120.0, uncertainty=0.25)
    due = retry_due(headers)
    assert due == DUE + timedelta(seconds=0.25), "the sender counts the most it can be behind"
    retime(headers, clock(0.0, uncertainty=0.25))
    assert datetime.fromisoformat(headers["eta"]) == DUE + timedelta(seconds=0.5)


def test_a_due_instant_copied_from_an_earlier_retry_is_not_taken_for_this_one() -> None:
    earlier = sent_retry(0.0)
    later_eta = (DUE + timedelta(seconds=60)).isoformat()
    copied = {**earlier, "eta": later_eta}  # sent on by a worker that does not write it
    assert retry_due(copied) is None
    retime(copied, clock(-120.0))
    # Its eta is taken for an instant of the database's clock (the sender's clock is
    # unknown: assumed in step), moved onto this worker's, 120 s behind.
    assert datetime.fromisoformat(copied["eta"]) == DUE + timedelta(seconds=60 - 120)
    assert retry_due(copied) == DUE + timedelta(seconds=60), "the instant now names the eta"
    sent_again = {**earlier, "eta": later_eta}
    carry_database_instants(sent_again, clock(None))  # this worker could not measure its clock
    assert DUE_HEADER not in sent_again
    no_eta = {**earlier}
    del no_eta["eta"]
    carry_database_instants(no_eta, clock(0.0))
    assert DUE_HEADER not in no_eta, "a retry due at once carries no instant"


def test_a_retry_is_sent_with_its_expiry_by_the_database_s_clock() -> None:
    """A worker 120 s ahead retimed the delivery's ``expires`` onto its clock, and Celery
    copies the request's ``expires`` into the retry: sent so, a worker without this
    package (in step with the database) would hold the retry 2 minutes past its expiry.
    The retry goes out with the instant itself."""
    received = beat_headers()
    retime(received, clock(120.0))
    assert datetime.fromisoformat(received["expires"]) != EXPIRY
    carry_database_instants(received, clock(120.0))
    assert datetime.fromisoformat(received["expires"]) == EXPIRY
    assert run_expiry(received) == EXPIRY


def test_a_retry_sent_without_an_instant_is_not_started_early_by_a_worker_ahead() -> None:
    """The chaos suite's mixed fleet: a worker without the package asked for a retry in
    10 s (its clock in step with the database's), and a worker 120 s ahead started it
    at once: Celery read the ETA as past by its own clock. The ETA is taken for an
    instant of the database's clock and moved onto the receiving worker's."""
    eta = DUE.isoformat()
    headers = beat_headers(eta=eta)
    retime(headers, clock(120.0))
    assert datetime.fromisoformat(headers["eta"]) == DUE + timedelta(seconds=120)
    assert retry_due(headers) == DUE
