"""The arbiter's running account: service, outcomes and latencies per app and agent, and its runs.

Requests that name a run (one invocation of an agent workflow) are also accounted
per run: duration, calls and service (:mod:`fairagents.runs`).

Examples:
    >>> from fairagents.stats import Ledger
    >>> ledger = Ledger()
    >>> ledger.charge(0.0, "a", "t", 12.0)
    >>> ledger.service_of("a")
    12.0
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fairagents.metrics import Charge, ClientSnapshot, RequestRecord, percentile
from fairagents.request import Outcome, Request
from fairagents.runs import RunBook, RunRecord, RunStats

__all__ = ["ClientSnapshot", "Ledger", "RunRecord", "RunStats", "Stats"]


@dataclass(frozen=True, slots=True)
class Stats:
    """A snapshot of the arbiter: per app and per agent (agents keyed ``app/agent``).

    Examples:
        >>> from fairagents.stats import Ledger
        >>> ledger = Ledger()
        >>> ledger.charge(0.0, "a", "t", 12.0)
        >>> stats = ledger.snapshot({"a": 1.0}, {("a", "t"): 1.0}, queued={("a", "t"): 2}, in_flight={})
        >>> stats.apps["a"].service, stats.agents["a/t"].queued
        (12.0, 2)
    """

    apps: dict[str, ClientSnapshot]
    agents: dict[str, ClientSnapshot]
    runs: dict[str, RunStats] = field(default_factory=dict)
    """Per app with runs (requests naming a run): completed and active runs, durations, calls, service."""
    devices: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per device (:mod:`fairagents.policies.devices`), each app's service there, in unified tokens; a device
    splits its own service, so shares are read within one."""


class Ledger:
    """Service charged and requests ended, kept for stats and fairness metrics.

    Totals are exact for the arbiter's lifetime; percentiles and the charge log cover
    the most recent ``keep`` records and charges, so memory stays bounded. Runs are kept
    in :attr:`runs` (a :class:`~fairagents.runs.RunBook`, bounded too).

    Args:
        keep: records and charges kept.
        clock: the arbiter's clock, so that idle runs complete while nothing happens
            (without it, the latest time the ledger was told of stands for now).
        runs: the run book (default: one with ``clock`` and its default bounds).

    Examples:
        >>> from fairagents.stats import Ledger
        >>> Ledger(keep=10).charges.maxlen
        10
    """

    def __init__(self, keep: int = 100_000, *, clock: Callable[[], float] | None = None,
                 runs: RunBook | None = None) -> None:
        self.records: deque[RequestRecord] = deque(maxlen=keep)
        self.charges: deque[Charge] = deque(maxlen=keep)
        self.runs = runs if runs is not None else RunBook(clock=clock)
        """Per-run accounts of the requests that name a run."""
        self._service: dict[tuple[str, str], float] = defaultdict(float)
        self._by_model: dict[tuple[str, str], float] = defaultdict(float)  # (model, app) -> service
        self._outcomes: dict[tuple[str, str], dict[Outcome, int]] = defaultdict(lambda: dict.fromkeys(Outcome, 0))

    def charge(self, now: float, app: str, agent: str, amount: float, request: Request | None = None) -> None:
        """Account ``amount`` unified tokens to an agent at ``now`` (and to ``request``'s run, if it names one)."""
        self._service[(app, agent)] += amount
        if request is not None:
            self._by_model[(request.model, app)] += amount
        self.charges.append(Charge(now, app, agent, amount, None if request is None else request.model))
        if request is not None and request.run is not None:
            self.runs.charge(now, app, request.run, request.id, amount, arrival=request.arrival)

    def arrive(self, request: Request) -> None:
        """A request was queued: its run (if it names one) has it queued from its arrival."""
        if request.run is not None:
            self.runs.arrive(request.arrival, request.app, request.run, request.id, arrival=request.arrival)

    def record(self, record: RequestRecord) -> None:
        """Account a request that ended."""
        self._outcomes[(record.app, record.agent)][record.outcome] += 1
        self.records.append(record)
        if record.run is not None:
            self.runs.ended(record.finished, record.app, record.run, record.id, arrival=record.arrival)

    def end_run(self, run: str, now: float) -> None:
        """``run``'s scope ended at ``now``: it completes once its requests queued or running end."""
        self.runs.end(run, now)

    def knows(self, app: str, agent: str) -> bool:
        """Whether the agent was ever charged or ended a request."""
        return (app, agent) in self._service or (app, agent) in self._outcomes

    def service_by_device(self, devices: Mapping[str, str]) -> dict[str, dict[str, float]]:
        """Unified tokens charged so far per device and app, ``devices`` giving each model's (others left out)."""
        by_device: dict[str, dict[str, float]] = {}
        for (model, app), amount in list(self._by_model.items()):
            device = devices.get(model)
            if device is not None:
                on = by_device.setdefault(device, {})
                on[app] = on.get(app, 0.0) + amount
        return by_device

    def service_of(self, app: str, agent: str | None = None) -> float:
        """Unified tokens charged to an app (or one of its agents) so far."""
        if agent is not None:
            return self._service.get((app, agent), 0.0)
        return sum(v for (a, _), v in self._service.items() if a == app)

    def snapshot(
        self,
        app_weights: Mapping[str, float],
        agent_weights: Mapping[tuple[str, str], float],
        queued: Mapping[tuple[str, str], int],
        in_flight: Mapping[tuple[str, str], int],
        now: float | None = None,
        devices: Mapping[str, str] | None = None,
    ) -> Stats:
        """Per-app and per-agent standing of every declared app and agent, and each app's runs.

        Runs idle at ``now`` (default: the ledger's clock) complete first. ``devices`` (each
        model's device) groups the service by device.
        """
        waits: dict[tuple[str, str], list[float]] = defaultdict(list)
        ttfts: dict[tuple[str, str], list[float]] = defaultdict(list)
        e2es: dict[tuple[str, str], list[float]] = defaultdict(list)
        slos: dict[tuple[str, str], list[bool]] = defaultdict(list)
        for r in self.records:
            key = (r.app, r.agent)
            if r.queue_wait is not None:
                waits[key].append(r.queue_wait)
            if r.ttft is not None:
                ttfts[key].append(r.ttft)
            if r.outcome is Outcome.FINISHED:
                e2es[key].append(r.e2e)
                if (met := r.slo_met()) is not None:
                    slos[key].append(met)

        def snap(name: str, keys: list[tuple[str, str]], weight: float, weight_sum: float,
                 peer_service: float) -> ClientSnapshot:
            service = sum(self._service.get(k, 0.0) for k in keys)
            outcomes = [self._outcomes[k] for k in keys if k in self._outcomes]
            w = [x for k in keys for x in waits.get(k, [])]
            t = [x for k in keys for x in ttfts.get(k, [])]
            met = [x for k in keys for x in slos.get(k, [])]
            return ClientSnapshot(
                name=name,
                weight=weight,
                weight_share=weight / weight_sum if weight_sum else 0.0,
                service=service,
                share=service / peer_service if peer_service else 0.0,
                done=sum(o[Outcome.FINISHED] for o in outcomes),
                failed=sum(o[Outcome.FAILED] for o in outcomes),
                cancelled=sum(o[Outcome.CANCELLED] for o in outcomes),
                queued=sum(queued.get(k, 0) for k in keys),
                in_flight=sum(in_flight.get(k, 0) for k in keys),
                wait_p50=percentile(w, 50),
                wait_p99=percentile(w, 99),
                ttft_p50=percentile(t, 50),
                ttft_p99=percentile(t, 99),
                e2e_p50=percentile([x for k in keys for x in e2es.get(k, [])], 50),
                slo_attainment=sum(met) / len(met) if met else None,
            )

        by_app: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for key in agent_weights:
            by_app[key[0]].append(key)
        total_service = sum(self._service.get(k, 0.0) for k in agent_weights)
        total_weight = sum(app_weights.values())
        apps = {a: snap(a, by_app.get(a, []), w, total_weight, total_service) for a, w in app_weights.items()}
        agents = {}
        for app, keys in by_app.items():
            app_service = sum(self._service.get(k, 0.0) for k in keys)
            app_weight = sum(agent_weights[k] for k in keys)
            for k in keys:
                agents[f"{k[0]}/{k[1]}"] = snap(f"{k[0]}/{k[1]}", [k], agent_weights[k], app_weight, app_service)
        return Stats(apps=apps, agents=agents, runs=self.runs.summary(now),
                     devices=self.service_by_device(devices or {}))
