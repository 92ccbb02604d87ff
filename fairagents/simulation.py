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

Beside timed requests (:class:`Workload`) it plays runs of agent workflows
(:class:`Workflows`, :func:`simulate_workflows`): a run is stages of calls
(:class:`Shape`), each stage arriving when the previous one has fully finished, every
call carrying the run's id; closed-loop users start their next run when one completes.

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
from collections.abc import Mapping, Sequence
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
from fairagents.policies.devices import Devices, policy_factory
from fairagents.policies.pooled import EngineTally, PoolPolicy
from fairagents.records import Changes, RequestRecord
from fairagents.request import Request

__all__ = [
    "Call", "Shape", "SimRequest", "SimResult", "SimRun", "UserGroup", "Workflows", "Workload", "simulate",
    "simulate_workflows",
]

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


@dataclass(frozen=True, slots=True)
class Call:
    """One model call of a workflow stage; its lengths are drawn when its run starts."""

    agent: Agent
    model: str
    prompt: Length
    output: Length
    max_tokens: int | None = None
    """What the call asks for (≥ its longest output; default: exactly its output)."""

    def __post_init__(self) -> None:
        for what, length in (("prompt", self.prompt), ("output", self.output)):
            low = length if isinstance(length, int) else length[0]
            high = length if isinstance(length, int) else length[1]
            if isinstance(low, bool) or not isinstance(low, int) or not isinstance(high, int) or low > high \
                    or low < (1 if what == "output" else 0):
                raise InvalidParameterError(f"{what} must be an integer or an inclusive (low, high) range of "
                                            f"integers ≥ {1 if what == 'output' else 0}, got {length!r}")
        _check_max_tokens(self.max_tokens, self.output)

    @property
    def longest(self) -> tuple[int, int]:
        """``(longest prompt, max_tokens)``: the most this call can hold in an engine."""
        prompt = self.prompt if isinstance(self.prompt, int) else self.prompt[1]
        output = self.output if isinstance(self.output, int) else self.output[1]
        return prompt, output if self.max_tokens is None else self.max_tokens


@dataclass(frozen=True, slots=True)
class Shape:
    """What a run of a workflow does: stages of calls, each starting when the previous one has fully finished.

    The calls of a stage arrive together (a fan-out); a stage of one call after another
    is a chain. Every call of a shape belongs to one app, the run's. ``label`` is the
    run's class in reports (``"single"``, ``"chain6"``, ``"fanout16"``).

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.simulation import Shape
        >>> app = fa.App("news")
        >>> fan = Shape.fanout(fa.Agent("writer", app), fa.Agent("editor", app), "chat", 16, prompt=64, output=32)
        >>> fan.label, [len(stage) for stage in fan.stages]
        ('fanout16', [16, 1])
        >>> Shape.chain(fa.Agent("bot", app), "chat", 6, prompt=64, output=32).label
        'chain6'
    """

    label: str
    stages: tuple[tuple[Call, ...], ...]

    def __post_init__(self) -> None:
        if not self.stages or not all(self.stages):
            raise InvalidParameterError("a workflow shape needs at least one stage, and every stage a call")
        apps = {call.agent.app for stage in self.stages for call in stage}
        if len(apps) != 1:
            raise InvalidParameterError(f"every call of a run belongs to one app, got {sorted(a.name for a in apps)}")

    @property
    def app(self) -> App:
        """The app whose run this is."""
        return self.stages[0][0].agent.app

    @property
    def calls(self) -> list[Call]:
        return [call for stage in self.stages for call in stage]

    @classmethod
    def chain(cls, agent: Agent | Sequence[Agent], model: str, n: int = 1, *, prompt: Length, output: Length,
              max_tokens: int | None = None, label: str | None = None) -> Shape:
        """``n`` calls one after another (by ``agent``, or cycling through several); ``"single"`` or ``"chain<n>"``."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidParameterError(f"a chain has n ≥ 1 calls, got {n!r}")
        agents = [agent] if isinstance(agent, Agent) else list(agent)
        stages = tuple((Call(agents[i % len(agents)], model, prompt, output, max_tokens),) for i in range(n))
        return cls(label or ("single" if n == 1 else f"chain{n}"), stages)

    @classmethod
    def fanout(cls, fan: Agent, join: Agent, model: str, k: int, *, prompt: Length, output: Length,
               join_prompt: Length | None = None, join_output: Length | None = None, entry: Agent | None = None,
               max_tokens: int | None = None, label: str | None = None) -> Shape:
        """An optional ``entry`` call, ``k`` parallel calls by ``fan``, then one by ``join``: ``"fanout<k>"``."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidParameterError(f"a fan-out has k ≥ 1 parallel calls, got {k!r}")
        stages = [(Call(fan, model, prompt, output, max_tokens),) * k,
                  (Call(join, model, prompt if join_prompt is None else join_prompt,
                        output if join_output is None else join_output, max_tokens),)]
        if entry is not None:
            stages.insert(0, (Call(entry, model, prompt, output, max_tokens),))
        return cls(label or f"fanout{k}", tuple(stages))


Mix = Shape | Sequence[tuple[float, Shape]]
"""One shape, or ``(weight, shape)`` pairs a run draws its shape from."""


@dataclass(frozen=True, slots=True)
class SimRun:
    """One run of a workflow as the simulator played it (times in virtual seconds, service in unified tokens)."""

    id: str
    """The run id every call of it carried (``Request.run``)."""
    app: str
    label: str
    """Its class (the shape's label)."""
    start: float
    """When its first stage arrived."""
    end: float
    """When its last call ended."""
    calls: int
    service: float
    """Unified tokens charged for its calls."""
    user: str | None = None
    """The closed-loop user that started it (``None``: an open-loop run)."""
    refused: int = 0
    """Calls refused by the app's ``max_queued`` bound (the run went on without them)."""

    @property
    def duration(self) -> float:
        """Run completion time: ``end - start``."""
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class UserGroup:
    """Closed-loop users of one mix (:meth:`Workflows.users`)."""

    mix: tuple[tuple[float, Shape], ...]
    n: int
    until: float
    start: float
    think: float
    stagger: float
    name: str


class Workflows:
    """Runs of agent workflows: open-loop (at given times, or Poisson) and closed-loop users.

    A closed-loop user starts a run, waits for it to complete, thinks for ``think``
    seconds and starts the next, until ``until``. What each run does (its shape from the
    mix and its lengths) depends only on the seed and the run's place in its user's
    sequence, so every policy simulated plays the same runs. Run ids are ``o<i>`` for
    the ``i``-th open-loop run and ``u<j>.<k>`` for closed-loop user ``j``'s ``k``-th.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.simulation import Shape, Workflows, simulate_workflows
        >>> app = fa.App("news")
        >>> single = Shape.chain(fa.Agent("desk", app), "chat", prompt=64, output=16)
        >>> fan = Shape.fanout(fa.Agent("writer", app), fa.Agent("editor", app), "chat", 4, prompt=64, output=16)
        >>> flows = Workflows(seed=1).users([(0.7, single), (0.3, fan)], n=3, until=5.0)
        >>> result = simulate_workflows(flows, "hmfs", {"chat": fa.engines.SimEngine(fa.ModelProfile(4096, 1))})
        >>> {r.label for r in result.runs} == {"single", "fanout4"}, all(r.end > r.start for r in result.runs)
        (True, True)
    """

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        self.open: list[tuple[float, tuple[tuple[float, Shape], ...]]] = []
        """Open-loop runs: start time and mix."""
        self.closed: list[UserGroup] = []
        """Closed-loop user groups, in the order added."""
        self._rng = random.Random(seed)

    def run(self, mix: Mix, *, at: float = 0.0) -> Workflows:
        """One run starting at ``at``."""
        self.open.append((_time(at, "at"), _mix(mix)))
        return self

    def poisson(self, mix: Mix, *, rate: float, until: float, start: float = 0.0) -> Workflows:
        """Runs starting as a Poisson process of ``rate`` per second over ``[start, until)``."""
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise InvalidParameterError(f"rate must be > 0 runs per second, got {rate!r}")
        shapes = _mix(mix)
        t = _time(start, "start") + self._rng.expovariate(rate)
        while t < until:
            self.open.append((t, shapes))
            t += self._rng.expovariate(rate)
        return self

    def users(self, mix: Mix, *, n: int, until: float, start: float = 0.0, think: float = 0.0,
              stagger: float = 0.0, name: str | None = None) -> Workflows:
        """``n`` users each starting runs back to back from ``start`` (or up to ``stagger`` s later) until ``until``.

        A user starts no run at or after ``until``; runs in progress then complete.
        ``think`` is the pause between a run's end and the user's next run.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidParameterError(f"n must be an integer ≥ 1 users, got {n!r}")
        for what, value in (("think", think), ("stagger", stagger)):
            _time(value, what)
        shapes = _mix(mix)
        self.closed.append(UserGroup(shapes, n, _time(until, "until"), _time(start, "start"), think, stagger,
                                  name or f"{shapes[0][1].app.name}{len(self.closed)}"))
        return self

    def user_names(self) -> list[tuple[UserGroup, str]]:
        """Every closed-loop user, in order (user ``i``'s runs are ``u<i>.0``, ``u<i>.1``, …): its group and name."""
        return [(group, f"{group.name}.{u}") for group in self.closed for u in range(group.n)]

    def first_start(self, user: int) -> float:
        """When closed-loop user ``user`` starts its first run."""
        group = self.user_names()[user][0]
        if not group.stagger:
            return group.start
        return group.start + random.Random(f"{self.seed}/s{user}").uniform(0.0, group.stagger)

    def draw(
        self, run_id: str, mix: tuple[tuple[float, Shape], ...]
    ) -> tuple[Shape, list[list[tuple[Call, int, int]]]]:
        """Run ``run_id``'s shape from ``mix`` and, per stage, its calls with drawn prompt and output lengths.

        A function of the seed and the run id alone: every policy, and the real engine, play the same run.
        """
        rng = random.Random(f"{self.seed}/{run_id}")
        shape = mix[0][1] if len(mix) == 1 else rng.choices([s for _, s in mix], [w for w, _ in mix])[0]
        return shape, [[(call, _draw(rng, call.prompt), _draw(rng, call.output)) for call in stage]
                       for stage in shape.stages]

    def shapes(self) -> list[Shape]:
        """Every shape a run may take."""
        return [shape for _, mix in self.open for _, shape in mix] + [s for u in self.closed for _, s in u.mix]


def _time(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise InvalidParameterError(f"{what} must be a finite number of seconds ≥ 0, got {value!r}")
    return float(value)


def _mix(mix: Mix) -> tuple[tuple[float, Shape], ...]:
    pairs = ((1.0, mix),) if isinstance(mix, Shape) else tuple((float(w), s) for w, s in mix)
    if not pairs or any(not isinstance(s, Shape) or not w > 0 for w, s in pairs):
        raise InvalidParameterError("a mix is a Shape or (weight > 0, Shape) pairs")
    return pairs


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
    workflows: Workflows | None = None,
    devices: Mapping[str, str] | None = None,
    serial: Mapping[str, str] | None = None,
) -> SimResult:
    """Run ``workload`` through ``policy`` on ``engines`` (one per model) to the end.

    Args:
        workload: the timed requests.
        policy: a policy name (built with this run's unified cost) or a policy object.
        engines: model name → simulated engine (not shared between models).
        apps: if given, the only apps (and their agents, as :class:`Agent` objects in
            the workload) allowed; otherwise every app in the workload is allowed.
        d_base: ``d_base`` of the unified-token cost (default 4096).
        pool_running: most requests running across all ``"vllm"`` engines at once (the models
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
        workflows: runs of agent workflows played beside ``workload``
            (:func:`simulate_workflows`); each run is recorded in :attr:`SimResult.runs`.
        devices: model name → its device (:mod:`fairagents.policies.devices`), as
            ``Arbiter.add_model(..., device=...)``: the engines of one device take one
            order with one set of counters (an engine holds back a client that is ahead
            while one owed more waits on another engine of the device; it looks again
            after every step), and they time-share it: one step of one of them runs at
            a time, the engines with work taking turns. Separate devices keep separate
            policies and step in parallel. ``None``: each engine is a device of its own.
        serial: model name → a group name: the engines of one group step one at a time
            (default: those of one device). The hardware may differ from the accounting:
            on one CPU, vLLM's in-process engines step one at a time (vLLM's forward
            context is global to the process) while a diffusion engine runs beside them.

    Engines with ``scheduler="fair"`` (:class:`~fairagents.engines.SimEngine`) model the
    default serving path: each request is handed to its engine as it arrives (within
    its app's share), and the engine orders, admits and preempts by its device's seat
    of the policy. With ``"vllm"`` engines, the dispatcher decides what each engine
    runs, as the arbiter does for ``VLLMEngine(scheduler="vllm")`` and for engines that
    do not schedule themselves (diffusers, remote replicas).

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
    fair = sorted(m for m, e in engines.items() if e.scheduler == "fair")
    if fair and (pool_running is not None or admission is not None):
        raise InvalidParameterError(
            f"pool_running and admission shape the dispatcher's admission; the engines of {', '.join(fair)} "
            "(scheduler='fair') admit by the policy themselves: use scheduler='vllm' engines with them")
    layout, clock = None, _Clock()
    if devices is not None or fair:
        if devices is not None and set(devices) != set(engines):
            raise InvalidParameterError(f"devices must name the device of every model and no other: got "
                                        f"{sorted(devices)} for {sorted(engines)}")
        layout = Devices(policy_factory(policy, policy_obj, cost), PoolPolicy(policy_obj, cost, clock=clock), cost)
        for model in engines:
            layout.assign(model, model if devices is None else devices[model])
            layout.seat(model).register(model, engines[model].profile)
    if serial is not None and set(serial) != set(engines):
        raise InvalidParameterError(f"serial must name the group of every model and no other: got {sorted(serial)} "
                                    f"for {sorted(engines)}")
    groups = dict(serial) if serial is not None else dict(devices) if devices is not None else {m: m for m in engines}
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
    flows = _Flows(workflows, engines, apps) if workflows is not None else None
    run = _Run(policy_obj, engines, cost, pool_running, controller, bounds, layout, clock, groups)
    return run.play(requests, flows)


class _Clock:
    """The virtual clock the engines' seats of the policy read (``PoolPolicy(clock=...)``)."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def simulate_workflows(
    workflows: Workflows, policy: str | Policy, engines: Mapping[str, SimEngine], *, workload: Workload | None = None,
    **options: object,
) -> SimResult:
    """Play ``workflows`` (and an open-loop ``workload`` beside them, if given) through ``policy`` on ``engines``.

    Every call of a run carries the run's id (``Request.run``); a stage's calls arrive
    together the moment the previous stage's last call ends (a refused call counts as
    ended). :attr:`SimResult.runs` holds a :class:`SimRun` per run. ``options`` are
    :func:`simulate`'s (``apps``, ``d_base``, ``pool_running``, ``admission``,
    ``max_queued``).

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.simulation import Shape, Workflows, simulate_workflows
        >>> bot = fa.Agent("bot", fa.App("x"))
        >>> flows = Workflows().run(Shape.chain(bot, "chat", 3, prompt=16, output=4), at=1.0)
        >>> result = simulate_workflows(flows, "fcfs", {"chat": fa.engines.SimEngine(fa.ModelProfile(4096, 1))})
        >>> [(r.label, r.calls, r.start) for r in result.runs]
        [('chain3', 3, 1.0)]
    """
    return simulate(workload or Workload(), policy, engines, workflows=workflows, **options)  # type: ignore[arg-type]


def _validate(
    workload: Workload, engines: Mapping[str, SimEngine], apps: Mapping[str, App] | None
) -> list[tuple[SimRequest, Request]]:
    out = []
    for i, item in enumerate(workload.requests):
        _check_who(item.model, item.agent, engines, apps)
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
        devices: Devices | None = None, clock: _Clock | None = None, serial: Mapping[str, str] | None = None,
    ) -> None:
        self.policy: Policy = policy if devices is None else devices  # type: ignore[assignment]
        self.devices = devices
        self.clock = clock if clock is not None else _Clock()
        self.engines = engines
        self.cost = cost
        self.pool = pool
        self.charges: list[Charge] = []
        self._add_charge = self.charges.append
        self.admission = admission
        self.dispatcher = Dispatcher(self.policy, cost, pool_slots=pool, charge=self._charge, admission=admission,
                                     queue_bound=max_queued.get if max_queued else None,
                                     device_hold=None if devices is None else devices.holds)
        for model, engine in engines.items():
            if engine.scheduler == "fair":  # handed every request at once; it orders them by its device's seat
                assert devices is not None
                engine.bind(devices.seat(model), model)
                self.dispatcher.add_model(model, engine.profile, slots=engine.max_running, token_budget=None,
                                          max_model_len=engine.max_model_len, in_engine=True,
                                          kv_tokens=engine.kv_capacity)
                continue
            # The engine's batch and KV capacity are the dispatcher's slots and token budget.
            self.dispatcher.add_model(model, engine.profile, slots=engine.max_running,
                                      token_budget=engine.kv_capacity, max_model_len=engine.max_model_len)
        # The engines of a group (by default, a device) step one at a time, taking turns.
        by_device: dict[str, list[str]] = {}
        for model in engines:
            by_device.setdefault(serial[model] if serial is not None else model, []).append(model)
        self.device_engines = list(by_device.values())
        self.turn = [0] * len(self.device_engines)
        self.joining: dict[str, list[Request]] = {m: [] for m in engines}  # dispatched; join at the next step
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = itertools.count()
        self.output: dict[str, int] = {}
        self.records: list[RequestRecord] = []
        self.order: dict[str, list[str]] = {m: [] for m in engines}
        self.idle_with_backlog = 0
        self.rejected: dict[tuple[str, str], int] = {}
        self.flows: _Flows | None = None
        self.apps: dict[str, App] = {}
        self.agents: dict[tuple[str, str], Agent] = {}

    def push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self.events, (t, kind, next(self.seq), payload))

    def play(self, requests: list[tuple[SimRequest, Request]], flows: _Flows | None = None) -> SimResult:
        apps, agents = self.apps, self.agents
        if flows is not None:
            self.flows = flows
            flows.start(self)
        for item, req in requests:
            apps[req.app] = req.agent.app
            agents[req.agent_key] = req.agent
            self.output[req.id] = item.output_tokens
            self.push(item.at, self._ARRIVAL, req)
            if item.cancel_at is not None:
                self.push(max(item.cancel_at, item.at), self._CANCEL, req)
        now = 0.0
        clock = self.clock
        while self.events:
            now, kind, _, payload = heapq.heappop(self.events)
            clock.now = now
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
            fair_preemptions=sum(e.fair_preemptions for e in self.engines.values()),
            admission=self.admission,
            rejected=self.rejected,
            runs=flows.done if flows is not None else [],
            tallies={m: self.devices.seat(m).tally(m) for m, e in self.engines.items()
                     if e.scheduler == "fair" and self.devices is not None},
        )

    def _arrive(self, req: Request, now: float) -> None:
        try:
            changes = self.dispatcher.arrive(req, now)
        except OverloadedError:  # its app's queue for the model is full: refused, as the arbiter's 429
            self.rejected[req.agent_key] = self.rejected.get(req.agent_key, 0) + 1
            if self.flows is not None and req.run is not None:
                self.flows.ended(req, now, refused=True)
            return
        self._apply(changes, now)

    def _apply(self, changes: Changes, now: float) -> None:
        for ticket in changes.started:
            req = ticket.request
            self.joining[req.model].append(req)
            self.order[req.model].append(req.id)
        self.records.extend(ticket.record() for ticket in changes.ended)
        if self.flows is not None:
            for ticket in changes.ended:
                if ticket.request.run is not None:
                    self.flows.ended(ticket.request, now)

    def _start_steps(self, now: float) -> None:
        """Every idle device's engines admit what was handed to them, and the next in turn with work starts a step.

        (Continuous batching; a device runs one engine's step at a time, its engines taking turns.)
        """
        engines = self.engines
        for i, models in enumerate(self.device_engines):
            if len(models) > 1 and any(engines[m].busy for m in models):
                continue  # the device is busy: its other engines wait for it
            n, turn = len(models), self.turn[i]
            for k in range(n):
                model = models[(turn + k) % n]
                engine = engines[model]
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
                    if n > 1:
                        self.turn[i] = (turn + k + 1) % n
                        break
                elif self._backlogged(model, engine):
                    self.idle_with_backlog += 1  # idle with a request it may run (one held for its device may not)

    def _backlogged(self, model: str, engine: SimEngine) -> bool:
        if engine.scheduler == "fair":
            return engine.waiting > 0 and not engine.held_by_device
        return bool(self.policy.queued(model) and model not in self.dispatcher.device_held
                    and (self.pool is None or self.dispatcher.pool_running < self.pool))

    def _step_done(self, model: str, now: float) -> None:
        # One token for every request of the step, in batch order; a request's end (and the
        # dispatches it frees room for) comes before the next request's token is charged.
        progress, finish = self.dispatcher.progress, self.dispatcher.finish
        for state in self.engines[model].end_step():
            progress(state.request.id, 1, now)
            if state.generated >= state.output_tokens:
                self._apply(finish(state.request.id, now), now)
        if self.dispatcher.device_held:  # the step moved the counters: a model held for its device looks again
            self._apply(self.dispatcher.refill(now), now)

    def _cancel(self, req: Request, now: float) -> None:
        if self.dispatcher.ticket(req.id) is None:
            return  # it already ended
        if not self.engines[req.model].abort(req.id) and req in self.joining[req.model]:
            self.joining[req.model].remove(req)
        self._apply(self.dispatcher.cancel(req.id, now), now)

    def _charge(self, now: float, req: Request, amount: float) -> None:
        agent = req.agent
        self._add_charge(Charge(now, agent.app.name, agent.name, amount, req.model))
        if req.run is not None and self.flows is not None:
            self.flows.charge(req.run, amount)


@dataclass(slots=True)
class _Live:
    """A run in progress: its drawn stages, the one running, and what it has received."""

    id: str
    app: str
    label: str
    user: int | None
    start: float
    stages: list[list[tuple[Call, int, int]]]
    """Per stage, its calls with their drawn prompt and output lengths."""
    stage: int = 0
    pending: int = 0
    calls: int = 0
    service: float = 0.0
    refused: int = 0


class _Flows:
    """The workflow driver of a simulation: starts runs, and each stage when the previous one has ended."""

    def __init__(self, workflows: Workflows, engines: Mapping[str, SimEngine], apps: Mapping[str, App] | None) -> None:
        for shape in workflows.shapes():
            for call in shape.calls:
                _check_call(call, engines, apps)
        self.workflows = workflows
        self.live: dict[str, _Live] = {}
        self.done: list[SimRun] = []
        self.users: list[tuple[UserGroup, str]] = []  # (its group, its name "<group>.<index>")
        self.count: dict[int, int] = {}  # runs started per user
        self.sim: _Run | None = None

    def start(self, sim: _Run) -> None:
        self.sim = sim
        for shape in self.workflows.shapes():
            for call in shape.calls:
                sim.apps[call.agent.app.name] = call.agent.app
                sim.agents[call.agent.key] = call.agent
        for i, (at, mix) in enumerate(self.workflows.open):
            self._begin(f"o{i}", mix, at, None)
        self.users = self.workflows.user_names()
        for user, (group, _) in enumerate(self.users):
            self.count[user] = 0
            at = self.workflows.first_start(user)
            if at < group.until:
                self._next(user, at)

    def _next(self, user: int, at: float) -> None:
        """The user's next run; its shape and lengths depend only on the seed, the user and its count."""
        k = self.count[user]
        self.count[user] = k + 1
        run_id = f"u{user}.{k}"
        self._begin(run_id, self.users[user][0].mix, at, user)

    def _begin(self, run_id: str, mix: tuple[tuple[float, Shape], ...], at: float, user: int | None) -> None:
        shape, stages = self.workflows.draw(run_id, mix)
        live = _Live(run_id, shape.app.name, shape.label, user, at, stages)
        self.live[run_id] = live
        self._stage(live, at)

    def _stage(self, live: _Live, at: float) -> None:
        sim = self.sim
        assert sim is not None
        stage = live.stages[live.stage]
        live.pending = len(stage)
        live.calls += len(stage)
        for c, (call, prompt, output) in enumerate(stage):
            max_tokens = output if call.max_tokens is None else call.max_tokens
            req = Request(f"{live.id}/{live.stage}.{c}", call.agent, call.model, prompt, max_tokens, at, run=live.id)
            sim.output[req.id] = output
            sim.push(at, sim._ARRIVAL, req)

    def ended(self, req: Request, now: float, *, refused: bool = False) -> None:
        live = self.live.get(req.run)  # type: ignore[arg-type]
        if live is None:
            return
        live.refused += refused
        live.pending -= 1
        if live.pending:
            return
        live.stage += 1
        if live.stage < len(live.stages):
            self._stage(live, now)
            return
        del self.live[live.id]
        user = None if live.user is None else self.users[live.user]
        self.done.append(SimRun(live.id, live.app, live.label, live.start, now, live.calls, live.service,
                                   user[1] if user else None, live.refused))
        if user is not None:
            at = now + user[0].think
            if at < user[0].until:
                self._next(live.user, at)  # type: ignore[arg-type]

    def charge(self, run: str, amount: float) -> None:
        live = self.live.get(run)
        if live is not None:
            live.service += amount


def _draw(rng: random.Random, length: Length) -> int:
    return length if isinstance(length, int) else rng.randint(*length)


def _check_who(model: str, agent: Agent, engines: Mapping[str, SimEngine], apps: Mapping[str, App] | None) -> None:
    """Raise if ``model`` is not simulated, or ``agent``'s app is not the declared one (when apps are declared)."""
    if model not in engines:
        raise UnknownModelError.among(model, engines)
    if apps is not None:
        app = apps.get(agent.app.name)
        if app is None:
            raise UnknownAppError(f"unknown app {agent.app.name!r}")
        if agent.app != app:
            raise UnknownAgentError(f"agent {agent.name!r} does not belong to the declared app {app.name!r}")


def _check_call(call: Call, engines: Mapping[str, SimEngine], apps: Mapping[str, App] | None) -> None:
    """Raise if ``call`` names an unknown model or app, or can never fit its engine."""
    _check_who(call.model, call.agent, engines, apps)
    prompt, max_tokens = call.longest
    engines[call.model].check(Request("check", call.agent, call.model, prompt, max_tokens, 0.0))
