"""The benchmark suite: ``python -m bench [suite ...]`` (``scripts/bench.sh`` wraps it).

Suites (all but pages and workers by default): lateness, throughput, scale, failover,
reclaim; and two run when named: pages (``python -m bench pages``: its fill of
10,000,000 runs takes minutes) and workers (``python -m bench workers``: what a
worker pays for the guarantees, against plain Celery). Each prints what it measured
as a Markdown table; ``--json FILE`` also writes every figure. Nothing is asserted:
targets are printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import failover, lateness, pages, reclaim, scale, worker_leases, workers
from bench.common import table

SUITES = ("lateness", "throughput", "scale", "failover", "reclaim", "pages", "workers")
#: What runs when no suite is named.
DEFAULT_SUITES = SUITES[:-2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", metavar="suite", help=", ".join(SUITES))
    parser.add_argument(
        "--sizes", default="1000,10000", help="lateness: schedule counts (default 1000,10000)"
    )
    parser.add_argument(
        "--burst", type=int, default=100_000, help="throughput: schedules due at once"
    )
    parser.add_argument(
        "--schedulers",
        help=f"lateness: which of {','.join(lateness.SCHEDULERS)} (default all);"
        f" throughput: which of {','.join(lateness.BURST_SCHEDULERS)} (default all)",
    )
    parser.add_argument(
        "--stored", default="10000,1000000", help="scale: stored schedule counts to compare"
    )
    parser.add_argument(
        "--schedules", type=int, default=pages.SCHEDULES, help="pages: schedules stored"
    )
    parser.add_argument("--runs", type=int, default=pages.RUNS, help="pages: runs stored")
    parser.add_argument(
        "--repeats", type=int, default=pages.REPEATS, help="pages: timed calls of each read"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help=f"pages: keep the database {pages.DATABASE} (used again at the same sizes)",
    )
    parser.add_argument(
        "--modes", default=",".join(workers.MODES), help="workers: which of them (default all)"
    )
    parser.add_argument(
        "--kinds", default=",".join(workers.KINDS), help="workers: no-op and/or 10-ms tasks"
    )
    parser.add_argument(
        "--pools", default=",".join(workers.POOLS), help="workers: prefork and/or threads"
    )
    parser.add_argument(
        "--processes", default="1,2,4", help="workers: worker processes (default 1,2,4)"
    )
    parser.add_argument(
        "--tasks", type=int, help="workers: tasks per cell (default 2,000 no-op, 1,000 10-ms)"
    )
    parser.add_argument(
        "--no-paced", action="store_true", help="workers: skip the due → start pass"
    )
    parser.add_argument(
        "--held",
        type=int,
        default=worker_leases.RUNS,
        help="workers: long runs held at once for the heartbeats' pass (0: skip it)",
    )
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    options = parser.parse_args(argv)
    unknown = set(options.suites) - set(SUITES)
    if unknown:
        parser.error(f"unknown suite {', '.join(sorted(unknown))}: use {', '.join(SUITES)}")
    chosen = options.schedulers
    results: dict[str, Any] = {"machine": machine(), "started": time.strftime("%FT%TZ")}
    for suite in options.suites or DEFAULT_SUITES:
        print(f"\n## {suite}\n", flush=True)
        if suite == "lateness":
            sizes = [int(size) for size in options.sizes.split(",")]
            schedulers = names(chosen, lateness.SCHEDULERS)
            results[suite] = run_lateness(schedulers, sizes)
        elif suite == "throughput":
            schedulers = names(chosen, lateness.BURST_SCHEDULERS)
            results[suite] = run_lateness(schedulers, [options.burst], throughput=True)
        elif suite == "scale":
            stored = [int(size) for size in options.stored.split(",")]
            results[suite] = scale.report(scale.measure(stored))
        elif suite == "failover":
            results[suite] = failover.report(failover.measure())
        elif suite == "reclaim":
            results[suite] = reclaim.report(reclaim.measure())
        elif suite == "pages":
            fill, reads = pages.measure(
                options.schedules, options.runs, repeats=options.repeats, keep=options.keep
            )
            results[suite] = pages.report(fill, reads)
        elif suite == "workers":
            per_cell = {kind: options.tasks for kind in workers.KINDS} if options.tasks else None
            cells, paced = workers.measure(
                split(options.modes),
                split(options.kinds),
                split(options.pools),
                [int(count) for count in split(options.processes)],
                per_cell,
                paced=not options.no_paced,
            )
            results[suite] = workers.report(cells, paced)
            if options.held:
                held = worker_leases.measure(split(options.modes), options.held)
                results[suite]["held"] = worker_leases.report(held)
    if options.json:
        options.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


def split(listed: str) -> list[str]:
    return [item for item in listed.split(",") if item]


def names(chosen: str | None, default: tuple[str, ...]) -> list[str]:
    """The schedulers named on the command line, else ``default``."""
    if chosen is None:
        return list(default)
    return [name for name in chosen.split(",") if name]


def run_lateness(
    schedulers: list[str], sizes: list[int], *, throughput: bool = False
) -> list[dict[str, Any]]:
    measured = [
        lateness.measure(name, size, once=throughput) for size in sizes for name in schedulers
    ]
    ours = {m.schedules: m for m in measured if m.scheduler == "habeat"}
    print(throughput_table(measured, ours) if throughput else lateness_table(measured, ours))
    return [asdict(m) | {"runs_per_s": m.runs_per_s} for m in measured]


def lateness_table(measured: list[lateness.Lateness], ours: dict[int, lateness.Lateness]) -> str:
    headers = ["scheduler", "schedules", "arrived", "p50 ms", "p99 ms", "max ms"]
    headers += ["p99 vs ours", "CPU s/min", "peak RSS MiB"]
    rows = [
        [
            m.scheduler,
            f"{m.schedules:,}",
            f"{m.arrived:,}",
            f"{m.p50_ms:,.0f}",
            f"{m.p99_ms:,.0f}",
            f"{m.max_ms:,.0f}",
            ratio(m.p99_ms, ours[m.schedules].p99_ms) if m.schedules in ours else "n/a",
            f"{m.cpu_s_per_min:.2f}",
            f"{m.peak_rss_mib:.0f}",
        ]
        for m in measured
    ]
    return table(headers, rows)


def throughput_table(measured: list[lateness.Lateness], ours: dict[int, lateness.Lateness]) -> str:
    headers = ["scheduler", "due at once", "queued", "p50 ms", "p99 ms", "max ms", "runs/s"]
    headers += ["ours vs this", "CPU s/min", "peak RSS MiB"]
    rows = [
        [
            m.scheduler,
            f"{m.schedules:,}",
            f"{m.arrived:,}",
            f"{m.p50_ms:,.0f}",
            f"{m.p99_ms:,.0f}",
            f"{m.max_ms:,.0f}",
            f"{m.runs_per_s:,.0f}",
            ratio(ours[m.schedules].runs_per_s, m.runs_per_s) if m.schedules in ours else "n/a",
            f"{m.cpu_s_per_min:.2f}",
            f"{m.peak_rss_mib:.0f}",
        ]
        for m in measured
    ]
    return table(headers, rows)


def ratio(numerator: float, denominator: float) -> str:
    if not denominator or math.isnan(numerator) or math.isnan(denominator):
        return "n/a"
    return f"{numerator / denominator:,.1f}x"


def machine() -> str:
    cores = len(Path("/proc/cpuinfo").read_text().split("processor")) - 1
    return f"{platform.machine()}, {cores} cores, Python {platform.python_version()}"


if __name__ == "__main__":
    sys.exit(main())
