"""Hierarchical Multi-modal Fair Scheduling (HMFS, Zhang & Hu 2025, Algorithm 1).

Two levels of weighted virtual counters, both charged in unified tokens: one per app,
grown by ``charge / app.weight``, and one per agent inside its app, grown by
``charge / agent.weight``. When a model has room, the lowest-counter app waiting for it
goes first, then that app's lowest-counter agent waiting for it, then that agent's
earliest request; under a shared pool limit, a free slot goes by the same rule across
every model with room (:meth:`select_among`). Input is charged at dispatch and
output as it streams. An app or agent that becomes active is lifted to the lowest
active counter at its level, so nothing banks credit. Two backlogged apps (or two
agents of one app) receive weight-normalised service within ``2U`` of each other
(:func:`fairagents.service_bound`). See *Hierarchical fair scheduling* in the docs.

:class:`HMFSCredit`, the default policy, lifts an app back from idle (nothing waiting
or running) less far: it keeps up to ``U`` of the lag it built while it asked for less,
so a light app's burst runs ahead of the backlogged apps that far (apps within ``3U``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import ClassVar

from fairagents.cost import CostModel, UnifiedTokenCost
from fairagents.errors import InvalidParameterError, ProtocolError
from fairagents.identity import Agent
from fairagents.policies._structures import CounterLevel, Fifo
from fairagents.policies.base import BasePolicy
from fairagents.request import Outcome, Request

__all__ = ["HMFS", "HMFSCredit"]


class HMFS(BasePolicy):
    """HMFS: apps, then agents, weighted, unified tokens (the default, :class:`HMFSCredit`, adds an idle credit).

    Args:
        cost: how tokens are charged; a :class:`~fairagents.UnifiedTokenCost`
            (empty by default: register each model's profile as it joins the pool).
        idle_credit: the most service (unified tokens) an app back from idle (nothing
            waiting or running) may reclaim of what it fell behind, so that a light app's
            burst runs ahead rather than at its weight's share. ``0`` (the default): none,
            the paper's lift; ``None``: ``U`` of the models the policy orders, as its
            driver reports it (:meth:`set_bound`), as :class:`HMFSCredit` does. Two
            backlogged apps then stay within ``2U + idle_credit`` of each other.

    Examples:
        >>> import fairagents as fa
        >>> cost = fa.UnifiedTokenCost({"chat": fa.ModelProfile(d_model=4096, n_layers=1)})
        >>> policy = fa.policies.HMFS(cost)
        >>> studio = fa.App("studio")
        >>> writer, critic = fa.Agent("writer", studio), fa.Agent("critic", studio)
        >>> for i, who in [("w1", writer), ("w2", writer), ("c1", critic)]:
        ...     policy.on_arrival(fa.Request(id=i, agent=who, model="chat", prompt_tokens=10,
        ...                                  max_tokens=4, arrival=0.0), now=0.0)
        >>> policy.on_dispatch(policy.select("chat", now=0.0), now=0.0)
        >>> policy.select("chat", now=0.0).id   # the writer paid; the critic goes next
        'c1'
        >>> policy.app_counters(), policy.agent_counters("studio")
        ({'studio': 10.0}, {'writer': 10.0, 'critic': 0.0})
    """

    name: ClassVar[str] = "hmfs"
    orders_by_service: ClassVar[bool] = True
    charges_by_client: ClassVar[bool] = True
    charges_unified_tokens: ClassVar[bool] = True

    def __init__(self, cost: CostModel | None = None, *, idle_credit: float | None = 0.0) -> None:
        if idle_credit is not None and (isinstance(idle_credit, bool) or not isinstance(idle_credit, int | float)
                                        or not 0 <= idle_credit < math.inf):
            raise InvalidParameterError(f"idle_credit must be a finite number ≥ 0 (unified tokens) or None, "
                                        f"got {idle_credit!r}")
        super().__init__(cost if cost is not None else UnifiedTokenCost())
        self._apps: CounterLevel[str] = CounterLevel()
        self._fixed_credit = idle_credit
        self._apps.credit = float(idle_credit or 0.0)
        self._in_flight: dict[str, int] = {}  # app -> its requests waiting or running
        self._agents: dict[str, CounterLevel[str]] = {}
        self._queues: dict[str, dict[str, dict[str, Fifo]]] = {}  # app -> agent -> model -> requests
        self._agent_floor: Callable[[str, float | None, float | None], float] | None = None

    @property
    def idle_credit(self) -> float:
        """The idle credit in force (unified tokens): as given, or ``U`` as last reported."""
        return self._apps.credit

    def set_bound(self, bound: float) -> None:
        """``U`` of the models this policy orders (:func:`~fairagents.service_bound`), as its driver computes it.

        The idle credit follows it if it was given as ``None``.

        Examples:
            >>> import fairagents as fa
            >>> follows = fa.policies.HMFS(idle_credit=None)
            >>> follows.set_bound(5000.0); follows.idle_credit
            5000.0
            >>> paper = fa.policies.HMFS(); paper.set_bound(5000.0); paper.idle_credit
            0.0
        """
        if not 0 <= bound < math.inf:
            raise ProtocolError(f"U is a finite number ≥ 0, got {bound!r}")
        if self._fixed_credit is None:
            self._apps.credit = float(bound)

    def app_counters(self) -> dict[str, float]:
        """Current counter ``C_a`` of each app seen so far (unified tokens / weight)."""
        return dict(self._apps.counter)

    def agent_counters(self, app: str) -> dict[str, float]:
        """Current counter ``C_{a,t}`` of each agent of ``app`` seen so far."""
        level = self._agents.get(app)
        return dict(level.counter) if level is not None else {}

    def counters_of(self, agent: Agent) -> tuple[float, float]:
        """``(C_a, C_{a,t})`` of ``agent``'s app and of the agent (0 for a client not seen yet)."""
        app = agent.app.name
        level = self._agents.get(app)
        return self._apps.counter.get(app, 0.0), 0.0 if level is None else level.counter.get(agent.name, 0.0)

    def lead(self, head: Agent, other: Agent) -> float | None:
        """How far ``other`` is served beyond ``head``: by app counters if their apps differ, else by agent counters.

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.HMFS()
            >>> a, b = fa.Agent("t", fa.App("a", weight=2.0)), fa.Agent("t", fa.App("b"))
            >>> policy.charge_to(a, 10.0); policy.charge_to(b, 30.0)
            >>> policy.lead(a, b), policy.lead(b, a), policy.lead(a, a)   # (30 − 5) × 2, (5 − 30) × 1
            (50.0, -25.0, None)
        """
        (app, agent), (other_app, other_agent) = self.counters_of(head), self.counters_of(other)
        if head.app.name != other.app.name:
            return (other_app - app) * head.app.weight
        if head.name != other.name:
            return (other_agent - agent) * head.weight
        return None

    def leads(self, head: Agent, others: Iterable[Agent]) -> list[float | None]:
        """:meth:`lead` over each of ``others``, ``head``'s counters read once (the engine asks every step)."""
        app_counter, (app, agent) = self._apps.counter, self.counters_of(head)
        head_app, head_name, app_weight, weight = head.app.name, head.name, head.app.weight, head.weight
        leads: list[float | None] = []
        for other in others:
            other_app = other.app.name
            if other_app != head_app:
                leads.append((app_counter.get(other_app, 0.0) - app) * app_weight)
            elif other.name != head_name:
                leads.append((self.counters_of(other)[1] - agent) * weight)
            else:
                leads.append(None)
        return leads

    def charge_to(self, agent: Agent, amount: float) -> None:
        """Charge ``amount`` (unified tokens) to ``agent`` and its app, outside the request lifecycle.

        For a driver that meters service itself, as the in-engine
        :class:`~fairagents.vllm.scheduler.FairScheduler` does per scheduled
        chunk. A client charged before it ever waited starts at its level's floor (the
        lowest active counter), as a newly active one would.

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.HMFS()
            >>> policy.charge_to(fa.Agent("t", fa.App("a", weight=2.0)), 10.0)
            >>> policy.counters_of(fa.Agent("t", fa.App("a", weight=2.0)))
            (5.0, 10.0)
        """
        if not 0.0 <= amount < math.inf:
            raise ProtocolError(f"a charge is a finite number ≥ 0 (unified tokens), got {amount!r}",
                                app=agent.app.name, agent=agent.name)
        app, apps = agent.app.name, self._apps
        agents = self._agents.get(app)
        if agents is None:
            agents = self._agents[app] = self._new_level(app)
        if app not in apps.counter:
            apps.touch(app, agent.app.weight)
        if agent.name not in agents.counter:
            agents.touch(agent.name, agent.weight)
        # Inlined charges, at the weights the client last arrived with (or was first charged at).
        apps.counter[app] += amount * apps.inverse_weight[app]
        agents.counter[agent.name] += amount * agents.inverse_weight[agent.name]

    # -- shared counters (several arbiters, one fair share: fairagents.shared) ---------------

    def share_floors(
        self,
        apps: Callable[[float | None, float | None], float],
        agents: Callable[[str, float | None, float | None], float],
    ) -> None:
        """Take the lift's floor from outside, for counters shared with other arbiters.

        ``apps(lowest active, last left)`` and ``agents(app, lowest active, last left)``
        get this policy's own candidates (``None`` when there is none) and return the
        floor to lift a newly active client to (:class:`~fairagents.shared.SharedView`).

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.HMFS(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=4096, n_layers=1)}))
            >>> policy.share_floors(lambda low, left: 7.0, lambda app, low, left: 3.0)
            >>> policy.on_arrival(fa.Request("r", fa.Agent("t", fa.App("a")), "m", 1, 1, 0.0), now=0.0)
            >>> policy.counters_of(fa.Agent("t", fa.App("a")))   # lifted to the floors from outside
            (7.0, 3.0)
        """
        self._apps.floor = apps
        self._agent_floor = agents
        for app, level in self._agents.items():
            level.floor = functools.partial(agents, app)

    def growth(self, agent: Agent, amount: float) -> tuple[float, float]:
        """What a charge of ``amount`` adds to ``(C_a, C_{a,t})`` of a client already charged or queued.

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.HMFS()
            >>> who = fa.Agent("t", fa.App("a", weight=4.0), weight=2.0)
            >>> policy.charge_to(who, 8.0)
            >>> policy.growth(who, 8.0)
            (2.0, 4.0)
        """
        app = agent.app.name
        return amount * self._apps.inverse_weight[app], amount * self._agents[app].inverse_weight[agent.name]

    def set_counters(self, app: str, value: float, agents: dict[str, float]) -> None:
        """Set ``app``'s counter and its agents' (known clients only), as counters shared with other arbiters say.

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.HMFS()
            >>> policy.charge_to(fa.Agent("t", fa.App("a")), 5.0)
            >>> policy.set_counters("a", 9.0, {"t": 2.0, "unknown": 1.0})
            >>> policy.counters_of(fa.Agent("t", fa.App("a")))
            (9.0, 2.0)
        """
        if app not in self._apps.counter:
            return
        self._apps.set(app, value)
        level = self._agents.get(app)
        if level is not None:
            for agent, v in agents.items():
                level.set(agent, v)

    def clients(self) -> dict[str, list[str]]:
        """Every app seen so far, with its agents seen so far.

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.HMFS()
            >>> policy.charge_to(fa.Agent("t", fa.App("a")), 1.0)
            >>> policy.clients()
            {'a': ['t']}
        """
        return {app: list(self._agents[app].counter) if app in self._agents else [] for app in self._apps.counter}

    def waiting_by_client(self) -> dict[str, dict[str, dict[str, int]]]:
        """What waits now: ``{model: {app: {agent: requests}}}``."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for model in self._apps.waiting_models():
            out[model] = {app: dict(self._agents[app].waiting_for(model)) for app in self._apps.waiting_for(model)}
        return out

    def _new_level(self, app: str) -> CounterLevel[str]:
        level: CounterLevel[str] = CounterLevel()
        if self._agent_floor is not None:
            level.floor = functools.partial(self._agent_floor, app)
        return level

    def select(self, model: str, now: float) -> Request | None:
        app = self._apps.lowest(model)
        if app is None:
            return None
        agent = self._agents[app].lowest(model)
        return self._queues[app][agent][model].head()  # type: ignore[index]

    def _rank(self, req: Request) -> tuple[float, float, float]:
        # Across models as within one: the lowest app counter, then the lowest agent of it, then the earliest.
        app = req.agent.app.name
        return self._apps.counter[app], self._agents[app].counter[req.agent.name], req.arrival

    def _enqueue(self, req: Request, now: float) -> None:
        who = req.agent
        app = who.app.name
        try:
            queue = self._queues[app][who.name][req.model]
        except KeyError:
            queue = self._queues.setdefault(app, {}).setdefault(who.name, {}).setdefault(req.model, Fifo())
        queue.push(req)
        self._in_flight[app] = self._in_flight.get(app, 0) + 1
        # Lift the app before its agent: an agent's lift compares only with its own app's agents.
        self._apps.enqueue(app, who.app.weight, req.model)
        agents = self._agents.get(app)
        if agents is None:
            agents = self._agents[app] = self._new_level(app)
        agents.enqueue(who.name, who.weight, req.model)

    def _dequeue(self, req: Request, now: float, dispatched: bool) -> None:
        who = req.agent
        app = who.app.name
        self._queues[app][who.name][req.model].remove(req)
        self._apps.dequeue(app, req.model)
        self._agents[app].dequeue(who.name, req.model)

    def on_finish(self, req: Request, outcome: Outcome, now: float) -> None:
        put_back = outcome is Outcome.CANCELLED and req.id in self._running  # aborted, or preempted to run again
        super().on_finish(req, outcome, now)
        app = req.agent.app.name
        left = self._in_flight[app] - 1
        if left:
            self._in_flight[app] = left
            return
        del self._in_flight[app]
        if not put_back:  # nothing of the app waits or runs: its idle time starts
            self._apps.rest(app)

    def _charge(self, req: Request, amount: float, now: float) -> None:
        # CounterLevel.charge at both levels, inlined: this runs for every streamed chunk.
        who = req.agent
        app = who.app.name
        apps = self._apps
        apps.counter[app] += amount * apps.inverse_weight[app]
        agents = self._agents[app]
        agents.counter[who.name] += amount * agents.inverse_weight[who.name]


class HMFSCredit(HMFS):
    """HMFS whose apps back from idle keep up to ``U`` of their lag (``idle_credit=None``; see :class:`HMFS`).

    A light app, one that asks for less than its share, sends its burst ahead of the
    backlogged apps as far as ``U``, the unit of the bound, instead of at its weight's
    share; two backlogged apps stay within ``3U``. See *Scheduling agent workflows* in the
    docs for when it pays.

    Examples:
        >>> import fairagents as fa
        >>> policy = fa.policies.HMFSCredit()
        >>> policy.idle_credit, policy.set_bound(1000.0), policy.idle_credit
        (0.0, None, 1000.0)
    """

    name: ClassVar[str] = "hmfs_credit"

    def __init__(self, cost: CostModel | None = None, *, idle_credit: float | None = None) -> None:
        super().__init__(cost, idle_credit=idle_credit)
