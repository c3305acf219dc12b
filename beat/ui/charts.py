"""Charts as inline SVG, drawn on the server: the pages load nothing from anywhere
else, so they work on a network with no way out.

Pure functions of numbers and labels; every label is escaped here, so a chart can
be put in a page as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape

#: Colours of run states, shared by the charts and the page's badges (``ui.css``).
STATE_COLOURS = {
    "succeeded": "#2e7d32",
    "failed": "#c62828",
    "lost": "#6a1b9a",
    "expired": "#ef6c00",
    "skipped": "#9e9e9e",
    "cancelled": "#757575",
    "pending": "#90caf9",
    "queued": "#42a5f5",
    "running": "#1565c0",
    "retrying": "#fbc02d",
}
#: Colours of the lateness percentiles.
PERCENTILE_COLOURS = {"p50": "#1565c0", "p95": "#ef6c00", "p99": "#c62828", "max": "#9e9e9e"}


def sparkline(values: Sequence[float | None], *, width: int = 120, height: int = 24) -> str:
    """The lateness of a schedule's last runs (seconds, oldest first; None: not
    published), as a line scaled to its own maximum; missing values leave a gap."""
    known = [value for value in values if value is not None]
    if not known:
        return f'<svg class="spark" width="{width}" height="{height}" role="img"><title>no runs published yet</title></svg>'  # noqa: E501
    top = max(max(known), 0.001)
    step = width / max(len(values) - 1, 1)
    segments: list[list[str]] = [[]]
    for index, value in enumerate(values):
        if value is None:
            segments.append([])
            continue
        y = height - 2 - (max(value, 0.0) / top) * (height - 4)
        segments[-1].append(f"{index * step:.1f},{y:.1f}")
    lines = "".join(
        f'<polyline fill="none" stroke="#1565c0" stroke-width="1.5" points="{" ".join(points)}"/>'
        if len(points) > 1
        else f'<circle r="1.5" fill="#1565c0" cx="{points[0].split(",")[0]}" cy="{points[0].split(",")[1]}"/>'  # noqa: E501
        for points in segments
        if points
    )
    title = f"lateness of the last {len(values)} runs: max {seconds_text(max(known))}"
    return (
        f'<svg class="spark" width="{width}" height="{height}" role="img">'
        f"<title>{escape(title)}</title>{lines}</svg>"
    )


def seconds_text(seconds: float) -> str:
    """A lateness for people: milliseconds below a second, else seconds."""
    if abs(seconds) < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s" if abs(seconds) < 60 else f"{seconds / 60:.1f} min"


def line_chart(
    series: Mapping[str, Sequence[float | None]],
    labels: Sequence[str],
    *,
    colours: Mapping[str, str],
    unit: str,
    width: int = 900,
    height: int = 260,
) -> str:
    """Several series over the same buckets (``labels``), from zero to their common
    maximum; a missing value breaks its line."""
    plot = _Plot(width, height, len(labels), _top(v for vs in series.values() for v in vs))
    body = [plot.frame(unit), plot.x_labels(labels)]
    for name, values in series.items():
        colour = colours.get(name, "#333")
        for run in _runs_of_points(values):
            points = " ".join(f"{plot.x(i):.1f},{plot.y(v):.1f}" for i, v in run)
            body.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>'
            )
            # A dot on every value, so a bucket with no neighbours still shows.
            body.extend(
                f'<circle r="2.5" fill="{colour}" cx="{plot.x(i):.1f}" cy="{plot.y(v):.1f}">'
                f"<title>{escape(labels[i])} {escape(name)}: {v:.4g} {escape(unit)}</title>"
                "</circle>"
                for i, v in run
            )
    body.append(plot.legend(list(series), colours))
    return plot.svg("".join(body))


def stacked_bars(
    stacks: Sequence[Mapping[str, float]],
    labels: Sequence[str],
    *,
    order: Sequence[str],
    colours: Mapping[str, str],
    unit: str,
    width: int = 900,
    height: int = 260,
) -> str:
    """One bar per bucket, its parts stacked in ``order`` (e.g. runs per minute by state)."""
    plot = _Plot(width, height, len(labels), _top(sum(stack.values()) for stack in stacks))
    bar = max(plot.step * 0.8, 1.0)
    body = [plot.frame(unit), plot.x_labels(labels)]
    for index, stack in enumerate(stacks):
        base = 0.0
        for part in order:
            value = stack.get(part, 0.0)
            if value <= 0:
                continue
            top, bottom = plot.y(base + value), plot.y(base)
            body.append(
                f'<rect x="{plot.x(index) - bar / 2:.1f}" y="{top:.1f}" width="{bar:.1f}"'
                f' height="{max(bottom - top, 0.5):.1f}" fill="{colours.get(part, "#333")}">'
                f"<title>{escape(labels[index])} {escape(part)}: {value:.4g} {escape(unit)}"
                "</title></rect>"
            )
            base += value
    shown = [part for part in order if any(stack.get(part, 0) > 0 for stack in stacks)]
    body.append(plot.legend(shown, colours))
    return plot.svg("".join(body))


def _top(values: Iterable[float | None]) -> float:
    return max([*(v for v in values if v is not None), 0.0]) or 1.0


def _runs_of_points(values: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """The values split where one is missing, each with its bucket's index."""
    runs: list[list[tuple[int, float]]] = [[]]
    for index, value in enumerate(values):
        if value is None:
            runs.append([])
        else:
            runs[-1].append((index, value))
    return [run for run in runs if run]


class _Plot:
    """The geometry of a chart: margins, scales, axes and legend."""

    LEFT, RIGHT, TOP, BOTTOM = 64, 12, 24, 40

    def __init__(self, width: int, height: int, buckets: int, top: float) -> None:
        self.width, self.height, self.top = width, height, top
        self.inner_width = width - self.LEFT - self.RIGHT
        self.inner_height = height - self.TOP - self.BOTTOM
        self.step = self.inner_width / max(buckets, 1)

    def x(self, index: int) -> float:
        return self.LEFT + self.step * (index + 0.5)

    def y(self, value: float) -> float:
        return self.TOP + self.inner_height * (1 - min(max(value, 0.0), self.top) / self.top)

    def frame(self, unit: str) -> str:
        ticks = []
        for fraction in (0.0, 0.25, 0.5, 0.75, 1.0):
            value = self.top * fraction
            y = self.y(value)
            ticks.append(
                f'<line x1="{self.LEFT}" x2="{self.width - self.RIGHT}" y1="{y:.1f}"'
                f' y2="{y:.1f}" stroke="#e0e0e0"/>'
                f'<text x="{self.LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{value:.3g}</text>'
            )
        return "".join(ticks) + (f'<text x="{self.LEFT}" y="12" class="unit">{escape(unit)}</text>')

    def x_labels(self, labels: Sequence[str]) -> str:
        every = max(len(labels) // 8, 1)
        return "".join(
            f'<text x="{self.x(i):.1f}" y="{self.height - self.BOTTOM + 16}"'
            f' text-anchor="middle">{escape(label)}</text>'
            for i, label in enumerate(labels)
            if i % every == 0
        )

    def legend(self, names: Sequence[str], colours: Mapping[str, str]) -> str:
        parts = []
        for i, name in enumerate(names):
            x = self.LEFT + i * 100
            y = self.height - 8
            parts.append(
                f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colours.get(name, "#333")}"/>'  # noqa: E501
                f'<text x="{x + 14}" y="{y}">{escape(name)}</text>'
            )
        return "".join(parts)

    def svg(self, body: str) -> str:
        return (
            f'<svg class="chart" viewBox="0 0 {self.width} {self.height}" width="100%"'
            f' role="img" font-size="11">{body}</svg>'
        )
