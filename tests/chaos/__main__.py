"""The long chaos run: ``python -m tests.chaos [--seed N] [--duration SECONDS]``
(``scripts/chaos.sh`` runs this). Exit status 0 if every guarantee held, 1 on
any violation, 2 if PostgreSQL or Redis is not installed."""

from __future__ import annotations

import argparse
import random
import signal
import sys
from pathlib import Path
from types import FrameType

from tests.chaos.harness import ChaosConfig, run_chaos
from tests.chaos.servers import MissingBinaries


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/chaos.sh",
        description="Run a 3-beat, 3-worker cluster on private PostgreSQL and Redis, inject"
        " faults from a seeded plan (kills, pauses, restarts, cut links, broker message loss,"
        " deploys), then check from PostgreSQL that every fire time ran exactly once, every"
        " effect happened once, and no run was lost, stuck, early or run after its expiry.",
    )
    parser.add_argument("--seed", type=int, help="seed of the fault plan (default: random)")
    parser.add_argument(
        "--duration", type=float, default=600, help="seconds of fault injection (default 600)"
    )
    parser.add_argument("--beats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--claim-ahead",
        type=float,
        default=10.0,
        help="seconds the beats claim ahead (HABEAT_CLAIM_AHEAD; default 10)",
    )
    parser.add_argument(
        "--show-logs", action="store_true", help="print the processes' log tails on a violation"
    )
    parser.add_argument(
        "--keep-logs", type=Path, metavar="DIR", help="copy every process's full log to DIR"
    )
    return parser.parse_args(argv)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM unwinds like Ctrl-C, so every process, server and directory is cleaned up.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    print(f"chaos: seed {seed}, {args.duration:g} s of faults", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    config = ChaosConfig(
        seed=seed,
        duration=args.duration,
        beats=args.beats,
        workers=args.workers,
        claim_ahead=args.claim_ahead,
        keep_logs=args.keep_logs,
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
    print(report.summary(), flush=True)
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
