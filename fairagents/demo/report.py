"""What a run of the demo measured, and how it is told: standings per device, tables, the plot."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from fairagents.demo.load import AGENTS, APPS, BACKLOGGED
from fairagents.metrics import backlog_intervals, entitlements, percentile
from fairagents.policies.pooled import EngineTally
from fairagents.records import RequestRecord
from fairagents.request import Outcome
from fairagents.stats import Stats

__all__ = ["DemoRun", "Row", "disagreement", "plot", "standings", "table", "worst_gap"]


@dataclass
class DemoRun:
    """What one policy's run measured (times in seconds since the load started)."""

    policy: str
    stats: Stats | None
    """The arbiter's stats after the run (``None`` for a simulated run)."""
    charges: list[tuple[float, str, str, float, str]]
    """Every charge: (time, app, agent, unified tokens, model)."""
    records: list[RequestRecord]
    """Every request's record, times shifted to the load's start."""
    devices: dict[str, str]
    """Each model's device."""
    tallies: dict[str, EngineTally]
    """What each in-engine model preempted."""
    simulated: bool = False
    """Whether the load ran on the simulator (:func:`simulated`)."""


@dataclass
class Row:
    """An app's or agent's standing on one device: shares of the device's service (an agent's: of its app's)."""

    name: str
    weight: float
    """What its weight entitles it to between clients that all want more."""
    entitled: float
    """What weighted max-min fairness entitles it to, given its demand (:func:`~fairagents.metrics.entitlements`)."""
    served: float
    """What it received."""
    backlogged: bool
    """Whether it had a request waiting at least :data:`BACKLOGGED` of the time (it wanted more)."""
    done: int
    waits: list[float]
    ttfts: list[float]
    agents: list[Row] = dataclasses.field(default_factory=list)

    @property
    def gap(self) -> float:
        """How far its share is from its entitlement, relative to the entitlement."""
        return abs(self.served - self.entitled) / self.entitled if self.entitled else 0.0


def standings(result: DemoRun, seconds: float) -> dict[str, list[Row]]:
    """Per device, each app with service there, and its agents there: weight, entitlement and share while the load ran."""
    weights = {(app, agent): w for app, agent, w, *_ in AGENTS}
    out: dict[str, list[Row]] = {}
    for device in dict.fromkeys(result.devices.values()):
        models = {m for m, d in result.devices.items() if d == device}
        served: dict[tuple[str, ...], float] = defaultdict(float)
        for t, app, agent, amount, model in result.charges:
            if t <= seconds and model in models:  # after the deadline only the flood's leftovers drain
                served[(app,)] += amount
                served[(app, agent)] += amount
        records = [r for r in result.records if r.model in models and r.arrival <= seconds]
        backlog = {key: sum(min(b, seconds) - a for a, b in spans if a < seconds) / seconds
                   for key, spans in backlog_intervals(records, key="agent").items()}
        wants = {key: share >= BACKLOGGED for key, share in backlog.items()}
        apps = [app for app in APPS if served[(app,)] > 0]
        if not apps:
            continue
        # an app wants more when one of its agents does (a request of one of its many callers waiting for its
        # first step, now and then, is no demand for more)
        app_wants = {a: any(w for key, w in wants.items() if key.split("/", 1)[0] == a) for a in apps}
        app_share = entitlements({a: served[(a,)] for a in apps}, {a: APPS[a] for a in apps}, app_wants)
        total = sum(served[(a,)] for a in apps)
        rows = []
        for app in apps:
            agents = [agent for a, agent, *_ in AGENTS if a == app and served[(app, agent)] > 0]
            agent_share = entitlements({g: served[(app, g)] for g in agents}, {g: weights[(app, g)] for g in agents},
                                       {g: wants.get(f"{app}/{g}", False) for g in agents})
            row = _row(app, APPS[app] / sum(APPS[a] for a in apps), app_share[app], served[(app,)] / total,
                       app_wants[app], [r for r in records if r.app == app])
            row.agents = [_row(g, weights[(app, g)] / sum(weights[(app, x)] for x in agents), agent_share[g],
                               served[(app, g)] / served[(app,)], wants.get(f"{app}/{g}", False),
                               [r for r in records if r.app == app and r.agent == g]) for g in agents]
            rows.append(row)
        out[device] = rows
    return out


def _row(name: str, weight: float, entitled: float, served: float, backlogged: bool,
         records: list[RequestRecord]) -> Row:
    done = [r for r in records if r.outcome is Outcome.FINISHED]
    return Row(name, weight, entitled, served, backlogged, len(done),
               [r.dispatched - r.arrival for r in done if r.dispatched is not None],
               [r.first_token - r.arrival for r in done if r.first_token is not None])


def disagreement(rows: dict[str, list[Row]], predicted: dict[str, list[Row]]) -> tuple[float, str]:
    """The largest difference between two runs' shares, over every app and agent of every device, and whose it is.

    Shares are fractions (an agent's, of its app's); a client served in one run and not
    the other differs by its whole share.
    """
    def shares(standing: dict[str, list[Row]]) -> dict[str, float]:
        out = {}
        for device, apps in standing.items():
            for app in apps:
                out[f"{device}: {app.name}"] = app.served
                out.update({f"{device}: {app.name}/{agent.name}": agent.served for agent in app.agents})
        return out

    a, b = shares(rows), shares(predicted)
    return max(((abs(a.get(k, 0.0) - b.get(k, 0.0)), k) for k in a.keys() | b.keys()), default=(0.0, ""))


def worst_gap(rows: dict[str, list[Row]]) -> float:
    """The largest gap between a share and its entitlement, over every app and agent of every device."""
    return max((r.gap for device in rows.values() for app in device for r in (app, *app.agents)), default=0.0)


def table(result: DemoRun, seconds: float, device: str, rows: list[Row]) -> Table:
    """One device's apps and agents (with their model): weight, entitlement and share of its service, latencies.

    For image generation, TTFT is the time to the first denoising step. The caption gives
    the unified tokens served and the requests done on the device, and its engines' preemptions.
    """
    models = {f"{app}/{agent}": model for app, agent, _, _, model, *_ in AGENTS}
    on_device = sorted(m for m, d in result.devices.items() if d == device)
    t = Table(title=f"{'SIMULATED ' if result.simulated else ''}policy {result.policy} — device {device!r} "
                    f"({', '.join(on_device)})")
    for column in ("app / agent", "weight", "entitled", "served", "done", "wait p50", "wait p99", "TTFT p50",
                   "TTFT p99"):
        t.add_column(column, justify="left" if column == "app / agent" else "right")
    for app in rows:
        t.add_row(f"[bold]{app.name}[/]", *_cells(app))
        for agent in app.agents:
            key = f"{app.name}/{agent.name}"
            t.add_row(f"  {agent.name} [dim]({models[key]})[/]", *_cells(agent))
    total = sum(a for time, _, _, a, m in result.charges if time <= seconds and m in on_device)
    done = sum(app.done for app in rows)
    caption = (f"served {total:,.0f} unified tokens in {seconds:g} s, {done} requests done; largest gap to an "
               f"entitlement {worst_gap({device: rows}):.0%}")
    for model in on_device:
        tally = result.tallies.get(model)
        if tally is not None and tally.preemptions:
            caption += (f"; {model}: {tally.preemptions} preempted ({tally.fair_preemptions} for fairness), "
                        f"recompute tax {tally.recompute_tax:.1%}")
    t.caption = caption
    return t


def _cells(row: Row) -> list[str]:
    mark = "" if row.backlogged else " [dim]·[/]"
    return [f"{row.weight:.0%}", f"{row.entitled:.0%}{mark}", f"{row.served:.0%}", str(row.done),
            f"{percentile(row.waits, 50):.2f}s", f"{percentile(row.waits, 99):.2f}s",
            f"{percentile(row.ttfts, 50):.2f}s", f"{percentile(row.ttfts, 99):.2f}s"]


def plot(runs: dict[str, DemoRun], seconds: float, out: Path) -> Path:
    """Each app's share of the LLM's device over time, against its entitlement (dotted), one panel per policy, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), sharey=True, squeeze=False)
    for ax, (policy, result) in zip(axes[0], runs.items(), strict=True):
        device = result.devices["chat"]
        entitled = {row.name: row.entitled for row in standings(result, seconds).get(device, [])}
        totals: dict[str, float] = defaultdict(float)
        series: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
        for t, app, _, amount, model in sorted(result.charges):
            if result.devices.get(model) != device or t > seconds:
                continue
            totals[app] += amount
            everyone = sum(totals.values())
            for name in APPS:
                series[name][0].append(t)
                series[name][1].append(totals[name] / everyone)
        for i, app in enumerate(APPS):
            color = f"C{i}"
            xs, ys = series.get(app, ([], []))
            ax.plot(xs, ys, color=color, label=f"{app} (weight {APPS[app]:g})")
            if app in entitled:
                ax.axhline(entitled[app], color=color, linestyle=":", linewidth=1.5)
        ax.set_title(f"policy {policy}: share of device {device!r}")
        ax.set_xlabel("seconds")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("share of service so far (dotted: entitled)")
    axes[0][-1].legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
