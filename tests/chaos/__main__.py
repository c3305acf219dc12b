"""The long chaos run: ``python -m tests.chaos [--seed N] [--duration SECONDS | --runs N]
[--topology direct|rabbitmq|sentinel|pgbouncer]``
(``scripts/chaos.sh`` runs this). Exit status 0 if every guarantee held, 1 on
any violation, 2 if PostgreSQL or Redis is not installed."""

from __future__ import annotations

import argparse
import random
import signal
import sys
from pathlib import Path
from types import FrameType

from tests.chaos.faults import FaultKind
from tests.chaos.harness import CLOCK_SKEW, ChaosConfig, run_chaos
from tests.chaos.servers import MissingBinaries
from tests.chaos.topologies import KINDS, Topology
from tests.chaos.workload import WorkloadShape


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/chaos.sh",
        description="Run a mixed fleet (3 beats, 4 prefork and threads workers, one worker"
        " without the package, one beat and one worker 2 minutes ahead and one of each"
        " behind) on private PostgreSQL and Redis, inject faults from a seeded plan (kills,"
        " pauses, server restarts mid-run, idle_session_timeout, cut links, broker message"
        " loss, deploys), then check from PostgreSQL that every fire time ran exactly once,"
        " every effect happened once, every scheduled workflow (chain, group, chord) ran each"
        " of its steps once, and no run was lost, stuck, early or run after its expiry.",
    )
    parser.add_argument("--seed", type=int, help="seed of the fault plan (default: random)")
    parser.add_argument(
        "--duration", type=float, default=600, help="seconds of fault injection (default 600)"
    )
    parser.add_argument(
        "--runs",
        type=int,
        help="about this many runs (fire times) instead of a duration: the duration the"
        " workload needs for them (about 42 a second, the crowd's included; the chains'"
        " links and the workflows' steps on top); the"
        " summary counts the real number",
    )
    parser.add_argument("--beats", type=int, default=3)
    parser.add_argument(
        "--workers", type=int, default=4, help="workers with the package (prefork, threads...)"
    )
    parser.add_argument(
        "--clock-skew",
        type=float,
        default=CLOCK_SKEW,
        help="seconds the second beat and third worker are ahead, the third beat and fourth"
        f" worker behind (default {CLOCK_SKEW:g}; 0: every clock true)",
    )
    parser.add_argument(
        "--without-foreign-worker",
        action="store_true",
        help="leave out the worker without the package",
    )
    parser.add_argument(
        "--workflow-every",
        type=float,
        default=WorkloadShape().workflow_every,
        metavar="SECONDS",
        help="seconds between two runs of each workflow schedule (default"
        f" {WorkloadShape().workflow_every:g})",
    )
    parser.add_argument(
        "--without-workflows",
        action="store_true",
        help="leave out the workflow schedules (and the result backend their chords need):"
        " the workload as it was before them (--workflow-every 0)",
    )
    parser.add_argument(
        "--claim-ahead",
        type=float,
        default=10.0,
        help="seconds the beats claim ahead (HABEAT_CLAIM_AHEAD; default 10)",
    )
    parser.add_argument(
        "--topology",
        type=Topology,
        choices=list(Topology),
        default=Topology.DIRECT,
        help="the servers the fleet runs on: one PostgreSQL and one Redis reached directly"
        " (default); RabbitMQ as the broker; the lease and broker on Redis Sentinel;"
        " PostgreSQL through PgBouncer (tests/chaos/topologies.py)",
    )
    parser.add_argument(
        "--only",
        type=fault_kinds,
        default=(),
        metavar="KIND,...",
        help="inject only these fault kinds, by name ("
        + ", ".join(kind.name for kind in FaultKind)
        + "); each must be one of the topology's",
    )
    parser.add_argument(
        "--show-logs", action="store_true", help="print the processes' log tails on a violation"
    )
    parser.add_argument(
        "--keep-logs",
        type=Path,
        metavar="DIR",
        help="copy every process's full log to DIR, every violation (violations.txt) and"
        " the tables the verdict was made from (beat_runs.csv, e2e_effects.csv, ...)",
    )
    args = parser.parse_args(argv)
    foreign = [kind.name for kind in args.only if kind not in KINDS[args.topology]]
    if foreign:
        parser.error(f"--only: {', '.join(foreign)} not in the {args.topology} topology's faults")
    return args


def fault_kinds(value: str) -> tuple[FaultKind, ...]:
    """``BEAT_KILL,WORKER_KILL`` as fault kinds; an unknown name is refused."""
    try:
        return tuple(FaultKind[name.strip()] for name in value.split(",") if name.strip())
    except KeyError as exc:
        raise argparse.ArgumentTypeError(f"no fault kind {exc}") from None


def duration_for(runs: int) -> float:
    """Seconds of faults in which the default workload makes about ``runs`` runs (the
    fire times of the first seconds and the end phase's add a little)."""
    return float(round(runs / WorkloadShape().runs_per_second()))


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM unwinds like Ctrl-C, so every process, server and directory is cleaned up.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    duration = args.duration if args.runs is None else duration_for(args.runs)
    print(f"chaos: seed {seed}, {duration:g} s of faults", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    config = ChaosConfig(
        seed=seed,
        duration=duration,
        beats=args.beats,
        workers=args.workers,
        clock_skew=args.clock_skew,
        foreign_worker=not args.without_foreign_worker,
        claim_ahead=args.claim_ahead,
        workload=WorkloadShape(workflow_every=0 if args.without_workflows else args.workflow_every),
        keep_logs=args.keep_logs,
        topology=args.topology,
        only=args.only,
    )
    try:
        report = run_chaos(config)
    except MissingBinaries as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"chaos: interrupted; reproduce with {config.reproduce()}", file=sys.stderr)
        return 130
    if report.violations and args.show_logs:
        print(report.logs_tail)
    if args.keep_logs is not None:  # every violation, not only the first of each kind
        (args.keep_logs / "violations.txt").write_text("".join(f"{v}\n" for v in report.violations))
    print(report.summary(), flush=True)
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
