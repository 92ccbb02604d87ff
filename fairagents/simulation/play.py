"""The simulator's event loop: the dispatcher decides, simulated engines run and workflow runs advance."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from fairagents.admission import Statera
from fairagents.cost import UnifiedTokenCost
from fairagents.dispatcher import Dispatcher
from fairagents.engines.sim import SimEngine
from fairagents.errors import OverloadedError, UnknownAgentError, UnknownAppError, UnknownModelError
from fairagents.identity import Agent, App
from fairagents.metrics import Charge
from fairagents.policies import Policy
from fairagents.policies.devices import Devices
from fairagents.records import Changes, RequestRecord
from fairagents.request import Request
from fairagents.simulation.result import SimResult
from fairagents.simulation.workflows import Call, Shape, SimRun, UserGroup, Workflows
from fairagents.simulation.workload import SimRequest

__all__ = ["Flows", "LiveRun", "Player", "VirtualClock", "check_call", "check_who"]


class VirtualClock:
    """The virtual clock the engines' seats of the policy read (``PoolPolicy(clock=...)``)."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Player:
    """Plays events on a virtual clock: the dispatcher decides, simulated engines run."""

    _STEP, _ARRIVAL, _CANCEL = 0, 1, 2  # order of events at the same instant

    def __init__(
        self, policy: Policy, engines: Mapping[str, SimEngine], cost: UnifiedTokenCost, pool: int | None,
        admission: Statera | None = None, max_queued: Mapping[str, int] | None = None,
        devices: Devices | None = None, clock: VirtualClock | None = None, serial: Mapping[str, str] | None = None,
    ) -> None:
        self.policy: Policy = policy if devices is None else devices  # type: ignore[assignment]
        self.devices = devices
        self.clock = clock if clock is not None else VirtualClock()
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
        self.flows: Flows | None = None
        self.apps: dict[str, App] = {}
        self.agents: dict[tuple[str, str], Agent] = {}

    def push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self.events, (t, kind, next(self.seq), payload))

    def play(self, requests: list[tuple[SimRequest, Request]], flows: Flows | None = None) -> SimResult:
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
class LiveRun:
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


class Flows:
    """The workflow driver of a simulation: starts runs, and each stage when the previous one has ended."""

    def __init__(self, workflows: Workflows, engines: Mapping[str, SimEngine], apps: Mapping[str, App] | None) -> None:
        for shape in workflows.shapes():
            for call in shape.calls:
                check_call(call, engines, apps)
        self.workflows = workflows
        self.live: dict[str, LiveRun] = {}
        self.done: list[SimRun] = []
        self.users: list[tuple[UserGroup, str]] = []  # (its group, its name "<group>.<index>")
        self.count: dict[int, int] = {}  # runs started per user
        self.sim: Player | None = None

    def start(self, sim: Player) -> None:
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
        live = LiveRun(run_id, shape.app.name, shape.label, user, at, stages)
        self.live[run_id] = live
        self._stage(live, at)

    def _stage(self, live: LiveRun, at: float) -> None:
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


def check_who(model: str, agent: Agent, engines: Mapping[str, SimEngine], apps: Mapping[str, App] | None) -> None:
    """Raise if ``model`` is not simulated, or ``agent``'s app is not the declared one (when apps are declared)."""
    if model not in engines:
        raise UnknownModelError.among(model, engines)
    if apps is not None:
        app = apps.get(agent.app.name)
        if app is None:
            raise UnknownAppError(f"unknown app {agent.app.name!r}")
        if agent.app != app:
            raise UnknownAgentError(f"agent {agent.name!r} does not belong to the declared app {app.name!r}")


def check_call(call: Call, engines: Mapping[str, SimEngine], apps: Mapping[str, App] | None) -> None:
    """Raise if ``call`` names an unknown model or app, or can never fit its engine."""
    check_who(call.model, call.agent, engines, apps)
    prompt, max_tokens = call.longest
    engines[call.model].check(Request("check", call.agent, call.model, prompt, max_tokens, 0.0))
