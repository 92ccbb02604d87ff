"""The plots of ``fairagents bench run``: service over time, the service gap over time, metrics per policy."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from fairagents.metrics import Charge, RequestRecord, backlog_intervals
from fairagents.simulation import SimResult

__all__ = ["PLOTS", "service_gap_over_time", "write_plots"]

#: The files :func:`write_plots` writes.
PLOTS = ("service.png", "gap.png", "metrics.png")

#: Apps ``service.png`` draws a line each; past this many, the least served are drawn as one band.
SERVICE_LINES = 8

#: The bars of ``metrics.png``: ``(metric, title)``; a metric no policy has a value of gets no panel.
METRIC_BARS = (("slo_violation_rate", "SLO violation rate"), ("ttft_p99", "TTFT p99 (s)"), ("jain", "Jain's index"),
               ("goodput", "goodput"), ("esg", "ESG (normalised)"))


def service_gap_over_time(
    records: Iterable[RequestRecord], charges: Iterable[Charge], weights: Mapping[str, float]
) -> list[tuple[float, float]]:
    """``(t, gap)`` steps: the largest service gap between two backlogged apps over any interval ending by ``t``.

    The time-resolved :func:`~fairagents.metrics.max_service_gap` (``key="app"``): its last
    value is that maximum. Weight-normalised service, in unified tokens.

    Examples:
        >>> from fairagents import Outcome
        >>> from fairagents.bench.plots import service_gap_over_time
        >>> from fairagents.metrics import Charge, RequestRecord
        >>> recs = [RequestRecord(i, a, "t", "m", 0.0, 10.0, 10.0, 11.0, 1, 1, Outcome.FINISHED)
        ...         for i, a in [("1", "x"), ("2", "y")]]
        >>> service_gap_over_time(recs, [Charge(1.0, "x", "t", 5.0), Charge(2.0, "y", "t", 2.0)], {"x": 1.0, "y": 1.0})
        [(0.0, 0.0), (1.0, 5.0)]
    """
    records = list(records)
    backlog = backlog_intervals(records, "app")
    events: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for c in charges:
        events[c.app].append((c.time, c.amount))
    series = {}
    for app, items in events.items():
        items.sort(key=lambda e: e[0])
        series[app] = ([t for t, _ in items], list(itertools.accumulate(a for _, a in items)))

    def served(app: str, t: float, inclusive: bool) -> float:
        if app not in series:
            return 0.0
        times, cumulative = series[app]
        i = (bisect.bisect_right if inclusive else bisect.bisect_left)(times, t)
        return cumulative[i - 1] / weights[app] if i else 0.0

    steps: list[tuple[float, float]] = []
    for x, y in itertools.combinations(sorted(backlog), 2):
        for start, end in _overlap(backlog[x], backlog[y]):
            points = {start, end}
            for app in (x, y):
                times = series.get(app, ([], []))[0]
                points.update(times[bisect.bisect_left(times, start):bisect.bisect_right(times, end)])
            hi = lo = served(x, start, False) - served(y, start, False)
            for t in sorted(points):
                d = served(x, t, True) - served(y, t, True)
                hi, lo = max(hi, d), min(lo, d)
                steps.append((t, hi - lo))
    out = [(0.0, 0.0)]
    for t, gap in sorted(steps):
        if gap > out[-1][1]:
            out.append((t, gap) if t > out[-1][0] else (out.pop()[0], gap))
    return out


def _overlap(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> Iterator[tuple[float, float]]:
    i = j = 0
    while i < len(xs) and j < len(ys):
        start, end = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if start < end:
            yield start, end
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1


def write_plots(folder: Path, summary: Mapping[str, Any], results: Mapping[str, SimResult]) -> list[Path]:
    """Write ``service.png``, ``gap.png`` and ``metrics.png`` into ``folder``; return their paths.

    ``summary`` is :func:`~fairagents.bench.suite.run_scenario`'s result and ``results``
    each policy's run. Drawn on matplotlib's Agg canvas (no display, no global state).
    ``metrics.png`` has a panel per metric of :data:`METRIC_BARS` that has a value (a
    scenario without SLOs has no SLO panels); ``service.png`` bands the apps past
    :data:`SERVICE_LINES`.

    Examples:
        >>> import tempfile, fairagents as fa
        >>> from pathlib import Path
        >>> from fairagents.bench.plots import write_plots
        >>> from fairagents.simulation import Workload, simulate
        >>> work = Workload().burst(fa.Agent("t", fa.App("a")), "m", n=2, prompt=8, output=4)
        >>> result = simulate(work, "hmfs", {"m": fa.engines.SimEngine(fa.ModelProfile(4096, 1))})
        >>> summary = {"policies": {"hmfs": {"slo_violation_rate": 0.0, "ttft_p99": 0.1, "jain": 1.0,
        ...                                  "goodput": 1.0, "esg": 1.0}}}
        >>> with tempfile.TemporaryDirectory() as d:
        ...     [p.name for p in write_plots(Path(d), summary, {"hmfs": result})]
        ['service.png', 'gap.png', 'metrics.png']
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    written = []
    panels = max(1, len(_metric_panels(summary, results)))
    panel = 8.0 if _legend_beside(results) else 5.5
    for name, draw, size in (("service.png", _plot_service, (panel * min(len(results), 3), 3.6 * _rows(results))),
                             ("gap.png", _plot_gap, (8.0, 4.5)),
                             ("metrics.png", _plot_metrics, (panels * max(3.2, 0.35 * len(results)), 3.8))):
        fig = Figure(figsize=size)
        FigureCanvasAgg(fig)
        draw(fig, summary, results)
        fig.tight_layout()
        fig.savefig(folder / name, dpi=100)
        written.append(folder / name)
    return written


def _rows(results: Mapping[str, SimResult]) -> int:
    return math.ceil(len(results) / 3)


def _plot_service(fig: Any, summary: Mapping[str, Any], results: Mapping[str, SimResult]) -> None:
    """Each app's cumulative service over its weight, one panel per policy, with a legend.

    Up to :data:`SERVICE_LINES` apps get a line each. With more, the ``SERVICE_LINES - 1``
    most served (service over weight at the end) keep theirs and the others are one band,
    from the least to the most served of them at each moment, with their mean as a line.
    """
    for k, (name, result) in enumerate(results.items()):
        ax = fig.add_subplot(_rows(results), min(len(results), 3), k + 1)
        curves = _service_curves(result)
        ranked = sorted(curves, key=lambda app: (-curves[app][1][-1], app))
        drawn = sorted(ranked) if len(ranked) <= SERVICE_LINES else ranked[:SERVICE_LINES - 1]
        for app in drawn:
            times, ys = curves[app]
            keep = list(range(0, len(times), max(1, len(times) // 2000)))  # a few thousand points draw the curve
            if keep[-1] != len(times) - 1:
                keep.append(len(times) - 1)
            ax.step([times[i] for i in keep] + [result.end], [ys[i] for i in keep] + [ys[-1]], where="post",
                    label=app, linewidth=1)
        others = [app for app in ranked if app not in drawn]
        if others:
            grid = [result.end * i / 400 for i in range(401)]
            at = [[_value_at(curves[app], t) for t in grid] for app in others]
            columns = list(zip(*at, strict=True))
            ax.fill_between(grid, [min(c) for c in columns], [max(c) for c in columns], step="post", color="0.6",
                            alpha=0.35, linewidth=0, label=f"{len(others)} other apps: least to most served")
            ax.step(grid, [sum(c) / len(c) for c in columns], where="post", color="0.35", linewidth=1,
                    linestyle="--", label=f"{len(others)} other apps: mean")
        ax.set_title(f"{name}: service per app")
        ax.set_xlabel("seconds")
        ax.set_ylabel("service / weight (unified tokens)")
        ax.grid(alpha=0.3)
        if _legend_beside(results):
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
        else:
            ax.legend(fontsize="small", loc="upper left")


def _legend_beside(results: Mapping[str, SimResult]) -> bool:
    """Whether ``service.png``'s legends go beside the panels: more lines than fit over the curves."""
    return max((len(r.app_weights()) for r in results.values()), default=0) > 4


def _service_curves(result: SimResult) -> dict[str, tuple[list[float], list[float]]]:
    """Each app's cumulative service over its weight: ``(times, values)``, starting at ``(0, 0)``."""
    weights = result.app_weights()
    per_app: dict[str, list[Charge]] = defaultdict(list)
    for c in result.charges:
        per_app[c.app].append(c)
    curves = {}
    for app, weight in weights.items():
        charges = sorted(per_app.get(app, []), key=lambda c: c.time)
        curves[app] = ([0.0] + [c.time for c in charges],
                       [0.0, *itertools.accumulate(c.amount / weight for c in charges)])
    return curves


def _value_at(curve: tuple[list[float], list[float]], t: float) -> float:
    times, values = curve
    return values[bisect.bisect_right(times, t) - 1]


def _plot_gap(fig: Any, summary: Mapping[str, Any], results: Mapping[str, SimResult]) -> None:
    """The largest service gap between backlogged apps up to each moment, a line per policy, and 2U."""
    ax = fig.add_subplot()
    for name, result in results.items():
        steps = service_gap_over_time(result.records, result.charges, result.app_weights())
        ax.step([t for t, _ in steps] + [result.end], [g for _, g in steps] + [steps[-1][1]], where="post", label=name)
    ax.axhline(2 * max(r.bound for r in results.values()), color="black", linestyle="--", linewidth=1, label="2U")
    ax.set_title("largest service gap between backlogged apps, up to t")
    ax.set_xlabel("seconds")
    ax.set_ylabel("unified tokens (weight-normalised)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def _metric_panels(summary: Mapping[str, Any], names: Iterable[str]) -> list[tuple[str, str]]:
    """The bars of :data:`METRIC_BARS` that some policy has a value of (no SLOs: no SLO panels)."""
    names = list(names)
    return [(key, title) for key, title in METRIC_BARS
            if any(summary["policies"][n].get(key) is not None for n in names)]


def _plot_metrics(fig: Any, summary: Mapping[str, Any], results: Mapping[str, SimResult]) -> None:
    """A bar chart per metric that has a value, a bar per policy."""
    names = list(results)
    panels = _metric_panels(summary, names)
    if not panels:
        fig.text(0.5, 0.5, "no metric has a value", ha="center", va="center")
    for k, (key, title) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        values = [summary["policies"][n].get(key) for n in names]
        bars = ax.bar(names, [math.nan if v is None else v for v in values], color="tab:blue")
        ax.bar_label(bars, labels=["—" if v is None else f"{v:.3g}" for v in values], fontsize="small")  # 0 shows
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=90)
        ax.grid(axis="y", alpha=0.3)
