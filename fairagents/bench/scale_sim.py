"""Arbiters × replicas, simulated: the shared fair share's fairness and overhead at scale.

``A`` doors (arbiters, each a :class:`~fairagents.dispatcher.Dispatcher` with HMFS and a
:class:`~fairagents.shared.SharedView`) stand in front of one model served by ``R``
replicas (one :class:`~fairagents.engines.SimEngine` each, ``slots_per_replica`` in its
batch). Every door registers the model with all ``R × slots_per_replica`` slots; the
doors draw on them through the store's leases, and the gate holds a dispatch back when
it is not the pool's turn. A dispatched request goes to the replica with the fewest
requests (running or about to join; the true load, as the simulator knows it: a real
door knows only its own requests and what the last sync said). The whole run is one
deterministic event loop on a virtual clock; the store is a
:class:`~fairagents.shared.MemoryStore` on that clock.

How doors sync, the unshared baseline (``shared=False``: each door its own HMFS
counters and a fixed ``1/A`` of the slots), the closed-loop workload and the bound
``2 (U / w_min + S)`` the gap is checked against are described in the docs' API
reference (*Simulation and metrics*: *Arbiters × replicas, simulated*).

Examples:
    >>> from fairagents.bench.scale_sim import simulate_doors
    >>> row = simulate_doors(2, replicas=2, slots_per_replica=4, agents=20, apps=2, seconds=2.0)
    >>> row.served > 0 and row.gap <= row.bound and row.peak_running <= row.slots
    True
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fairagents.cost import ModelProfile, UnifiedTokenCost
from fairagents.dispatcher import Dispatcher
from fairagents.engines.sim import SimEngine
from fairagents.errors import InvalidParameterError
from fairagents.identity import Agent, App
from fairagents.metrics import _intersect, _merge, jain_index, percentile
from fairagents.policies.hmfs import HMFS
from fairagents.records import Changes
from fairagents.request import Request
from fairagents.shared import MemoryStore, SharedView, staleness_bound

__all__ = ["MODEL", "OUTPUT", "PROFILE", "PROMPT", "WALL_FIELDS", "ScaleRow", "run_simulated", "simulate_doors"]

#: The one model the replicas serve, and its profile (a Llama-3.1-8B-like shape).
MODEL, PROFILE = "chat", ModelProfile(d_model=4096, n_layers=32)
#: Prompt and output lengths, inclusive ranges of raw tokens.
PROMPT, OUTPUT = (16, 128), (4, 32)
#: Fields of :class:`ScaleRow` measured on the wall clock (they differ between identical runs).
WALL_FIELDS = ("dispatch_p50_us", "dispatch_p99_us", "sync_p50_us", "sync_p99_us", "door_sync_us", "wall_s")
_TTL_MS, _SIZE_EVERY, _RAMP = 2000, 16, 0.05
_STEP, _REPLY, _STORE, _SEND, _ARRIVAL = range(5)  # order of events at one instant


@dataclass(frozen=True, slots=True)
class ScaleRow:
    """One simulated run of :func:`simulate_doors`."""

    doors: int
    """Arbiters in front of the replicas."""
    shared: bool
    """Counters and slots shared through the store (``False``: own counters, a fixed 1/A of the slots per door)."""
    replicas: int
    """Replicas of the model (one simulated engine each)."""
    slots: int
    """The model's slots: replicas × slots per replica (requests)."""
    agents: int
    """Agents (closed loops)."""
    apps: int
    """Apps."""
    seconds: float
    """Simulated duration (virtual seconds)."""
    gap: float
    """Largest weight-normalised service gap between two backlogged apps over any interval (unified tokens / weight)."""
    u: float
    """``U``: a door's ``Dispatcher.bound()`` over all the slots (unified tokens)."""
    s: float
    """``S``: the staleness term (counter units: unified tokens / weight); 0 for one door or without sharing."""
    bound: float
    """``2 (U / w_min + S)`` (unified tokens / weight)."""
    ratio: float
    """``gap / bound`` (below 1: within the bound)."""
    jain: float
    """Jain's index of the apps' weight-normalised service after the warm-up (1: exactly by weight; NaN: none)."""
    service: tuple[float, ...]
    """Service delivered to each app after the warm-up, in app order (unified tokens)."""
    requests: int
    """Requests sent."""
    served: int
    """Requests that finished (each once)."""
    served_twice: int
    """Requests that finished more than once (0)."""
    in_flight: int
    """Requests waiting or running at the end."""
    throughput: float
    """Requests finished per simulated second after the warm-up."""
    tokens_per_s: float
    """Output tokens generated per simulated second after the warm-up (raw tokens)."""
    busy: float
    """Mean fraction of the slots holding a request after the warm-up (time-weighted; 1: never a slot idle)."""
    peak_running: int
    """Most requests in the replicas at once, counted on the replicas (at most ``slots``)."""
    dispatch_events: int
    """Dispatcher events that decide dispatches (arrivals, completions, refills after a sync)."""
    dispatch_p50_us: float
    """Median wall time of one such event, policy and gate included (µs)."""
    dispatch_p99_us: float
    """99th percentile of the same (µs)."""
    syncs: int
    """Store steps (syncs) in the run, the doors' first ones included."""
    sync_p50_us: float
    """Median wall time of one store step, ``MemoryStore.apply`` (µs; NaN without sharing)."""
    sync_p99_us: float
    """99th percentile of the same (µs)."""
    door_sync_us: float
    """Mean wall time a door spends per sync building its payload and applying the reply (µs)."""
    payload_bytes: float
    """Mean payload size as compact JSON (bytes; every 16th sync measured)."""
    reply_bytes: float
    """Mean reply size as compact JSON (bytes; the same syncs)."""
    wall_s: float
    """Wall seconds of the run, measurement included."""


def simulate_doors(
    doors: int,
    *,
    replicas: int = 64,
    slots_per_replica: int = 16,
    agents: int = 10_000,
    apps: int = 100,
    weights: Sequence[float] = (1.0, 2.0, 4.0),
    skew: float = 0.8,
    think: float = 0.0,
    seconds: float = 3.0,
    warmup: float = 0.5,
    interval: float = 0.02,
    delay: float = 0.001,
    seed: int = 0,
    shared: bool = True,
) -> ScaleRow:
    """Simulate ``doors`` arbiters in front of ``replicas`` replicas of one model (module docstring).

    Args:
        doors: arbiters (``A``).
        replicas: replicas of the model (``R``).
        slots_per_replica: each replica's batch (requests).
        agents: agents in all, spread evenly over ``apps`` (at least one each).
        apps: apps; app ``i`` has weight ``weights[i % len(weights)]``.
        weights: app weights, cycled.
        skew: fraction of each app's agents at its home door (``i mod A``), in (0, 1].
        think: seconds between an agent's request finishing and its next one.
        seconds: simulated duration.
        warmup: simulated seconds before service, throughput and occupancy are counted.
        interval: seconds between a reply and a door's next sync (``Δ``).
        delay: a sync's round trip in seconds (``ℓ``), half each way.
        seed: seed of the request lengths.
        shared: share counters and slots through the store; ``False``: each door keeps
            its own counters with a fixed 1/A of the slots (no store, no gate).

    Examples:
        >>> from fairagents.bench.scale_sim import simulate_doors
        >>> row = simulate_doors(2, replicas=2, slots_per_replica=2, agents=20, apps=2, seconds=2.0, shared=False)
        >>> row.doors, row.shared, row.s, row.served_twice
        (2, False, 0.0, 0)
    """
    for value, what in ((doors, "doors"), (replicas, "replicas"), (slots_per_replica, "slots per replica"),
                        (apps, "apps")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidParameterError(f"{what} must be an integer ≥ 1, got {value!r}")
    if isinstance(agents, bool) or not isinstance(agents, int) or agents < apps:
        raise InvalidParameterError(f"agents must be an integer ≥ apps ({apps}), got {agents!r}")
    if not (0 < skew <= 1 and 0 <= warmup < seconds and interval > 0 and delay >= 0 and think >= 0 and weights):
        raise InvalidParameterError(
            "need 0 < skew ≤ 1, 0 ≤ warmup < seconds, interval > 0, delay ≥ 0, think ≥ 0 and weights")
    if not shared and doors > replicas * slots_per_replica:
        raise InvalidParameterError(f"{doors} doors cannot each hold a part of {replicas * slots_per_replica} slots")
    sim = _Sim(doors, replicas, slots_per_replica, agents, apps, [float(w) for w in weights], skew, think, seed,
               shared)
    return sim.run(float(seconds), float(warmup), float(interval), float(delay))


def run_simulated(doors: Sequence[int] = (1, 2, 4, 8), *, baseline: bool = True, **options: object) -> list[ScaleRow]:
    """One row per door count with shared counters, after the baseline: one door, plain HMFS, no store.

    ``options`` go to :func:`simulate_doors` (``shared`` excluded).

    Examples:
        >>> from fairagents.bench.scale_sim import run_simulated
        >>> rows = run_simulated((2,), replicas=2, slots_per_replica=2, agents=20, apps=2, seconds=2.0)
        >>> [(r.doors, r.shared) for r in rows]
        [(1, False), (2, True)]
    """
    rows = [simulate_doors(1, shared=False, **options)] if baseline else []  # type: ignore[arg-type]
    return rows + [simulate_doors(a, shared=True, **options) for a in doors]  # type: ignore[arg-type]


class _Sim:
    """The event loop: doors decide, replicas step, syncs travel."""

    def __init__(self, n_doors: int, replicas: int, per: int, n_agents: int, n_apps: int, weights: list[float],
                 skew: float, think: float, seed: int, shared: bool) -> None:
        self.n_doors, self.per, self.slots, self.shared, self.think = n_doors, per, replicas * per, shared, think
        self.interval = self.delay = self.warmup = 0.0
        self.rng = random.Random(seed)
        self.cost = UnifiedTokenCost({MODEL: PROFILE})
        longest = PROMPT[1] + OUTPUT[1]
        self.engines = [SimEngine(PROFILE, max_running=per, kv_capacity=per * longest, max_model_len=longest)
                        for _ in range(replicas)]
        self.load = [0] * replicas  # requests running or about to join, per replica
        self.joining: list[list[tuple[Request, int]]] = [[] for _ in range(replicas)]
        self.dirty: set[int] = set()
        self.app_objs = [App(f"app-{i}", weight=weights[i % len(weights)]) for i in range(n_apps)]
        self.app_index = {a.name: i for i, a in enumerate(self.app_objs)}
        self.store = MemoryStore(clock=lambda: self.now)
        self.times, self.who, self.amounts = array("d"), array("i"), array("d")  # every charge
        self.views: list[SharedView] = []
        self.doors = [self._door(d, n_doors) for d in range(n_doors)]
        self.payload_us = [0.0] * n_doors  # building each door's payload in flight
        # Agents: app i's first `skew` at door i mod A, the rest round-robin over the other doors.
        self.agents: list[tuple[Agent, int]] = []
        each = n_agents // n_apps
        for i, app in enumerate(self.app_objs):
            home, at_home = i % n_doors, max(1, round(skew * each))
            for k in range(each):
                d = home if k < at_home or n_doors == 1 else (home + 1 + (k - at_home) % (n_doors - 1)) % n_doors
                self.agents.append((Agent(f"agent-{k}", app), d))
        self.owner: dict[str, tuple[int, int, int]] = {}  # request id -> (door, agent, output tokens)
        self.arrived: dict[str, float] = {}  # request id -> arrival, while it waits
        self.spans: list[list[tuple[float, float]]] = [[] for _ in range(n_apps)]  # backlog, per app
        self.finished: dict[str, int] = {}
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.running = self.peak = self.tokens = self.requests = self.done = 0
        self.area, self.last = 0.0, 0.0
        self.decide_us: list[float] = []
        self.store_us: list[float] = []
        self.door_us: list[float] = []
        self.sizes: list[tuple[int, int]] = []

    def _door(self, d: int, n: int) -> Dispatcher:
        """A door: HMFS, with a shared view as charge callback and gate, or alone with a fixed part of the slots."""
        policy = HMFS(self.cost)
        view = SharedView(f"door-{d}", policy) if self.shared else None
        to_view = None if view is None else view.charge
        times, who, amounts, index = self.times.append, self.who.append, self.amounts.append, self.app_index

        def charge(now: float, req: Request, amount: float) -> None:
            if to_view is not None:
                to_view(req, amount)
            times(now)
            who(index[req.app])
            amounts(amount)

        dispatcher = Dispatcher(policy, self.cost, charge=charge, gate=None if view is None else view.gate)
        slots = self.slots if self.shared else self.slots // n + (d < self.slots % n)
        dispatcher.add_model(MODEL, PROFILE, slots=slots, token_budget=None, max_model_len=PROMPT[1] + OUTPUT[1])
        if view is not None:
            view.bind(dispatcher, {MODEL})
            self.views.append(view)
        return dispatcher

    def push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self.events, (t, kind, next(self.seq), payload))

    def run(self, seconds: float, warmup: float, interval: float, delay: float) -> ScaleRow:
        wall = time.perf_counter()
        self.interval, self.delay, self.warmup, self.last = interval, delay, warmup, warmup
        for d, view in enumerate(self.views):  # the first sync, before serving (as SharedCounters.start)
            view.apply(self._store_step(view.payload(ttl=_TTL_MS, reconcile=True)))
            self.push(interval * (1 + d / self.n_doors), _SEND, d)
        for a in range(len(self.agents)):
            self.push(self.rng.uniform(0.0, _RAMP), _ARRIVAL, a)
        end, events, pop = seconds, self.events, heapq.heappop
        while events and events[0][0] <= end:
            now, kind, _, payload = pop(events)
            self.now = now
            if kind == _STEP:
                self._step(payload, now)  # type: ignore[arg-type]
            elif kind == _ARRIVAL:
                self._arrive(payload, now)  # type: ignore[arg-type]
            elif kind == _SEND:
                t = time.perf_counter()
                sent = self.views[payload].payload(ttl=_TTL_MS)  # type: ignore[index]
                self.payload_us[payload] = (time.perf_counter() - t) * 1e6  # type: ignore[index]
                self.push(now + self.delay / 2, _STORE, (payload, sent))
            elif kind == _STORE:
                d, sent = payload  # type: ignore[misc]
                self.push(now + self.delay / 2, _REPLY, (d, self._store_step(sent)))
            else:
                self._reply(*payload, now)  # type: ignore[misc]
            if self.dirty:
                self._start_steps(now)
        self._account(end)
        return self._row(end, time.perf_counter() - wall)

    def _store_step(self, payload: dict) -> dict:
        t = time.perf_counter()
        reply = self.store.apply(payload)
        self.store_us.append((time.perf_counter() - t) * 1e6)
        if len(self.store_us) % _SIZE_EVERY == 1:
            self.sizes.append((len(json.dumps(payload, separators=(",", ":"))),
                               len(json.dumps(reply, separators=(",", ":")))))
        return reply

    def _reply(self, d: int, reply: dict, now: float) -> None:
        t = time.perf_counter()
        self.views[d].apply(reply)
        self.door_us.append(self.payload_us[d] + (time.perf_counter() - t) * 1e6)
        t = time.perf_counter()
        changes = self.doors[d].refill(now)
        self.decide_us.append((time.perf_counter() - t) * 1e6)
        self._route(changes, now)
        self.push(now + self.interval, _SEND, d)

    def _arrive(self, a: int, now: float) -> None:
        agent, d = self.agents[a]
        rid = f"r{self.requests}"
        self.requests += 1
        output = self.rng.randint(*OUTPUT)
        req = Request(rid, agent, MODEL, self.rng.randint(*PROMPT), output, now)
        self.owner[rid] = (d, a, output)
        self.arrived[rid] = now
        t = time.perf_counter()
        changes = self.doors[d].arrive(req, now)
        self.decide_us.append((time.perf_counter() - t) * 1e6)
        self._route(changes, now)

    def _route(self, changes: Changes, now: float) -> None:
        """Send each dispatched request to the least-loaded replica (it joins at that replica's next step)."""
        for ticket in changes.started:
            req = ticket.request
            load = self.load
            r = min(range(len(load)), key=load.__getitem__)
            if load[r] >= self.per:
                raise RuntimeError(f"slot over-commit: {self.running + 1} requests for {self.slots} slots")
            load[r] += 1
            self.joining[r].append((req, self.owner[req.id][2]))
            self.dirty.add(r)
            self._account(now)
            self.running += 1
            self.peak = max(self.peak, self.running)
            start = self.arrived.pop(req.id)
            if now > start:
                self.spans[self.app_index[req.app]].append((start, now))

    def _account(self, now: float) -> None:
        if now > self.last:  # occupancy, from the warm-up on
            self.area += self.running * (now - self.last)
            self.last = now

    def _start_steps(self, now: float) -> None:
        for r in sorted(self.dirty):
            engine = self.engines[r]
            if engine.busy:
                continue
            for req, output in self.joining[r]:
                engine.admit(req, output)
            self.joining[r].clear()
            end = engine.start_step(now)
            if end is not None:
                self.push(end, _STEP, r)
        self.dirty.clear()

    def _step(self, r: int, now: float) -> None:
        self.dirty.add(r)
        for p in self.engines[r].finish_step(now):
            rid = p.request.id
            d, a, _ = self.owner[rid]
            dispatcher = self.doors[d]
            dispatcher.progress(rid, 1, now)
            counted = now > self.warmup
            self.tokens += counted
            if not p.finished:
                continue
            self.done += counted
            self.load[r] -= 1
            self._account(now)
            self.running -= 1
            del self.owner[rid]
            self.finished[rid] = self.finished.get(rid, 0) + 1
            t = time.perf_counter()
            changes = dispatcher.finish(rid, now)
            self.decide_us.append((time.perf_counter() - t) * 1e6)
            self._route(changes, now)
            self.push(now + self.think, _ARRIVAL, a)

    def _row(self, end: float, wall: float) -> ScaleRow:
        for rid, start in self.arrived.items():  # still waiting at the end
            if end > start:
                self.spans[self.app_index[self.agents[self.owner[rid][1]][0].app.name]].append((start, end))
        weights = np.array([a.weight for a in self.app_objs])
        w_min = float(weights.min())
        u = self.doors[0].bound() if self.shared else _pool_bound(self.cost, self.slots)
        s = staleness_bound(self.n_doors, self._rate(w_min), self.interval, self.delay) if self.shared else 0.0
        bound = 2 * (u / w_min + s)
        service = np.zeros(len(weights))
        after = np.asarray(self.times, dtype=float) > self.warmup
        np.add.at(service, np.asarray(self.who, dtype=np.intp)[after], np.asarray(self.amounts, dtype=float)[after])
        span = end - self.warmup
        gap = _max_gap(self.times, self.who, self.amounts, weights, self.spans)
        sizes = np.array(self.sizes or [(0, 0)], dtype=float).mean(axis=0)
        twice = sum(n > 1 for n in self.finished.values())
        return ScaleRow(
            doors=self.n_doors, shared=self.shared, replicas=len(self.engines), slots=self.slots,
            agents=len(self.agents), apps=len(self.app_objs), seconds=end, gap=gap, u=u, s=s, bound=bound,
            ratio=gap / bound, jain=jain_index((service / weights).tolist()) if service.any() else float("nan"),
            service=tuple(service.tolist()),
            requests=self.requests, served=len(self.finished), served_twice=twice, in_flight=len(self.owner),
            throughput=self.done / span, tokens_per_s=self.tokens / span, busy=self.area / (self.slots * span),
            peak_running=self.peak, dispatch_events=len(self.decide_us),
            dispatch_p50_us=percentile(self.decide_us, 50), dispatch_p99_us=percentile(self.decide_us, 99),
            syncs=len(self.store_us), sync_p50_us=percentile(self.store_us, 50),
            sync_p99_us=percentile(self.store_us, 99),
            door_sync_us=float(np.mean(self.door_us)) if self.door_us else float("nan"),
            payload_bytes=float(sizes[0]), reply_bytes=float(sizes[1]), wall_s=wall,
        )

    def _rate(self, w_min: float) -> float:
        """``r``: counter units per second one door can charge one app (the module docstring)."""
        engine = self.engines[0]
        tokens = len(self.engines) * self.per / (engine.decode_base + engine.decode_per_seq * self.per)
        per_token = self.cost.output_cost(MODEL, 1) + self.cost.input_cost(MODEL, PROMPT[1]) / OUTPUT[0]
        return tokens * per_token / w_min


def _pool_bound(cost: UnifiedTokenCost, slots: int) -> float:
    """``U`` of one dispatcher holding all the slots (the pool-wide reference when doors do not share)."""
    reference = Dispatcher(HMFS(cost), cost)
    reference.add_model(MODEL, PROFILE, slots=slots, token_budget=None, max_model_len=PROMPT[1] + OUTPUT[1])
    return reference.bound()


def _max_gap(times: array, who: array, amounts: array, weights: np.ndarray,
             spans: list[list[tuple[float, float]]]) -> float:
    """:func:`fairagents.metrics.max_service_gap` (key ``"app"``) on arrays: the same value, vectorised.

    ``cum[i, k]`` is app ``i``'s service up to the ``k``-th distinct charge time (column 0:
    before any), over its weight. Over a common backlog ``[s, e]`` the spread of
    ``cum[x] − cum[y]`` is taken just before ``s`` and at every charge time in ``[s, e]``.
    """
    t, inverse = np.unique(np.asarray(times, dtype=float), return_inverse=True)
    cum = np.zeros((len(weights), len(t) + 1))
    np.add.at(cum, (np.asarray(who, dtype=np.intp), inverse + 1), np.asarray(amounts, dtype=float))
    np.cumsum(cum, axis=1, out=cum)
    cum /= weights[:, None]
    backlog = [_merge(s) for s in spans]
    worst = 0.0
    for x, y in itertools.combinations(range(len(weights)), 2):
        for start, stop in _intersect(backlog[x], backlog[y]):
            lo, hi = int(t.searchsorted(start, "left")), int(t.searchsorted(stop, "right"))
            diff = cum[x, lo:hi + 1] - cum[y, lo:hi + 1]
            worst = max(worst, float(diff.max() - diff.min()))
    return worst
