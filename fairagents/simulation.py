"""Play a workload through a policy and simulated engines on a virtual clock.

This is the simulator: :class:`~fairagents.engines.SimEngine` models engines, the
clock is virtual, and a run is deterministic. It exists to compare policies at scale
and to test their guarantees; real serving goes through the arbiter and real engines.
What runs is decided by the same :class:`~fairagents.dispatcher.Dispatcher` the
arbiter uses, with each engine's batch size as its slots and its KV capacity as its
token budget, so a property shown here is a property of the serving path. As in the
arbiter, a request is dispatched (and its input charged) the moment its model has
room, and joins the engine's running batch at the next step boundary. An app given a
``max_queued`` bound has its arrivals past it refused, as the arbiter answers them
(``OverloadedError``, the server's 429), and counted in :attr:`SimResult.rejected`.

Examples:
    >>> import fairagents as fa
    >>> from fairagents.simulation import Workload, simulate
    >>> profile = fa.ModelProfile(d_model=4096, n_layers=1)
    >>> a, b = fa.Agent("bot", fa.App("a")), fa.Agent("bot", fa.App("b"))
    >>> work = Workload(seed=1).burst(a, "chat", n=40, prompt=32, output=16).burst(b, "chat", n=4, prompt=32, output=16)
    >>> fair = simulate(work, "hmfs", {"chat": fa.engines.SimEngine(profile, max_running=4)})
    >>> fcfs = simulate(work, "fcfs", {"chat": fa.engines.SimEngine(profile, max_running=4)})
    >>> def b_done(result):  # when b's last request finished
    ...     return max(r.finished for r in result.records if r.app == "b")
    >>> b_done(fair) < b_done(fcfs) / 3
    True
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from fairagents.admission import Statera, make_admission
from fairagents.cost import UnifiedTokenCost
from fairagents.dispatcher import Dispatcher
from fairagents.engines.sim import SimEngine
from fairagents.errors import (
    InvalidParameterError,
    OverloadedError,
    UnknownAgentError,
    UnknownAppError,
    UnknownModelError,
)
from fairagents.identity import Agent, App
from fairagents.metrics import Charge, ClientSnapshot, client_stats, jain_index, max_service_gap
from fairagents.policies import Policy, make_policy
from fairagents.records import Changes, RequestRecord
from fairagents.request import Request

__all__ = ["SimRequest", "SimResult", "Workload", "simulate"]

Length = int | tuple[int, int]


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request of a workload: who sends what to which model, and when."""

    at: float
    """Arrival time (seconds)."""
    agent: Agent
    model: str
    prompt_tokens: int
    output_tokens: int
    """Tokens the simulated engine will generate (≥ 1)."""
    max_tokens: int | None = None
    """The request's ``max_tokens`` (≥ output_tokens); defaults to ``output_tokens``."""
    cancel_at: float | None = None
    """When the caller gives up, if it does."""


class Workload:
    """A list of timed requests, with builders for common shapes (deterministic by seed).

    Lengths are an ``int`` or an inclusive ``(low, high)`` range drawn uniformly.
    ``max_tokens`` is what each request asks for (at least its longest output; default:
    exactly its output, so a worst-case reservation is exact).

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.simulation import Workload
        >>> who = fa.Agent("a", fa.App("x"))
        >>> work = Workload(seed=0).poisson(who, "chat", rate=10.0, until=1.0, prompt=(4, 8), output=4)
        >>> 0 < len(work) < 30
        True
    """

    def __init__(self, requests: list[SimRequest] | None = None, *, seed: int = 0) -> None:
        self.requests: list[SimRequest] = list(requests or [])
        self._rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.requests)

    def add(self, request: SimRequest) -> Workload:
        """Append one request."""
        self.requests.append(request)
        return self

    def burst(self, agent: Agent, model: str, *, n: int, at: float = 0.0, prompt: Length, output: Length,
              max_tokens: int | None = None) -> Workload:
        """``n`` requests all arriving at ``at`` (a backlog)."""
        _check_max_tokens(max_tokens, output)
        for _ in range(n):
            self.add(SimRequest(at, agent, model, self._draw(prompt), self._draw(output), max_tokens))
        return self

    def poisson(
        self, agent: Agent, model: str, *, rate: float, until: float, start: float = 0.0, prompt: Length, output: Length,
        max_tokens: int | None = None,
    ) -> Workload:
        """Requests arriving as a Poisson process of ``rate`` per second over ``[start, until)``."""
        if rate <= 0:
            raise InvalidParameterError(f"rate must be > 0 requests per second, got {rate!r}")
        _check_max_tokens(max_tokens, output)
        t = start + self._rng.expovariate(rate)
        while t < until:
            self.add(SimRequest(t, agent, model, self._draw(prompt), self._draw(output), max_tokens))
            t += self._rng.expovariate(rate)
        return self

    def _draw(self, length: Length) -> int:
        return length if isinstance(length, int) else self._rng.randint(*length)


def _check_max_tokens(max_tokens: int | None, output: Length) -> None:
    longest = output if isinstance(output, int) else output[1]
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < longest):
        raise InvalidParameterError(f"max_tokens must be an integer ≥ the longest output ({longest}), got {max_tokens!r}")


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
    """Times a model was left with an empty batch while a request for it waited (0 is work-conserving)."""
    dispatch_order: dict[str, list[str]] = field(default_factory=dict)
    """Request ids per model, in dispatch order."""
    preemptions: int = 0
    """Requests the engines preempted (only ``kv="paged"`` engines preempt, when admission overcommits)."""
    admission: Statera | None = None
    """The admission controller of the run, if any (its ``states``, ``covered`` and ``calibrated`` after the run)."""
    rejected: dict[tuple[str, str], int] = field(default_factory=dict)
    """Arrivals refused per agent ``(app, agent)``: its app had ``max_queued`` requests waiting for the model.
    :meth:`app_stats` and :meth:`agent_stats` report them per app and per agent."""

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


def simulate(
    workload: Workload,
    policy: str | Policy,
    engines: Mapping[str, SimEngine],
    *,
    apps: Mapping[str, App] | None = None,
    d_base: int | None = None,
    pool_running: int | None = None,
    admission: str | Statera | None = None,
    max_queued: Mapping[str, int] | None = None,
) -> SimResult:
    """Run ``workload`` through ``policy`` on ``engines`` (one per model) to the end.

    Args:
        workload: the timed requests.
        policy: a policy name (built with this run's unified cost) or a policy object.
        engines: model name → simulated engine (not shared between models).
        apps: if given, the only apps (and their agents, as :class:`Agent` objects in
            the workload) allowed; otherwise every app in the workload is allowed.
        d_base: ``d_base`` of the unified-token cost (default 4096).
        pool_running: most requests running across all engines at once (the models
            share hardware), as :class:`~fairagents.Arbiter`'s ``pool_in_flight``: a
            slot freed on any engine goes to the policy's choice among every model
            with room (:meth:`~fairagents.policies.Policy.select_among`). A request
            given a slot joins its engine's batch at that engine's next step boundary.
            ``None``: each engine is filled on its own.
        admission: ``"statera"`` (a new :class:`~fairagents.Statera` for the run) or a
            :class:`~fairagents.Statera`: reservations by predicted bound and the two
            loops, as ``Arbiter(admission=...)``. It overcommits the worst case, so the
            engines must model what a real engine then does: ``SimEngine(kv="paged")``.
        max_queued: app name → the most requests it may have waiting for one model, as
            ``arbiter.app(name, max_queued=...)``: an arrival past it is refused (the
            arbiter's ``OverloadedError``, the server's 429) and counted in
            :attr:`SimResult.rejected`. Apps not named are unbounded.

    Raises:
        BadInputError: a bad workload (an unknown model or app, a request that does not
            fit its engine, invalid lengths), before anything runs.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.simulation import Workload, simulate
        >>> who = fa.Agent("a", fa.App("x"))
        >>> simulate(Workload().burst(who, "nope", n=1, prompt=1, output=1), "hmfs", {})
        Traceback (most recent call last):
        ...
        fairagents.errors.UnknownModelError: unknown model 'nope'; known models: none
    """
    if pool_running is not None and (isinstance(pool_running, bool) or not isinstance(pool_running, int)
                                     or pool_running < 1):
        raise InvalidParameterError(f"pool_running must be an integer ≥ 1 or None, got {pool_running!r}")
    cost = UnifiedTokenCost({m: e.profile for m, e in engines.items()}, **({"d_base": d_base} if d_base else {}))
    policy_obj = make_policy(policy, cost)
    controller = make_admission(admission)
    if controller is not None:
        reserving = sorted(m for m, e in engines.items() if e.kv != "paged")
        if reserving:
            raise InvalidParameterError(
                f"admission {controller.name!r} reserves less than max_tokens, so a simulated engine must model KV "
                f"as vLLM pages it and preempt: use SimEngine(kv='paged') for {', '.join(reserving)}")
    bounds = dict(max_queued or {})
    for app, bound in bounds.items():
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
            raise InvalidParameterError(f"max_queued must be an integer ≥ 1, got {bound!r}", app=app)
    requests = _validate(workload, engines, apps)
    run = _Run(policy_obj, engines, cost, pool_running, controller, bounds)
    return run.play(requests)


def _validate(
    workload: Workload, engines: Mapping[str, SimEngine], apps: Mapping[str, App] | None
) -> list[tuple[SimRequest, Request]]:
    out = []
    for i, item in enumerate(workload.requests):
        if item.model not in engines:
            raise UnknownModelError.among(item.model, engines)
        if apps is not None:
            app = apps.get(item.agent.app.name)
            if app is None:
                raise UnknownAppError(f"unknown app {item.agent.app.name!r}")
            if item.agent.app != app:
                raise UnknownAgentError(f"agent {item.agent.name!r} does not belong to the declared app {app.name!r}")
        max_tokens = item.output_tokens if item.max_tokens is None else item.max_tokens
        req = Request(f"r{i}", item.agent, item.model, item.prompt_tokens, max_tokens, item.at)
        if not 1 <= item.output_tokens <= max_tokens:
            raise InvalidParameterError(f"output_tokens must be in [1, max_tokens={max_tokens}], got {item.output_tokens}")
        engines[item.model].check(req)
        out.append((item, req))
    return out


class _Run:
    """Plays events on a virtual clock: the dispatcher decides, simulated engines run."""

    _STEP, _ARRIVAL, _CANCEL = 0, 1, 2  # order of events at the same instant

    def __init__(
        self, policy: Policy, engines: Mapping[str, SimEngine], cost: UnifiedTokenCost, pool: int | None,
        admission: Statera | None = None, max_queued: Mapping[str, int] | None = None,
    ) -> None:
        self.policy = policy
        self.engines = engines
        self.cost = cost
        self.pool = pool
        self.charges: list[Charge] = []
        self._add_charge = self.charges.append
        self.admission = admission
        self.dispatcher = Dispatcher(policy, cost, pool_slots=pool, charge=self._charge, admission=admission,
                                     queue_bound=max_queued.get if max_queued else None)
        for model, engine in engines.items():
            # The engine's batch and KV capacity are the dispatcher's slots and token budget.
            self.dispatcher.add_model(model, engine.profile, slots=engine.max_running,
                                      token_budget=engine.kv_capacity, max_model_len=engine.max_model_len)
        self.joining: dict[str, list[Request]] = {m: [] for m in engines}  # dispatched; join at the next step
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = itertools.count()
        self.output: dict[str, int] = {}
        self.records: list[RequestRecord] = []
        self.order: dict[str, list[str]] = {m: [] for m in engines}
        self.idle_with_backlog = 0
        self.rejected: dict[tuple[str, str], int] = {}

    def push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self.events, (t, kind, next(self.seq), payload))

    def play(self, requests: list[tuple[SimRequest, Request]]) -> SimResult:
        apps: dict[str, App] = {}
        agents: dict[tuple[str, str], Agent] = {}
        for item, req in requests:
            apps[req.app] = req.agent.app
            agents[req.agent_key] = req.agent
            self.output[req.id] = item.output_tokens
            self.push(item.at, self._ARRIVAL, req)
            if item.cancel_at is not None:
                self.push(max(item.cancel_at, item.at), self._CANCEL, req)
        now = 0.0
        while self.events:
            now, kind, _, payload = heapq.heappop(self.events)
            if kind == self._ARRIVAL:
                self._arrive(payload, now)  # type: ignore[arg-type]
            elif kind == self._STEP:
                self._step_done(payload, now)  # type: ignore[arg-type]
            else:
                self._cancel(payload, now)  # type: ignore[arg-type]
            self._start_steps(now)
        return SimResult(
            policy=self.policy.name,
            records=self.records,
            charges=self.charges,
            apps=apps,
            agents=agents,
            cost=self.cost,
            bound=self.dispatcher.bound(),
            end=now,
            idle_with_backlog=self.idle_with_backlog,
            dispatch_order=self.order,
            preemptions=sum(e.preemptions for e in self.engines.values()),
            admission=self.admission,
            rejected=self.rejected,
        )

    def _arrive(self, req: Request, now: float) -> None:
        try:
            changes = self.dispatcher.arrive(req, now)
        except OverloadedError:  # its app's queue for the model is full: refused, as the arbiter's 429
            self.rejected[req.agent_key] = self.rejected.get(req.agent_key, 0) + 1
            return
        self._apply(changes)

    def _apply(self, changes: Changes) -> None:
        for ticket in changes.started:
            req = ticket.request
            self.joining[req.model].append(req)
            self.order[req.model].append(req.id)
        self.records.extend(ticket.record() for ticket in changes.ended)

    def _start_steps(self, now: float) -> None:
        """Every idle engine admits what was dispatched to it and starts a step (continuous batching)."""
        for model, engine in self.engines.items():
            if engine.busy:
                continue
            joining = self.joining[model]
            if joining:
                output = self.output
                for req in joining:
                    engine.admit(req, output[req.id])
                joining.clear()
            end = engine.start_step(now)
            if end is not None:
                self.push(end, self._STEP, model)
            elif self.policy.queued(model) and (self.pool is None or self.dispatcher.pool_running < self.pool):
                self.idle_with_backlog += 1

    def _step_done(self, model: str, now: float) -> None:
        # One token for every request of the step, in batch order; a request's end (and the
        # dispatches it frees room for) comes before the next request's token is charged.
        progress, finish = self.dispatcher.progress, self.dispatcher.finish
        for state in self.engines[model].end_step():
            progress(state.request.id, 1, now)
            if state.generated >= state.output_tokens:
                self._apply(finish(state.request.id, now))

    def _cancel(self, req: Request, now: float) -> None:
        if self.dispatcher.ticket(req.id) is None:
            return  # it already ended
        if not self.engines[req.model].abort(req.id) and req in self.joining[req.model]:
            self.joining[req.model].remove(req)
        self._apply(self.dispatcher.cancel(req.id, now))

    def _charge(self, now: float, req: Request, amount: float) -> None:
        agent = req.agent
        self._add_charge(Charge(now, agent.app.name, agent.name, amount))
