"""The live fairness view behind ``GET /v1/fairness`` and the dashboard.

A snapshot of the arbiter's standing (per app and per agent: service in unified
tokens, share against weight share, queued, in flight, wait and TTFT percentiles),
plus each client's cumulative service sampled once a second, so that a page opened
late still draws the shares over the last minutes.

A fair share is owed only to a backlogged client: one with requests waiting. So each
app and agent also says whether its demand is met (``demand_met``: nothing of it waits
for dispatch now; running requests are being served) and, over the sampled window,
the fraction of samples in which it was backlogged (``backlogged``). A share below the
entitlement with ``demand_met`` true is a client that asked for less, not a starved
one.

Entitlements are shared among the *active* clients only: an app (or an agent, among
its app's agents) is active while it has requests queued or running, or if it had
requests waiting or received service in the last ``window`` seconds (30). Its
``entitled_share`` is its weight over the active peers' weights (``None`` when idle),
and its ``recent_share`` its share of the service delivered in that window. It is
``below_entitlement`` when it has requests waiting and its recent share falls short of
its entitlement by more than :data:`BELOW_TOLERANCE` of it. The snapshot reads
:meth:`~fairagents.Arbiter.stats`, whose percentiles sort the recent records: it is
cached for ``max_age`` seconds, so many viewers cost the event loop no more than one.

Examples:
    >>> import fairagents as fa
    >>> from fairagents.server.fairness import FairnessView
    >>> arbiter = fa.Arbiter()
    >>> arbiter.app("driving", weight=2.0).agent("planner")
    AgentHandle(driving/planner)
    >>> view = FairnessView(arbiter)
    >>> view.sample()
    >>> body = view.snapshot()
    >>> body["apps"]["driving"]["weight"], body["apps"]["driving"]["agents"]["planner"]["service"]
    (2.0, 0.0)
    >>> body["history"]["apps"]["driving"]
    [0.0]
    >>> body["apps"]["driving"]["demand_met"], body["apps"]["driving"]["backlogged"]
    (True, 0.0)
    >>> body["apps"]["driving"]["active"], body["apps"]["driving"]["entitled_share"]   # declared, never used
    (False, None)
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fairagents.arbiter import Arbiter
from fairagents.server.wire import finite
from fairagents.stats import ClientSnapshot, Stats

__all__ = ["BELOW_TOLERANCE", "FairnessView"]

#: How far (a fraction of its entitlement) a backlogged client's recent share may fall short before it counts as
#: below its entitlement: 50.0 % or 46 % against 50.0 % is the noise of a 30-second window, not a shortfall.
BELOW_TOLERANCE = 0.1

_Key = tuple[str, str]
_Sample = tuple[float, dict[_Key, float], frozenset[_Key]]


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
    ) -> None:
        self.arbiter = arbiter
        self.interval = interval
        self.window = window
        self.max_age = max_age
        self.clock = clock
        self.started = clock()
        self.samples: deque[_Sample] = deque(maxlen=max(2, int(keep / interval)))
        """``(time, cumulative service by (app, agent), the (app, agent) pairs with requests queued)``."""
        self._clients = clients or (lambda: [tuple(k.split("/", 1)) for k in self.stats().agents])  # type: ignore[misc]
        self._extra = extra or dict
        self._models = models or dict
        self._cached: tuple[float, Stats] | None = None

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
            (5.0, {('driving', 'planner'): 0.0}, frozenset())
        """
        ledger = self.arbiter.ledger
        waiting = frozenset(t.request.agent_key for t in self.arbiter.dispatcher.tickets() if t.dispatched is None)
        self.samples.append((self.clock(), {(a, t): ledger.service_of(a, t) for a, t in self._clients()}, waiting))

    async def run(self) -> None:
        """Sample every ``interval`` seconds until cancelled."""
        while True:
            self.sample()
            await asyncio.sleep(self.interval)

    def snapshot(self, history: float | None = None, *, draining: bool = False) -> dict[str, Any]:
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
        stats = self.stats()
        extra = self._extra()
        now = self.clock()
        samples = [s for s in self.samples if history is None or s[0] >= now - history]
        by_app, by_agent = _backlogged(samples)
        apps: dict[str, Any] = {}
        for name, app in stats.apps.items():
            apps[name] = {**_client(app, _sum(extra, name), by_app(name)), "agents": {}}
        for key, agent in stats.agents.items():
            app_name, agent_name = key.split("/", 1)
            if app_name in apps:
                apps[app_name]["agents"][agent_name] = _client(
                    agent, extra.get((app_name, agent_name), {}), by_agent((app_name, agent_name))
                )
        _entitle(apps, *self._recent(stats, now))
        return {
            "object": "fairness",
            "time": now,
            "uptime_seconds": now - self.started,
            "policy": self.arbiter.policy.name,
            "unit": "unified_tokens",
            "draining": draining,
            "models": self._models(),
            "pool": {"in_flight": self.arbiter.pool_running, "in_flight_limit": self.arbiter.pool_in_flight},
            "entitlement": {"window_seconds": self.window, "tolerance": BELOW_TOLERANCE},
            "apps": apps,
            "history": self._history(samples),
        }

    def _recent(self, stats: Stats, now: float) -> tuple[dict[_Key, float] | None, set[_Key]]:
        """Each agent's service over the last ``window`` seconds, and the agents that had requests waiting then.

        The service is measured from the last sample at or before the window's start
        (the first sample if none is that old); ``None`` before the first sample.
        """
        start = now - self.window
        base = None
        waited: set[_Key] = set()
        for sample in self.samples:
            if sample[0] <= start or base is None:
                base = sample
            if sample[0] >= start:
                waited |= sample[2]
        if base is None:
            return None, waited
        served = {}
        for key, agent in stats.agents.items():
            app, name = key.split("/", 1)
            served[(app, name)] = agent.service - base[1].get((app, name), 0.0)
        return served, waited

    def _history(self, samples: list[_Sample]) -> dict[str, Any]:
        keys = sorted({k for _, by, _ in samples for k in by})
        apps = sorted({a for a, _ in keys})
        return {
            "interval_seconds": self.interval,
            "time": [round(t, 3) for t, _, _ in samples],
            "apps": {a: [round(sum(v for (x, _), v in by.items() if x == a), 4) for _, by, _ in samples] for a in apps},
            "agents": {f"{a}/{t}": [round(by.get((a, t), 0.0), 4) for _, by, _ in samples] for a, t in keys},
        }


def _backlogged(samples: list[_Sample]) -> tuple[Callable[[str], float | None], Callable[[_Key], float | None]]:
    """Per app and per agent, the fraction of ``samples`` in which it had requests waiting (``None`` without samples)."""
    apps: Counter[str] = Counter()
    agents: Counter[_Key] = Counter()
    for _, _, waiting in samples:
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


def _sum(extra: Mapping[tuple[str, str], Mapping[str, int]], app: str) -> dict[str, int]:
    total: dict[str, int] = {}
    for (a, _), counts in extra.items():
        if a == app:
            for k, v in counts.items():
                total[k] = total.get(k, 0) + v
    return total


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
