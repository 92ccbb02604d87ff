"""The live fairness view behind ``GET /v1/fairness`` and the dashboard.

A snapshot of the arbiter's standing (per app and per agent: service in unified
tokens, share against weight share, queued, in flight, wait and TTFT percentiles),
plus each client's cumulative service sampled once a second, so that a page opened
late still draws the shares over the last minutes.

A fair share is owed only to a backlogged client. So each app and agent also says
whether its demand is met (``demand_met``: nothing of it waits for dispatch now) and
the fraction of the window's samples in which it was backlogged (``backlogged``).
Entitlements are shared among the *active* clients only (requests queued or running,
or waiting or served in the last ``window`` seconds): ``entitled_share`` is a client's
weight over its active peers' weights, ``recent_share`` its share of their service in
that window, and it is ``below_entitlement`` when it has requests waiting and falls
short by more than :data:`BELOW_TOLERANCE` of its entitlement.

Each app also has ``runs``: its runs of agent workflows (requests that name a run,
:mod:`fairagents.runs`): runs completed and active, the mean and 95th percentile of
their durations (first arrival to last end), their mean calls and service, and the
last few completed runs. An app's own view (``only``) shows only its own runs.

The snapshot is cached for ``max_age`` seconds and its JSON built in a thread, so many
viewers cost the event loop no more than one; the history is bounded
(:data:`HISTORY_POINTS` points of per-app sums; per-agent history for one app only).

Examples:
    >>> import fairagents as fa
    >>> from fairagents.server.fairness import FairnessView
    >>> arbiter = fa.Arbiter()
    >>> arbiter.app("driving", weight=2.0).agent("planner")
    AgentHandle(driving/planner)
    >>> view = FairnessView(arbiter)
    >>> view.sample()
    >>> driving = view.snapshot()["apps"]["driving"]
    >>> driving["weight"], driving["agents"]["planner"]["service"], driving["demand_met"], driving["entitled_share"]
    (2.0, 0.0, True, None)
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fairagents.labels import OTHER
from fairagents.runtime.arbiter import Arbiter
from fairagents.server.wire import finite
from fairagents.stats import ClientSnapshot, RunStats, Stats

__all__ = ["BELOW_TOLERANCE", "HISTORY_POINTS", "KEEP_AGENTS_EVERY", "OTHER", "FairnessView"]

#: How far (a fraction of its entitlement) a backlogged client's recent share may fall short before it counts as
#: below its entitlement: 50.0 % or 46 % against 50.0 % is the noise of a 30-second window, not a shortfall.
BELOW_TOLERANCE = 0.1

#: Most points of the service history in a body: longer histories are thinned.
HISTORY_POINTS = 300

_Key = tuple[str, str]
_Sample = tuple[float, dict[_Key, float] | None, frozenset[_Key], dict[str, float]]
_DeviceSample = tuple[float, dict[tuple[str, str], float], frozenset[tuple[str, str]]]

#: Past the entitlement window, one sample in this many keeps each agent's service (the others only each app's).
KEEP_AGENTS_EVERY = 10


class FairnessView:
    """Samples an arbiter's service over time and renders the ``/v1/fairness`` body.

    Args:
        arbiter: the arbiter to watch.
        interval: seconds between service samples.
        keep: seconds of samples kept.
        window: seconds over which a client counts as active and its ``recent_share`` is measured.
        max_age: seconds a stats snapshot is reused.
        clients: the ``(app, agent)`` pairs to sample; by default those in the arbiter's
            stats (costlier: give it when the caller keeps its own list).
        extra: per app and agent counts the arbiter does not keep (``rejected``), by
            ``(app, agent)``; read at each snapshot.
        models: per-model figures (in flight, limit, health), read at each snapshot.
        max_agents: agents listed by name per app; the rest are summed as :data:`OTHER`.
        clock: wall-clock time source in seconds.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.server.fairness import FairnessView
        >>> FairnessView(fa.Arbiter(), interval=0.5, keep=60).samples.maxlen
        120
    """

    def __init__(
        self,
        arbiter: Arbiter,
        *,
        interval: float = 1.0,
        keep: float = 600.0,
        window: float = 30.0,
        max_age: float = 0.5,
        clients: Callable[[], Iterable[tuple[str, str]]] | None = None,
        extra: Callable[[], Mapping[tuple[str, str], Mapping[str, int]]] | None = None,
        models: Callable[[], dict[str, Any]] | None = None,
        clock: Callable[[], float] = time.time,
        max_agents: int = 64,
    ) -> None:
        self.arbiter = arbiter
        self.max_agents = max_agents
        self.interval = interval
        self.window = window
        self.max_age = max_age
        self.clock = clock
        self.started = clock()
        self.samples: deque[_Sample] = deque(maxlen=max(2, int(keep / interval)))
        """``(time, cumulative service by (app, agent), the (app, agent) pairs with requests queued, service by app)``.

        Past the ``window``, only one sample in :data:`KEEP_AGENTS_EVERY` keeps its
        per-agent figures (the others ``None``): memory grows with the agents far less."""
        self.device_samples: deque[_DeviceSample] = deque(maxlen=int(window / interval) + 2)
        """``(time, cumulative service by (device, app), the (device, app) pairs with requests queued)``, over the
        ``window``: each device's entitlements are shared among its active apps."""
        self._taken = 0
        self._clients = clients or (lambda: [tuple(k.split("/", 1)) for k in self.stats().agents])  # type: ignore[misc]
        self._extra = extra or dict
        self._models = models or dict
        self._cached: tuple[float, Stats] | None = None
        self._bodies: dict[tuple[Any, ...], tuple[float, asyncio.Future[bytes]]] = {}
        self.hidden: set[_Key] = set()
        """Agents forgotten after their idle time: left out of samples and bodies (see ``Gateway``)."""

    def stats(self) -> Stats:
        """The arbiter's stats, at most ``max_age`` seconds old."""
        now = self.clock()
        if self._cached is None or now - self._cached[0] > self.max_age:
            self._cached = (now, self.arbiter.stats())
        return self._cached[1]

    def sample(self) -> None:
        """Record every agent's cumulative service now, and which agents are backlogged (cheap: no percentiles).

        An agent is backlogged while a request of it waits for dispatch, as ``queued``
        counts it in :meth:`~fairagents.Arbiter.stats`.

        Examples:
            >>> import fairagents as fa
            >>> from fairagents.server.fairness import FairnessView
            >>> arbiter = fa.Arbiter()
            >>> arbiter.app("driving").agent("planner")
            AgentHandle(driving/planner)
            >>> view = FairnessView(arbiter, clock=lambda: 5.0)
            >>> view.sample()
            >>> view.samples[-1]
            (5.0, {('driving', 'planner'): 0.0}, frozenset(), {'driving': 0.0})
        """
        ledger = self.arbiter.ledger
        waiting = frozenset(t.request.agent_key for t in self.arbiter.dispatcher.tickets() if t.dispatched is None)
        served: dict[_Key, float] = {}
        by_app: dict[str, float] = {}  # forgotten agents' service included: an app's total does not drop
        for a, t in self._clients():
            v = ledger.service_of(a, t)
            by_app[a] = by_app.get(a, 0.0) + v
            if (a, t) not in self.hidden:
                served[(a, t)] = v
        now = self.clock()
        self.samples.append((now, served, waiting, by_app))
        device_of = {name: m.device for name, m in self.arbiter.pool.models.items()}
        on_device = {(device, app): v for device, served in ledger.service_by_device(device_of).items()
                     for app, v in served.items()}
        queued = frozenset((device_of[t.request.model], t.request.app) for t in self.arbiter.dispatcher.tickets()
                           if t.dispatched is None and t.request.model in device_of)
        self.device_samples.append((now, on_device, queued))
        self._taken += 1
        aged = len(self.samples) - 2 - int(self.window / self.interval)  # the sample that just left the window
        number = self._taken - len(self.samples) + aged
        if aged >= 0 and number % KEEP_AGENTS_EVERY:
            t, _, was_waiting, apps = self.samples[aged]
            self.samples[aged] = (t, None, was_waiting, apps)

    def forget(self, app: str, agent: str) -> None:
        """Leave an agent out of later samples and bodies (its past samples age out)."""
        self.hidden.add((app, agent))

    def recall(self, app: str, agent: str) -> None:
        """Show a forgotten agent again (it came back)."""
        self.hidden.discard((app, agent))

    @property
    def taken(self) -> int:
        """Samples taken so far."""
        return self._taken

    def drop(self, app: str, agent: str | None, since: int) -> None:
        """Take an undeclared agent (``None``: app) out of the samples taken after the first ``since``."""
        first = max(0, len(self.samples) - (self._taken - since))
        for i in range(first, len(self.samples)):
            t, served, waiting, by_app = self.samples[i]
            if agent is not None and served is not None and (app, agent) in served:
                served = {k: v for k, v in served.items() if k != (app, agent)}  # new dicts: bodies may read the old
            if agent is None and app in by_app:
                by_app = {k: v for k, v in by_app.items() if k != app}
            self.samples[i] = (t, served, waiting, by_app)

    async def run(self) -> None:
        """Sample every ``interval`` seconds until cancelled."""
        while True:
            self.sample()
            await asyncio.sleep(self.interval)

    def snapshot(self, history: float | None = None, *, draining: bool = False, app: str | None = None,
                 only: str | None = None) -> dict[str, Any]:
        """The ``/v1/fairness`` body; ``history`` limits the samples to the last seconds.

        Each app and agent has, besides its counts, ``demand_met``: true when none of
        its requests waits for dispatch now (its running requests are being served),
        so a share below its entitlement is all it asked for; and ``backlogged``: the
        fraction of the samples in the window in which it had requests waiting
        (``None`` before the first sample). Fair schedulers owe the entitled share only
        to backlogged clients. ``active``, ``entitled_share``, ``recent_share`` and
        ``below_entitlement`` follow the rule in the module docstring, over the last
        ``window`` seconds whatever ``history`` is.

        Examples:
            >>> import fairagents as fa
            >>> from fairagents.server.fairness import FairnessView
            >>> arbiter = fa.Arbiter()
            >>> arbiter.app("driving").agent("planner")
            AgentHandle(driving/planner)
            >>> view = FairnessView(arbiter)
            >>> planner = view.snapshot()["apps"]["driving"]["agents"]["planner"]
            >>> planner["queued"], planner["demand_met"], planner["backlogged"]
            (0, True, None)
        """
        return _build(self._gather(history, draining), app=app, only=only)

    async def body(self, history: float | None = None, *, draining: bool = False, app: str | None = None,
                   only: str | None = None) -> bytes:
        """:meth:`snapshot` as JSON bytes: numbers copied on the event loop, built in a thread, shared.

        Readers asking for the same body while it is built, or within ``max_age`` seconds
        after, get that one build.
        """
        key = (history, draining, app, only)
        now = self.clock()
        cached = self._bodies.get(key)
        if cached is not None and (not cached[1].done() or now - cached[0] <= self.max_age):
            return await asyncio.shield(cached[1])
        if len(self._bodies) >= 64:  # readers asking for many histories: keep only builds in progress
            self._bodies = {k: v for k, v in self._bodies.items() if not v[1].done()}
        inputs = self._gather(history, draining)
        built = asyncio.ensure_future(asyncio.to_thread(_dumps, inputs, app, only))
        self._bodies[key] = (now, built)
        return await asyncio.shield(built)

    def _gather(self, history: float | None, draining: bool) -> _Inputs:
        """What a body is built of, copied now (the arbiter's state may only be read on its event loop)."""
        now = self.clock()
        samples = list(self.samples)
        return _Inputs(
            stats=self.stats(), extra=dict(self._extra()), now=now, started=self.started, interval=self.interval,
            window=self.window, policy=self.arbiter.policy.name, draining=draining, models=self._models(),
            pool={"in_flight": self.arbiter.pool_running, "in_flight_limit": self.arbiter.pool_in_flight},
            samples=samples, shown=[s for s in samples if history is None or s[0] >= now - history],
            hidden=frozenset(self.hidden), max_agents=self.max_agents, device_samples=list(self.device_samples),
        )


@dataclass(frozen=True, slots=True)
class _Inputs:
    """The numbers of one ``/v1/fairness`` body, copied on the event loop."""

    stats: Stats
    extra: dict[_Key, Mapping[str, int]]
    now: float
    started: float
    interval: float
    window: float
    policy: str
    draining: bool
    models: dict[str, Any]
    pool: dict[str, Any]
    samples: list[_Sample]
    """All samples kept (the window of ``recent_share`` reads them whatever ``history`` is)."""
    shown: list[_Sample]
    """The samples within ``history``."""
    hidden: frozenset[_Key]
    max_agents: int
    device_samples: list[_DeviceSample]


def _dumps(inputs: _Inputs, app: str | None, only: str | None) -> bytes:
    body = _build(inputs, app=app, only=only)
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _build(inputs: _Inputs, *, app: str | None = None, only: str | None = None) -> dict[str, Any]:
    stats, extra, hidden = inputs.stats, inputs.extra, inputs.hidden
    by_app, by_agent = _backlogged(inputs.shown)
    shown_agents = [(tuple(key.split("/", 1)), agent) for key, agent in stats.agents.items()]
    shown_agents = [(k, a) for k, a in shown_agents if k not in hidden]
    rejected = _sum(extra)
    apps: dict[str, Any] = {}
    for name, c in stats.apps.items():  # every app, its agents all forgotten or not (apps are bounded by max_apps)
        apps[name] = {**_client(c, rejected.get(name, {}), by_app(name)), "agents": {},
                      "runs": _runs(stats.runs.get(name, _NO_RUNS))}
    for (app_name, agent_name), agent in shown_agents:
        if app_name in apps:
            apps[app_name]["agents"][agent_name] = _client(
                agent, extra.get((app_name, agent_name), {}), by_agent((app_name, agent_name))
            )
    _entitle(apps, *_recent(inputs))
    for c in apps.values():
        c["agents"] = _fold(c["agents"], inputs.max_agents)
    history = _history(inputs, app)
    devices = _devices(inputs)
    if only is not None:
        apps, history = _own(apps, history, only)
        devices = {d: {**v, "apps": _own_share(v["apps"], only)} for d, v in devices.items()}
    return {
        "object": "fairness",
        "time": inputs.now,
        "uptime_seconds": inputs.now - inputs.started,
        "policy": inputs.policy,
        "unit": "unified_tokens",
        "draining": inputs.draining,
        "models": inputs.models,
        "pool": inputs.pool,
        "entitlement": {"window_seconds": inputs.window, "tolerance": BELOW_TOLERANCE},
        "apps": apps,
        "devices": devices,
        "history": history,
    }


def _devices(inputs: _Inputs) -> dict[str, Any]:
    """Each device's service by app: its share, and over the ``window`` its recent share and entitlement.

    A device splits its own service: an app is active on it when it had requests queued
    for one of its models, or was served there, in the window; the active apps' weights
    share the device (``entitled_share``), as the apps' section shares the pool.
    """
    stats, start = inputs.stats, inputs.now - inputs.window
    base: dict[tuple[str, str], float] | None = None
    waited: set[tuple[str, str]] = set()
    for t, served, queued in inputs.device_samples:
        if t <= start or base is None:
            base = served
        if t >= start:
            waited |= queued
    devices = sorted(set(stats.devices) | {device for device, _ in waited})
    out: dict[str, Any] = {}
    for device in devices:
        served = dict(stats.devices.get(device, {}))
        for d, app in waited:
            if d == device:
                served.setdefault(app, 0.0)
        total = sum(served.values())
        recent = None if base is None else {app: max(0.0, s - base.get((device, app), 0.0)) for app, s in served.items()}
        recent_total = sum(recent.values()) if recent is not None else 0.0
        active = {app for app in served if (device, app) in waited or (recent is not None and recent[app] > 0)}
        weights = {app: stats.apps[app].weight if app in stats.apps else 1.0 for app in served}
        active_weight = sum(weights[app] for app in active)
        out[device] = {"service": total, "apps": {app: {
            "service": s, "share": s / total if total else 0.0, "active": app in active,
            "entitled_share": weights[app] / active_weight if app in active else None,
            "recent_share": recent[app] / recent_total if recent is not None and recent_total > 0 else None,
        } for app, s in sorted(served.items())}}
    return out


def _own_share(apps: dict[str, Any], only: str) -> dict[str, Any]:
    """An app's own key sees its own service on a device, and the others' summed as :data:`OTHER`."""
    others = [c for name, c in apps.items() if name != only]
    mine = {only: apps[only]} if only in apps else {}
    if others:
        mine[OTHER] = {**{k: sum(c[k] for c in others) for k in ("service", "share")},
                       "active": any(c["active"] for c in others)}
        for k in ("entitled_share", "recent_share"):
            values = [c[k] for c in others if c[k] is not None]
            mine[OTHER][k] = sum(values) if values else None
    return mine


def _recent(inputs: _Inputs) -> tuple[dict[_Key, float] | None, set[_Key]]:
    """Each agent's service over the last ``window`` seconds, and the agents that had requests waiting then.

    The service is measured from the last sample at or before the window's start
    (the first sample if none is that old); ``None`` before the first sample.
    """
    start = inputs.now - inputs.window
    base = None
    waited: set[_Key] = set()
    for sample in inputs.samples:
        if sample[1] is not None and (sample[0] <= start or base is None):
            base = sample
        if sample[0] >= start:
            waited |= sample[2]
    if base is None:
        return None, waited
    served = {}
    for key, agent in inputs.stats.agents.items():
        app, name = key.split("/", 1)
        served[(app, name)] = agent.service - base[1].get((app, name), 0.0)
    return served, waited


def _history(inputs: _Inputs, app: str | None) -> dict[str, Any]:
    """Per-app service over time, thinned to :data:`HISTORY_POINTS`; per agent only for ``app``."""
    samples = inputs.shown
    step = max(1, -(-len(samples) // HISTORY_POINTS))
    points = samples[::-1][::step][::-1]  # thinned from the newest, which is always kept
    apps = sorted({a for s in points for a in s[3]})
    keys = sorted({k for s in points if s[1] is not None for k in s[1] if k[0] == app}) if app is not None else []
    return {
        "interval_seconds": inputs.interval * step,
        "time": [round(s[0], 3) for s in points],
        "apps": {a: [round(s[3].get(a, 0.0), 4) for s in points] for a in apps},
        "agents": {f"{a}/{t}": [None if s[1] is None else round(s[1].get((a, t), 0.0), 4) for s in points]
                   for a, t in keys},
    }


def _own(apps: dict[str, Any], history: dict[str, Any], only: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``only``'s own key sees: its app, and every other app summed as :data:`OTHER`, unnamed."""
    others = [c for name, c in apps.items() if name != only]
    mine = {only: apps[only]} if only in apps else {}
    if others:
        mine[OTHER] = {**_aggregate(others), "runs": None}  # other apps' runs are theirs to see
    series = [v for name, v in history["apps"].items() if name != only]
    own_history = {k: v for k, v in history["apps"].items() if k == only}
    if series:
        own_history[OTHER] = [round(sum(point), 4) for point in zip(*series, strict=True)]
    agents = {k: v for k, v in history["agents"].items() if k.split("/", 1)[0] == only}
    return mine, {**history, "apps": own_history, "agents": agents}


def _fold(agents: dict[str, Any], most: int) -> dict[str, Any]:
    """At most ``most`` agents by name, the active and most served first; the others summed as :data:`OTHER`."""
    if len(agents) <= most:
        return agents
    order = sorted(agents, key=lambda name: (not agents[name]["active"], -agents[name]["service"], name))
    kept = {name: agents[name] for name in order[:most - 1]}
    return {**kept, OTHER: _aggregate([agents[name] for name in order[most - 1:]])}


def _aggregate(clients: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: sum(c[k] for c in clients) for k in (
        "weight", "weight_share", "service", "share", "queued", "in_flight", "done", "failed", "cancelled", "rejected")}
    entitled = [c["entitled_share"] for c in clients if c["entitled_share"] is not None]
    recent = [c["recent_share"] for c in clients if c["recent_share"] is not None]
    out.update(demand_met=out["queued"] == 0, backlogged=None, active=any(c["active"] for c in clients),
               entitled_share=sum(entitled) if entitled else None, recent_share=sum(recent) if recent else None,
               below_entitlement=False, wait_seconds={"p50": None, "p99": None},
               ttft_seconds={"p50": None, "p99": None}, agents={})
    return out


def _backlogged(samples: list[_Sample]) -> tuple[Callable[[str], float | None], Callable[[_Key], float | None]]:
    """Per app and per agent, the fraction of ``samples`` in which it had requests waiting (``None`` without samples)."""
    apps: Counter[str] = Counter()
    agents: Counter[_Key] = Counter()
    for _, _, waiting, _ in samples:
        agents.update(waiting)
        apps.update({a for a, _ in waiting})
    n = len(samples)
    return (lambda app: round(apps[app] / n, 4) if n else None), (lambda key: round(agents[key] / n, 4) if n else None)


def _entitle(apps: dict[str, Any], served: dict[_Key, float] | None, waited: set[_Key]) -> None:
    """Set each app's and agent's ``active``, ``entitled_share``, ``recent_share`` and ``below_entitlement``.

    ``served``: each agent's service over the window (``None``: not measured yet);
    ``waited``: the agents that had requests waiting in a sample of the window.
    """
    for name, app in apps.items():
        for agent_name, agent in app["agents"].items():
            key = (name, agent_name)
            agent["active"] = bool(agent["queued"] or agent["in_flight"] or key in waited
                                   or (served is not None and served.get(key, 0.0) > 0))
        app["active"] = bool(app["queued"] or app["in_flight"] or any(a["active"] for a in app["agents"].values()))
    recent = None if served is None else {
        name: sum(served.get((name, agent), 0.0) for agent in app["agents"]) for name, app in apps.items()}
    _shares(apps, recent)
    for name, app in apps.items():
        _shares(app["agents"], None if served is None else {agent: served.get((name, agent), 0.0)
                                                             for agent in app["agents"]})


def _shares(peers: dict[str, Any], recent: dict[str, float] | None) -> None:
    """Entitlements among the active ``peers`` (apps, or one app's agents), and their shares of ``recent`` service."""
    active_weight = sum(c["weight"] for c in peers.values() if c["active"])
    total = sum(max(0.0, v) for v in recent.values()) if recent is not None else 0.0
    for name, c in peers.items():
        entitled = c["weight"] / active_weight if c["active"] and active_weight > 0 else None
        share = max(0.0, recent[name]) / total if recent is not None and total > 0 else None
        c["entitled_share"], c["recent_share"] = entitled, share
        c["below_entitlement"] = (not c["demand_met"] and entitled is not None and share is not None
                                  and share < entitled * (1 - BELOW_TOLERANCE))


def _sum(extra: Mapping[tuple[str, str], Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """The counts of each app's agents summed per app, in one pass."""
    total: dict[str, dict[str, int]] = {}
    for (a, _), counts in extra.items():
        sums = total.setdefault(a, {})
        for k, v in counts.items():
            sums[k] = sums.get(k, 0) + v
    return total


_NO_RUNS = RunStats()


def _runs(r: RunStats) -> dict[str, Any]:
    return {
        "completed": r.completed,
        "active": r.active,
        "duration_seconds": {"mean": finite(r.duration_mean), "p95": finite(r.duration_p95)},
        "calls_mean": finite(r.calls_mean),
        "service_mean": finite(r.service_mean),
        "recent": [{"run": x.run, "duration_seconds": x.duration, "calls": x.calls, "service": x.service}
                   for x in r.recent],
    }


def _client(c: ClientSnapshot, extra: Mapping[str, int], backlogged: float | None) -> dict[str, Any]:
    return {
        "weight": c.weight,
        "weight_share": c.weight_share,
        "service": c.service,
        "share": c.share,
        "queued": c.queued,
        "in_flight": c.in_flight,
        "demand_met": c.queued == 0,
        "backlogged": backlogged,
        "done": c.done,
        "failed": c.failed,
        "cancelled": c.cancelled,
        "rejected": extra.get("rejected", 0),
        "wait_seconds": {"p50": finite(c.wait_p50), "p99": finite(c.wait_p99)},
        "ttft_seconds": {"p50": finite(c.ttft_p50), "p99": finite(c.ttft_p99)},
    }
