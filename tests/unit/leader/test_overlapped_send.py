"""``beat.leader.overlapped_send.OverlappedSend`` on real threads (no server): one send in
flight, its error raised by the next wait, a signal handler that waits too, and a
shutdown that does not wait for a send that never ends."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from beat.leader.overlapped_send import OverlappedSend


@pytest.fixture
def sends() -> Iterator[OverlappedSend]:
    sends = OverlappedSend()
    yield sends
    sends.finish_quietly(timeout=5)


def test_one_send_at_a_time_in_the_order_started(sends: OverlappedSend) -> None:
    done: list[int] = []

    def send(number: int) -> None:
        time.sleep(0.05)
        done.append(number)

    for number in range(4):
        sends.start(lambda number=number: send(number))  # type: ignore[misc]
    assert sends.in_flight
    sends.finish()
    assert done == [0, 1, 2, 3]
    assert not sends.in_flight


def test_a_send_s_error_is_raised_by_the_next_wait_once(sends: OverlappedSend) -> None:
    def broken() -> None:
        raise ConnectionError("the broker is down")

    sends.start(broken)
    with pytest.raises(ConnectionError):
        sends.start(lambda: None)
    assert not sends.in_flight, "the failed send is over; the next one was not started"
    sends.finish()  # nothing left to raise


def test_a_signal_handler_that_waits_meanwhile_waits_for_the_send(sends: OverlappedSend) -> None:
    # beat shuts down from SIGTERM's handler, on the loop's thread, possibly while the
    # loop itself waits for the send: the handler must not find nothing in flight.
    release = threading.Event()
    ended: list[float] = []
    handler_returned: list[float] = []

    def slow_send() -> None:
        release.wait(5)
        ended.append(time.monotonic())

    def handler(signum: int, frame: object) -> None:
        threading.Timer(0.3, release.set).start()
        sends.finish_quietly(timeout=5)
        handler_returned.append(time.monotonic())

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        sends.start(slow_send)
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        sends.finish()  # interrupted by the handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert ended, "the send ended"
    assert handler_returned, "the handler ran"
    assert handler_returned[0] >= ended[0], "the handler returned before the send ended"


def test_a_shutdown_does_not_wait_for_a_send_that_never_ends(
    sends: OverlappedSend, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    sends.start(lambda: release.wait(10) and None)
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="beat.leader.overlapped_send"):
        sends.finish_quietly(timeout=0.2)
    assert time.monotonic() - started < 2
    assert "has not ended after 0.2s" in caplog.text
    release.set()


def test_a_pass_that_is_stopped_does_not_wait_long_for_a_stuck_send(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # SIGTERM's SystemExit goes through run_once while a send may be stuck on a broker
    # that stopped answering: the process must still exit.
    from beat.leader import loop as leader_loop
    from beat.leader import overlapped_send
    from tests.fakes import World, beat_config

    monkeypatch.setattr(overlapped_send, "SHUTDOWN_WAIT", 0.2)
    monkeypatch.setattr(leader_loop, "SHUTDOWN_WAIT", 0.2)
    process = World(beat_config()).start("a")
    sends = OverlappedSend()
    process.loop.sends = sends
    release = threading.Event()
    sends.start(lambda: release.wait(10) and None)

    def stopped() -> None:
        raise SystemExit(0)

    monkeypatch.setattr(process.loop, "_run_once", stopped)
    started = time.monotonic()
    with pytest.raises(SystemExit):
        process.loop.run_once()
    assert time.monotonic() - started < 2
    assert sends.in_flight, "still waited for before the next send"
    release.set()
    sends.finish()
