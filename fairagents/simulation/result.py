"""What a simulated run delivered: :class:`SimResult`."""

from __future__ import annotations

from dataclasses import dataclass, field

from fairagents.admission import Statera
from fairagents.cost import UnifiedTokenCost
from fairagents.identity import Agent, App
from fairagents.metrics import Charge, ClientSnapshot, client_stats, jain_index, max_service_gap
from fairagents.policies.pooled import EngineTally
from fairagents.records import RequestRecord
from fairagents.simulation.workflows import SimRun

__all__ = ["SimResult"]


@dataclass
class SimResult:
    """What a simulated run delivered (times in virtual seconds, service in unified tokens).

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.simulation import Workload, simulate
        >>> who = fa.Agent("a", fa.App("x"))
        >>> result = simulate(Workload().burst(who, "m", n=3, prompt=4, output=2), "vtc",
        ...                   {"m": fa.engines.SimEngine(fa.ModelProfile(d_model=4096, n_layers=1))})
        >>> [s.done for s in result.app_stats()]
        [3]
    """

    policy: str
    records: list[RequestRecord]
    charges: list[Charge]
    apps: dict[str, App]
    agents: dict[tuple[str, str], Agent]
    cost: UnifiedTokenCost
    bound: float
    """``U`` of this run (:meth:`~fairagents.dispatcher.Dispatcher.bound`): from the engines' batch and KV
    capacity (the dispatcher's slots and token budgets), and the pool limit."""
    end: float
    """Virtual time of the last event."""
    idle_with_backlog: int
    """Times a model was left with an empty batch while a request for it waited and was not held for its device
    (0 is work-conserving)."""
    dispatch_order: dict[str, list[str]] = field(default_factory=dict)
    """Request ids per model, in dispatch order (an engine with ``scheduler="fair"`` is handed each as it arrives)."""
    preemptions: int = 0
    """Requests the engines preempted (``kv="paged"`` engines, when the cache overflows; ``scheduler="fair"``
    engines, also for a client owed service)."""
    fair_preemptions: int = 0
    """Of :attr:`preemptions`, those for a client owed service (``scheduler="fair"`` engines)."""
    admission: Statera | None = None
    """The admission controller of the run, if any (its ``states``, ``covered`` and ``calibrated`` after the run)."""
    rejected: dict[tuple[str, str], int] = field(default_factory=dict)
    """Arrivals refused per agent ``(app, agent)``: its app had ``max_queued`` requests waiting for the model.
    :meth:`app_stats` and :meth:`agent_stats` report them per app and per agent."""
    runs: list[SimRun] = field(default_factory=list)
    """The workflow runs played (:func:`simulate_workflows`), in the order they completed."""
    tallies: dict[str, EngineTally] = field(default_factory=dict)
    """What each ``scheduler="fair"`` engine prefilled, recomputed and preempted, by model (as its seat tallied it)."""

    def app_weights(self) -> dict[str, float]:
        return {name: app.weight for name, app in self.apps.items()}

    def agent_weights(self) -> dict[str, float]:
        return {f"{a}/{t}": agent.weight for (a, t), agent in self.agents.items()}

    def app_stats(self, until: float | None = None) -> list[ClientSnapshot]:
        """Per-app totals and percentiles (service delivered up to ``until``, if given)."""
        rejected: dict[str, int] = {}
        for (app, _), n in self.rejected.items():
            rejected[app] = rejected.get(app, 0) + n
        return client_stats(self.records, self.charges, self.app_weights(), "app", until, rejected)

    def agent_stats(self, until: float | None = None) -> list[ClientSnapshot]:
        """Per-agent totals and percentiles (agents named ``app/agent``)."""
        rejected = {f"{app}/{agent}": n for (app, agent), n in self.rejected.items()}
        return client_stats(self.records, self.charges, self.agent_weights(), "agent", until, rejected)

    def max_app_gap(self, models: list[str] | None = None) -> float:
        """Largest weight-normalised service gap between two backlogged apps (see :func:`max_service_gap`)."""
        return max_service_gap(self.records, self.charges, self.app_weights(), "app", models=models)

    def max_agent_gap(self, models: list[str] | None = None) -> float:
        """Largest weight-normalised service gap between two backlogged agents of one app."""
        return max_service_gap(self.records, self.charges, self.agent_weights(), "agent", models=models)

    def jain(self, until: float | None = None) -> float:
        """Jain's index of weight-normalised app service (up to ``until``, if given)."""
        return jain_index(s.service / s.weight for s in self.app_stats(until))
