"""Fault injection in the normal test run: short chaos runs on fixed seeds.

Each run starts 3 beats and 3 workers on private PostgreSQL and Redis servers,
injects every fault kind at least once (kills, a leader paused past its lease,
server restarts, cut and stalled links), then checks from PostgreSQL that every
fire time ran exactly once, every effect exists once and no run is stuck. The
long version is ``scripts/chaos.sh`` (10 minutes by default, random seed).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from tests.chaos import servers
from tests.chaos.faults import FaultKind, durations, make_plan
from tests.chaos.harness import ChaosConfig, run_chaos
from tests.chaos.servers import MissingBinaries, find_binaries
from tests.conftest import IN_CI
from tests.e2e.proxy import CuttableProxy

pytestmark = pytest.mark.chaos

#: (seed, seconds of faults) of the runs CI makes: about a minute each, all fault kinds.
CI_RUNS = [(20261202, 40.0)]

#: Runs that once failed, kept to re-run the same fault plan: (seed, seconds, what it caught).
REGRESSION_RUNS: list[tuple[int, float, str]] = [
    (
        1,
        50.0,
        "the first run of the harness: beat syncs the project's demo jobs from code, and"
        " their runs (which write no effect) counted as lost and unexpected; the harness"
        " now pauses every schedule but its workload and judges only the workload's runs",
    ),
]


@pytest.fixture(scope="module")
def servers_installed() -> None:
    try:
        find_binaries()
    except MissingBinaries as exc:
        if IN_CI:
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


def run_and_check(seed: int, duration: float) -> None:
    config = ChaosConfig(seed=seed, duration=duration)
    report = run_chaos(config)
    print(report.summary())
    assert not report.violations, f"{report.summary()}\n{report.logs_tail[-30000:]}"
    # Not asserted: that a paused leader was replaced while stopped. A pause that
    # lands inside a claim transaction holds the leader row, and the takeover waits
    # for it by design (up to the claim's idle timeout, longer than some pauses).
    assert set(report.log.injected) == set(FaultKind), "every fault kind was injected"


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("seed", "duration"), CI_RUNS)
def test_a_short_chaos_run_keeps_every_guarantee(
    servers_installed: None, seed: int, duration: float
) -> None:
    run_and_check(seed, duration)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("seed", "duration"), [(seed, duration) for seed, duration, _ in REGRESSION_RUNS]
)
def test_a_seed_that_once_failed_passes(
    servers_installed: None, seed: int, duration: float
) -> None:
    run_and_check(seed, duration)


# -- the plan and the proxy (no servers needed) ---------------------------------------------


def test_a_seed_always_gives_the_same_plan() -> None:
    assert make_plan(7, 60, lock_ttl=3) == make_plan(7, 60, lock_ttl=3)
    assert make_plan(7, 60, lock_ttl=3) != make_plan(8, 60, lock_ttl=3)


@pytest.mark.parametrize("seed", range(20))
def test_every_plan_has_every_kind_and_no_outage_reaches_the_misfire_grace(seed: int) -> None:
    config = ChaosConfig(seed=seed, duration=10)
    plan = make_plan(seed, config.duration, lock_ttl=config.lock_ttl)
    assert {fault.kind for fault in plan} == set(FaultKind)
    assert all(fault.duration < config.misfire_grace / 4 for fault in plan)
    assert [fault.at for fault in plan] == sorted(fault.at for fault in plan)


def test_a_pause_outlasts_the_lease_with_room_for_a_takeover() -> None:
    low, _ = durations(lock_ttl=3.0)[FaultKind.LEADER_PAUSE]
    assert low >= 3.0 + 2 * 1.0  # TTL, then up to one standby poll and the takeover


def test_a_stalled_proxy_holds_bytes_until_it_flows_again() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        received: list[bytes] = []

        def echo_once() -> None:
            conn, _ = server.accept()
            with conn:
                received.append(conn.recv(100))
                conn.sendall(b"pong")

        threading.Thread(target=echo_once, daemon=True).start()
        proxy = CuttableProxy("127.0.0.1", server.getsockname()[1])
        try:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
                proxy.stall()
                client.sendall(b"ping")
                time.sleep(0.5)
                assert received == [], "nothing gets through a stall"
                proxy.unstall()
                assert client.recv(100) == b"pong"
                assert received == [b"ping"]
        finally:
            proxy.close()


def test_missing_servers_are_named_with_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(servers, "POSTGRES_BIN_GLOB", "/nonexistent/*/bin")
    with pytest.raises(MissingBinaries) as raised:
        find_binaries()
    message = str(raised.value)
    assert "initdb, pg_ctl, redis-server not found" in message
    assert "apt-get install postgresql redis-server" in message
    assert "\n" not in message


# -- findings --------------------------------------------------------------------------------


def test_finding_chaos_sh_installs_the_dev_extra_before_running() -> None:
    """After the quickstart (base package only), chaos.sh failed: No module named 'pytest'."""
    script = (Path(__file__).resolve().parents[2] / "scripts" / "chaos.sh").read_text()
    install = script.index("pip install --quiet -e '.[dev]'")
    assert install < script.index("exec .venv/bin/python -m tests.chaos")
    assert "-m venv .venv" in script
