"""Runs of agent workflows under several policies: how long a run takes, how many complete, who gets served.

What the user of an agent graph feels is how long a *run* takes (one invocation: a
chain of model calls, often fanning out and joining at a barrier), so this measures
runs, not requests. In the closed-loop scenarios each app has users that start a run,
wait for it to complete and start the next, for ``seconds``; in the open-loop ones an
app's runs arrive as a stream (Poisson, or in bursts) whether or not the last has ended,
as the requests of many independent users do. A run is stages of calls
(:class:`~fairagents.simulation.Shape`); a stage's calls arrive together when the
previous stage has fully finished, and every call carries the run's id. The scenarios:

- ``chains``: runs of 1 or 6 calls in a chain (12 users), next to an app of long requests;
- ``fanout``: 70 % single-call runs, 30 % a fan-out of 16 parallel calls then a join
  (12 users), next to an app of long requests;
- ``mixed``: short single calls, 3-call chains and long fan-outs in one app, next to long requests;
- ``weighted``: two apps of weights 2 and 1, both running single calls, chains and fan-outs;
- ``flood``: one app with 48 users of fan-outs and single calls next to a quiet app of 3 users;
- ``shared``: one node of one app serving single questions (8 users) and maps over 96 documents (2 users);
- ``stream`` (open loop): runs of a plan node that sends K parallel calls to a worker node
  (70 % K = 1, 30 % K = 16) arriving as a Poisson stream, next to a backlogged app of long requests;
- ``bursts`` (open loop): the same runs arriving in bursts (a burst every 5 s), next to the same app.

``users`` scales every scenario's load: closed-loop users, and open-loop arrival rates.

Per scenario and policy it reports, by run class (``app/label``), the runs completed and
their completion time (mean and p95); the runs completed per second within ``seconds``;
each app's share of the service while every app was backlogged (a call of it waiting in
the queue) and while every app had a run in progress, against its weight; and Jain's
index over the apps' weight-normalised service while backlogged. It runs on the
simulator (:func:`~fairagents.simulation.simulate_workflows`, deterministic for a seed,
the same runs under every policy; its engine schedules by the policy as the default
serving path's does) or, with ``real=True``, on the embedded engine through the arbiter
in real time, each call sent with ``run=`` its run id.

Examples:
    >>> from fairagents.bench import workflows
    >>> result = workflows.run(scenarios=["chains"], policies=["fcfs"], seconds=4, users=0.5)
    >>> cell = result["scenarios"][0]["results"]["fcfs"]
    >>> cell["runs"] > 0 and 0 < cell["jain"] <= 1
    True
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from fairagents.bench.workflows_real import MODEL, run_real
from fairagents.cost import ModelProfile
from fairagents.engines.sim import SimEngine
from fairagents.errors import InvalidParameterError
from fairagents.identity import Agent, App
from fairagents.metrics import Charge, backlog_intervals, jain_index, percentile
from fairagents.policies import DEFAULT_POLICY, POLICIES
from fairagents.simulation import Call, Shape, SimResult, Workflows, simulate_workflows

if TYPE_CHECKING:
    from fairagents.engines.base import Engine

__all__ = ["BASELINES", "MODEL", "OPEN_LOOP", "SCENARIOS", "STREAM_RATE", "default_policies", "render", "run",
           "run_scenario", "scenario", "summarize"]

#: Prompt and output lengths (tokens) of a short call, and of a long one.
SHORT, LONG = ((64, 256), (16, 64)), ((256, 512), (256, 512))


def _n(users: int, scale: float) -> int:
    """``users`` scaled by the load factor (at least one)."""
    return max(1, round(users * scale))


def _short(agent: Agent, n: int = 1, label: str | None = None) -> Shape:
    return Shape.chain(agent, MODEL, n, prompt=SHORT[0], output=SHORT[1], label=label)


def _fan(app: App, k: int, *, long: bool = False, label: str | None = None) -> Shape:
    prompt, output = LONG if long else SHORT
    return Shape.fanout(Agent("branch", app), Agent("join", app), MODEL, k, prompt=prompt, output=output, label=label)


def _batch(flows: Workflows, n: int, until: float) -> None:
    """The neighbour of several scenarios: an app whose runs are one long request each."""
    job = Agent("job", App("batch"))
    flows.users(Shape.chain(job, MODEL, prompt=LONG[0], output=LONG[1], label="long"), n=n, until=until, name="batch")


def _chains(flows: Workflows, scale: float, until: float) -> None:
    bot = Agent("bot", App("agents"))
    flows.users([(0.5, _short(bot)), (0.5, _short(bot, 6))], n=_n(12, scale), until=until, name="agents")
    _batch(flows, _n(4, scale), until)


def _fanout(flows: Workflows, scale: float, until: float) -> None:
    news = App("news")
    flows.users([(0.7, _short(Agent("entry", news))), (0.3, _fan(news, 16))], n=_n(12, scale), until=until, name="news")
    _batch(flows, _n(4, scale), until)


def _mixed(flows: Workflows, scale: float, until: float) -> None:
    app = App("assistant")
    bot = Agent("bot", app)
    deep = _fan(app, 4, long=True, label="deep")
    flows.users([(0.6, _short(bot, label="short")), (0.25, _short(bot, 3)), (0.15, deep)], n=_n(12, scale), until=until,
                name="assistant")
    _batch(flows, _n(4, scale), until)


def _weighted(flows: Workflows, scale: float, until: float) -> None:
    for name, weight in (("gold", 2.0), ("silver", 1.0)):
        app = App(name, weight=weight)
        mix = [(0.6, _short(Agent("bot", app))), (0.2, _short(Agent("bot", app), 3)), (0.2, _fan(app, 8))]
        flows.users(mix, n=_n(8, scale), until=until, name=name)


def _flood(flows: Workflows, scale: float, until: float) -> None:
    flood, quiet = App("flood"), App("quiet")
    flows.users([(0.5, _short(Agent("bot", flood))), (0.5, _fan(flood, 8))], n=_n(48, scale), until=until, name="flood")
    flows.users([(0.7, _short(Agent("bot", quiet))), (0.3, _short(Agent("bot", quiet), 3))], n=_n(3, scale),
                until=until, name="quiet")


def _shared(flows: Workflows, scale: float, until: float) -> None:
    app = App("research")
    worker = Agent("worker", app)  # one node: answers questions, and maps over documents for digests
    wide = Shape.fanout(worker, Agent("join", app), MODEL, 96, prompt=SHORT[0], output=SHORT[1], label="map96")
    flows.users(_short(worker, label="question"), n=_n(8, scale), until=until, name="askers")
    flows.users(wide, n=_n(2, scale), until=until, name="digests")


#: Runs per second of the open-loop scenarios at ``users=1`` (on the simulator's engine, about a third of its
#: service; scaled with ``users``).
STREAM_RATE = 0.4


def _plan(app: App, k: int) -> Shape:
    """A plan call, then ``k`` parallel calls of one worker node: ``"k<k>"``."""
    plan, worker = Agent("plan", app), Agent("worker", app)
    return Shape(f"k{k}", ((Call(plan, MODEL, *SHORT),), (Call(worker, MODEL, *SHORT),) * k))


def _plans(app: App) -> list[tuple[float, Shape]]:
    return [(0.7, _plan(app, 1)), (0.3, _plan(app, 16))]


def _stream(flows: Workflows, scale: float, until: float) -> None:
    flows.poisson(_plans(App("research")), rate=STREAM_RATE * scale, until=until)
    _batch(flows, _n(4, scale), until)


def _bursts(flows: Workflows, scale: float, until: float) -> None:
    mix, every = _plans(App("research")), 5.0
    size, t = max(1, round(STREAM_RATE * every * scale)), 0.5
    while t < until:
        for _ in range(size):
            flows.run(mix, at=t)
        t += every
    _batch(flows, _n(4, scale), until)


#: Scenario name → (one-line description, builder adding its users to a :class:`~fairagents.simulation.Workflows`).
SCENARIOS: dict[str, tuple[str, Callable[[Workflows, float, float], None]]] = {
    "chains": ("runs of 1 or 6 chained calls (12 users) next to long requests (4 users)", _chains),
    "fanout": ("70 % single calls, 30 % fan-out of 16 then a join (12 users) next to long requests (4 users)", _fanout),
    "mixed": ("short calls, 3-call chains and long fan-outs in one app (12 users) next to long requests", _mixed),
    "weighted": ("apps of weight 2 and 1 (8 users each): single calls, chains and fan-outs of 8", _weighted),
    "flood": ("an app of 48 users (fan-outs of 8, single calls) next to a quiet app of 3 users", _flood),
    "shared": ("one node serving single questions (8 users) and maps over 96 documents (2 users) in one app",
               _shared),
    "stream": ("open loop: plan → 1 (70 %) or 16 (30 %) worker calls, a Poisson stream of runs, next to long "
               "requests (4 users)", _stream),
    "bursts": ("open loop: the same runs in a burst every 5 s, next to long requests (4 users)", _bursts),
}
#: The scenarios whose runs arrive as a stream rather than from users waiting for their last run.
OPEN_LOOP = ("stream", "bursts")


def scenario(name: str, seconds: float = 60.0, *, users: float = 1.0, seed: int = 0) -> Workflows:
    """The runs of scenario ``name`` over ``seconds``; ``users`` scales their users (and open-loop arrival rates).

    Examples:
        >>> from fairagents.bench.workflows import scenario
        >>> [(g.name, g.n) for g in scenario("fanout", users=0.5).closed]
        [('news', 6), ('batch', 2)]
    """
    if name not in SCENARIOS:
        raise InvalidParameterError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
    if isinstance(users, bool) or not isinstance(users, int | float) or not users > 0:
        raise InvalidParameterError(f"users must be a factor > 0, got {users!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds < math.inf:
        raise InvalidParameterError(f"seconds must be a finite number > 0, got {seconds!r}")
    flows = Workflows(seed=seed)
    SCENARIOS[name][1](flows, float(users), float(seconds))
    return flows


def engines(seed: int = 0) -> dict[str, SimEngine]:
    """The simulated engine of every scenario: a batch of 8, 4,096 tokens of paged KV, ±5 % step jitter.

    Small on purpose, as a small GPU (or the embedded engine's 4 MiB KV cache) is: every
    scenario keeps it busy, so the order in which calls are served decides run times. It
    schedules by the policy itself, as the default serving path's engines do
    (``SimEngine(scheduler="fair")``: ordering, admission and fair preemption in the engine).
    """
    return {MODEL: SimEngine(ModelProfile(d_model=4096, n_layers=32), max_running=8, kv_capacity=4096, jitter=0.05,
                             seed=seed, kv="paged", scheduler="fair")}


#: The policies every run compares: the baseline, the paper's HMFS, and the default policy.
BASELINES = tuple(dict.fromkeys(("fcfs", "hmfs", DEFAULT_POLICY)))


def default_policies() -> list[str]:
    """:data:`BASELINES` and every built-in policy whose name says it knows runs."""
    return [*BASELINES, *sorted(p for p in POLICIES if "run" in p and p not in BASELINES)]


def run_scenario(name: str, policy: str, seconds: float = 60.0, *, users: float = 1.0, seed: int = 0) -> dict[str, Any]:
    """One scenario under one policy on the simulator, summarised (:func:`summarize`).

    Examples:
        >>> from fairagents.bench.workflows import run_scenario
        >>> cell = run_scenario("fanout", "hmfs", seconds=3, users=0.25)
        >>> sorted(cell["classes"])
        ['batch/long', 'news/fanout16', 'news/single']
    """
    flows = scenario(name, seconds, users=users, seed=seed)
    return summarize(simulate_workflows(flows, policy, engines(seed)), seconds)


def summarize(result: SimResult, seconds: float) -> dict[str, Any]:
    """What a policy did with runs over ``[0, seconds]``: completion times by class, runs per second, app shares.

    - ``classes``: ``app/label`` → ``{"runs", "mean", "p95"}`` (seconds; every run played; ``None``: no run);
    - ``by_app``: app → the same over its runs;
    - ``runs``, ``mean``, ``p95``: the same over every run;
    - ``runs_per_s``: app (and ``"total"``) → runs completed by ``seconds``, per second;
    - ``apps``: app → ``{"weight", "share", "share_active"}``: its fraction of the service
      delivered while every app had a call waiting in the queue (``share``; ``None`` if
      they never all did), and while every app had a run in progress (``share_active``);
    - ``backlogged_s``, ``active_s``: how long those windows were;
    - ``jain``: Jain's index over the apps' weight-normalised service while backlogged
      (while active if never all backlogged).
    """
    runs, weights = result.runs, result.app_weights()
    by_class: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        by_class[f"{r.app}/{r.label}"].append(r.duration)
    apps = sorted({r.app for r in runs} | set(weights))
    horizon = (0.0, seconds)
    queued = [_clip(backlog_intervals(result.records, "app").get(a, []), horizon) for a in apps]
    active = [_clip(_merge([(r.start, r.end) for r in runs if r.app == a]), horizon) for a in apps]
    both_queued, both_active = _common(queued), _common(active)
    series = _series(result.charges)
    served = [_served(series.get(a), both_queued) for a in apps]
    served_active = [_served(series.get(a), both_active) for a in apps]
    jain_of = served if sum(served) > 0 else served_active
    return {
        "classes": {c: _times(d) for c, d in sorted(by_class.items())},
        "by_app": {a: _times([r.duration for r in runs if r.app == a]) for a in apps},
        **_times([r.duration for r in runs]),
        "runs_per_s": {"total": sum(r.end <= seconds for r in runs) / seconds,
                       **{a: sum(r.end <= seconds for r in runs if r.app == a) / seconds for a in apps}},
        "apps": {a: {"weight": weights.get(a, 1.0), "share": _share(served, i),
                     "share_active": _share(served_active, i)} for i, a in enumerate(apps)},
        "backlogged_s": sum(e - s for s, e in both_queued),
        "active_s": sum(e - s for s, e in both_active),
        "jain": jain_index(s / weights.get(a, 1.0) for a, s in zip(apps, jain_of, strict=True)),
    }


def _times(durations: Sequence[float]) -> dict[str, Any]:
    if not durations:
        return {"runs": 0, "mean": None, "p95": None}
    return {"runs": len(durations), "mean": statistics.fmean(durations), "p95": percentile(durations, 95)}


def _share(served: list[float], i: int) -> float | None:
    total = sum(served)
    return served[i] / total if total > 0 else None


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _clip(intervals: list[tuple[float, float]], window: tuple[float, float]) -> list[tuple[float, float]]:
    return [(max(s, window[0]), min(e, window[1])) for s, e in intervals if e > window[0] and s < window[1]]


def _common(per_app: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The spans in which every app's intervals overlap."""
    common = per_app[0] if per_app else []
    for other in per_app[1:]:
        out, i, j = [], 0, 0
        while i < len(common) and j < len(other):
            start, end = max(common[i][0], other[j][0]), min(common[i][1], other[j][1])
            if start < end:
                out.append((start, end))
            if common[i][1] < other[j][1]:
                i += 1
            else:
                j += 1
        common = out
    return common


def _series(charges: Sequence[Charge]) -> dict[str, tuple[list[float], list[float]]]:
    """Per app, charge times and the cumulative service up to each."""
    events: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for c in charges:
        events[c.app].append((c.time, c.amount))
    out = {}
    for app, evs in events.items():
        evs.sort(key=lambda e: e[0])
        total, cumulative = 0.0, []
        for _, amount in evs:
            total += amount
            cumulative.append(total)
        out[app] = ([t for t, _ in evs], cumulative)
    return out


def _served(series: tuple[list[float], list[float]] | None, spans: list[tuple[float, float]]) -> float:
    """Service charged within the spans (closed: a dispatch that ends a backlog counts)."""
    if series is None:
        return 0.0
    times, cumulative = series
    total = 0.0
    for start, end in spans:
        lo, hi = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
        if hi > lo:
            total += cumulative[hi - 1] - (cumulative[lo - 1] if lo else 0.0)
    return total


def run(
    scenarios: Sequence[str] | None = None,
    policies: Sequence[str] | None = None,
    seconds: float | None = None,
    users: float | None = None,
    seed: int = 0,
    real: bool = False,
    out: str | None = None,
    engine: Engine | None = None,
) -> dict[str, Any]:
    """Every scenario under every policy, side by side.

    Returns ``{"seconds", "users", "seed", "engine", "policies", "scenarios"}``, each
    scenario ``{"name", "description", "users", "results": {policy: summarize(...)}}``.

    Args:
        scenarios: names from :data:`SCENARIOS` (default: all).
        policies: policy names (commas allowed); ``fcfs`` and ``hmfs`` always run, first
            (default: :func:`default_policies`).
        seconds: how long users start runs (default 60 simulated, 20 real).
        users: a factor on every scenario's users (default 1 simulated, 0.25 real).
        seed: the runs' seed (the same runs under every policy).
        real: run on a real engine through the arbiter, in real time, instead of the simulator.
        out: a file to write the JSON result to.
        engine: with ``real``, the engine to use (default: the embedded text model with 4 MiB of KV cache).
    """
    names = list(scenarios or SCENARIOS)
    for name in names:
        if name not in SCENARIOS:
            raise InvalidParameterError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
    chosen = _policies(policies)
    seconds = seconds if seconds is not None else 20.0 if real else 60.0
    users = users if users is not None else 0.25 if real else 1.0
    cells = []
    for name in names:
        flows = scenario(name, seconds, users=users, seed=seed)
        if real:
            results = run_real(flows, chosen, seconds, engine)
        else:
            results = {p: simulate_workflows(flows, p, engines(seed)) for p in chosen}
        cells.append({"name": name, "description": SCENARIOS[name][0],
                      "users": {g.name: g.n for g in flows.closed},
                      "results": {p: summarize(r, seconds) for p, r in results.items()}})
    result = {"seconds": seconds, "users": users, "seed": seed, "engine": "real" if real else "sim",
              "policies": chosen, "scenarios": cells}
    if out:
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return result


def _policies(policies: Sequence[str] | None) -> list[str]:
    if policies is None:
        return default_policies()
    names = list(BASELINES)
    for item in policies:
        for name in item.split(","):
            if name and name not in names:
                if name not in POLICIES and ":" not in name:
                    raise InvalidParameterError(f"unknown policy {name!r}; choose from {', '.join(sorted(POLICIES))}")
                names.append(name)
    return names


def render(result: dict[str, Any]) -> list[Table]:
    """Per scenario, run completion time by class and policy; then runs per second, app shares and Jain's index."""
    tables = []
    policies = result["policies"]
    where = "simulator" if result["engine"] == "sim" else "real engine"
    for cell in result["scenarios"]:
        table = Table(title=f"{cell['name']}: {cell['description']} ({where}, {result['seconds']:g} s) — "
                            "run completion time, mean / p95 (runs)")
        table.add_column("class")
        for p in policies:
            table.add_column(p, justify="right")
        classes = sorted({c for p in policies for c in cell["results"][p]["classes"]})
        apps = sorted({a for p in policies for a, t in cell["results"][p]["by_app"].items()
                       if sum(c.startswith(f"{a}/") for c in classes) > 1})  # an app of several classes: its runs
        for c in [*classes, *(f"{a}/*" for a in apps), "all"]:
            row = []
            for p in policies:
                cell_p = cell["results"][p]
                stats = cell_p if c == "all" else cell_p["by_app"].get(c[:-2]) if c.endswith("/*") else \
                    cell_p["classes"].get(c)
                row.append(f"{stats['mean']:.2f} / {stats['p95']:.2f} s ({stats['runs']})" if stats and stats["runs"]
                           else "")
            table.add_row(c, *row)
        tables.append(table)
    summary = Table(title=escape(f"Runs per second, app shares of service (weight) while backlogged [while active], "
                                 f"Jain's index ({where})"))
    for column in ("scenario", "policy", "runs/s", "shares", "backlogged", "Jain"):
        summary.add_column(column, justify="left" if column in ("scenario", "policy", "shares") else "right")
    for cell in result["scenarios"]:
        for p in policies:
            r = cell["results"][p]
            shares = escape(", ".join(f"{a} {_pct(s['share'])} [{_pct(s['share_active'])}] (w {s['weight']:g})"
                                      for a, s in r["apps"].items()))
            summary.add_row(cell["name"], p, f"{r['runs_per_s']['total']:.2f}", shares, f"{r['backlogged_s']:.1f} s",
                            f"{r['jain']:.3f}")
    tables.append(summary)
    return tables


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"
