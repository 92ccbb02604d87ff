"""One policy for a pool, driven from two places: the arbiter's loop and the engines' own schedulers.

An arbiter orders the requests of the models it dispatches itself (an image
generator, remote replicas, a vLLM engine with ``scheduler="vllm"``); an in-process
vLLM engine orders its own waiting queue and picks its own preemption victims
(:class:`~fairagents.vllm.FairScheduler`). The models of one device
(:mod:`fairagents.policies.devices`) ask the *same* policy object, so an app's service on
one of them counts on every other, whatever the policy: :class:`PoolPolicy` is that
object's seat, one per device; and its engines take one order (:meth:`PoolPolicy.holds`).

**Consistency.** Every call into the policy, from the arbiter's event loop (through
the dispatcher) or from an engine's thread (through :meth:`PoolPolicy.engine_arrive`,
:meth:`~PoolPolicy.engine_select`, ...), runs under one re-entrant lock, :attr:`PoolPolicy.lock`.
Each call is therefore atomic and all of them form one sequence, as if one thread
made them: the policy itself stays single-threaded code. A decision followed by
its action (``select`` then ``on_dispatch``) may see another model's charge land in
between; that only makes the order as fresh as the last charge, never invalid,
because each side only dispatches requests of its own models.

**Requests an engine tells the policy about** are tracked here by engine and id,
so each gets exactly one ``on_finish`` (a preempted one: ``CANCELLED``, then a new
arrival with no prompt to charge, since vLLM recomputes it for free), and an engine
that stops takes its requests with it (:meth:`PoolPolicy.forget`). A request the
engine takes from the queue (:meth:`PoolPolicy.engine_take`) is charged its prompt
only once a step runs it (:meth:`PoolPolicy.engine_admit`), the tokens the engine
read from its prefix cache at the cost model's ``w_cached``.

Examples:
    >>> import fairagents as fa
    >>> from fairagents.policies.pooled import PoolPolicy
    >>> seat = PoolPolicy(fa.policies.make_policy("hmfs", fa.UnifiedTokenCost()))
    >>> seat.register("chat", fa.ModelProfile(d_model=4096, n_layers=1))
    >>> who = fa.Agent("t", fa.App("a"))
    >>> twin = seat.engine_arrive(fa.Request("r1", who, "chat", prompt_tokens=10, max_tokens=5, arrival=0.0))
    >>> seat.engine_select("chat").id, seat.engine_dispatch("chat", "r1"), seat.served(who)
    ('r1', True, (10.0, 10.0))
    >>> seat.engine_progress("chat", [("r1", 5)]); seat.engine_end("chat", "r1", fa.Outcome.FINISHED)
    >>> seat.charged, seat.engine_end("chat", "r1", fa.Outcome.FINISHED)   # ended once
    ({'a': 20.0}, None)
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fairagents._logging import get_logger
from fairagents.cost import ModelProfile, UnifiedTokenCost, prompt_cost
from fairagents.identity import Agent
from fairagents.policies.base import BasePolicy, DefersInput, Policy
from fairagents.policies.watched_lock import LockWatchdog, WatchedLock
from fairagents.request import Outcome, Request

__all__ = ["EngineTally", "LOCAL", "PoolPolicy"]

log = get_logger("fairagents.policy")

#: The device of an arbiter's in-process models, unless told otherwise (:mod:`fairagents.policies.devices`).
LOCAL = "local"

_UNSEEN: Any = object()
# waiting in the policy; taken by the engine, its prompt not charged yet; in the batch, charged
_WAITING, _TAKEN, _RUNNING = "waiting", "taken", "running"


@dataclass
class EngineTally:
    """What one engine's scheduler did, for the recompute tax of preemption.

    Examples:
        >>> from fairagents.policies.pooled import EngineTally
        >>> EngineTally(prefilled=900, recomputed=100, preemptions=2).recompute_tax
        0.1
    """

    prefilled: int = 0
    """Prompt tokens of the requests it took into its batch, each counted once."""
    cached: int = 0
    """Of those, tokens read from the prefix cache rather than computed."""
    recomputed: int = 0
    """Tokens it had computed for requests it then preempted, which it computes again."""
    preemptions: int = 0
    """Requests it preempted, for any reason."""
    fair_preemptions: int = 0
    """Of those, requests preempted so that a client owed service could run."""

    @property
    def recompute_tax(self) -> float:
        """Recomputed tokens over all prefilled ones (recomputed included); 0 before any."""
        total = self.prefilled + self.recomputed
        return self.recomputed / total if total else 0.0


class PoolPolicy:
    """The policy of a pool, shared by its arbiter and its engines' schedulers (see the module docs).

    Args:
        policy: the policy (any :class:`~fairagents.policies.Policy`, built in or your own).
        cost: the pool's unified-token cost model, which prices :attr:`charged` and
            :attr:`service` (default: the policy's own, if it is one, else a new one).
    """

    def __init__(self, policy: Policy, cost: UnifiedTokenCost | None = None, *,
                 clock: Callable[[], float] = time.monotonic, device: str = LOCAL,
                 lock: WatchedLock | None = None) -> None:
        own = getattr(policy, "cost", None)
        self.policy = policy
        self.device = device
        """The device whose service this seat's counters keep (:mod:`fairagents.policies.devices`)."""
        self.models: set[str] = set()
        """The models of the device: their engines take one order (:meth:`holds`)."""
        self.clock = clock
        """The time the policy is told (``now``): the arbiter's clock, which also dates its requests' arrivals."""
        self.cost: UnifiedTokenCost = cost if cost is not None else (
            own if isinstance(own, UnifiedTokenCost) else UnifiedTokenCost())
        self.lock = lock if lock is not None else WatchedLock()
        """Held for every call into :attr:`policy`, by the arbiter and by each engine (re-entrant; one pool's
        devices share it)."""
        self.watchdog = LockWatchdog(self.lock)
        """Logs a hold of :attr:`lock` past its deadline, with the holder's stack; its arbiter runs it."""
        self.charged: dict[str, float] = {}
        """Unified tokens charged per app by the engines' schedulers (not divided by weight)."""
        self.service: dict[tuple[str, str, str], float] = {}
        """Unified tokens charged per ``(model, app, agent)`` by the engines' schedulers."""
        self._served_apps: dict[str, float] = {}  # weighted service, for policies that keep no counters
        self._served_agents: dict[tuple[str, str], float] = {}
        self._twins: dict[tuple[str, str], list[Any]] = {}  # (model, id) -> [request, state] in the policy
        self._expected: dict[tuple[str, str], Request] = {}  # (model, id) -> the arbiter's request, handed over
        self._counters = getattr(policy, "counters_of", None)
        # a step's output is charged per client, once (BasePolicy.charges_by_client), not per request
        self._by_client = isinstance(policy, BasePolicy) and policy.charges_by_client and \
            type(policy).on_progress is BasePolicy.on_progress
        self.tallies: dict[str, EngineTally] = {}
        """What each engine's scheduler prefilled, recomputed and preempted, by model."""

    # -- the pool ------------------------------------------------------------------

    def register(self, model: str, profile: ModelProfile) -> None:
        """Price ``model``'s tokens by ``profile`` (in the pool's and the policy's cost models)."""
        with self.lock:
            self.models.add(model)
            for cost in {id(c): c for c in (self.cost, getattr(self.policy, "cost", None))}.values():
                if isinstance(cost, UnifiedTokenCost) and model not in cost.profiles:
                    cost.register(model, profile)

    @property
    def orders_by_service(self) -> bool:
        """Whether the policy ranks clients by the service they received (:meth:`lead`), which preemption then follows.

        A :class:`~fairagents.policies.BasePolicy` says so
        (:attr:`~fairagents.policies.BasePolicy.orders_by_service`: ``hmfs``, ``hmfs_runs``,
        ``vtc``, ``wfq``); a policy of one's own without the base class, by ``counters_of``.
        """
        if isinstance(self.policy, BasePolicy):
            return self.policy.orders_by_service
        return self._counters is not None

    def lead(self, head: Agent, other: Agent) -> float | None:
        """How far ``other``'s client is served beyond ``head``'s, as the policy ranks them (see ``BasePolicy.lead``).

        In the policy's own cost (:meth:`input_price` prices what preempting costs in it).
        """
        with self.lock:
            if isinstance(self.policy, BasePolicy):
                return self.policy.lead(head, other)
            if self._counters is None:
                return None
            (app, agent), (other_app, other_agent) = self._counters(head), self._counters(other)
            if head.app.name != other.app.name:
                return float((other_app - app) * head.app.weight)
            return float((other_agent - agent) * head.weight) if head.name != other.name else None

    def leads(self, head: Agent, others: Iterable[Agent]) -> list[float | None]:
        """:meth:`lead` of ``head`` over each of ``others``, under one hold of the lock, once per client."""
        others = list(others)
        with self.lock:
            if isinstance(self.policy, BasePolicy):
                return self.policy.leads(head, others)
            seen: dict[tuple[str, str], float | None] = {}
            leads: list[float | None] = []
            for other in others:
                key = (other.app.name, other.name)
                lead = seen.get(key, _UNSEEN)
                if lead is _UNSEEN:
                    lead = seen[key] = self.lead(head, other)
                leads.append(lead)
            return leads

    def holds(self, model: str, agent: Agent) -> bool:
        """Whether ``agent``'s next request on ``model`` waits for its device: a client owed more waits on another engine.

        The device's engines take one order: a client the policy has served beyond a
        client whose request waits on another engine of the device
        (:meth:`lead` > 0, at the level where the two differ: apps, or agents of one app)
        starts nothing new until that client has caught up. The device's least-served
        waiting client is never held, so some engine always runs it, and an engine holds
        its head only: the requests behind it in the policy's order are held as well,
        being no less served. A policy that does not rank clients by service
        (:attr:`orders_by_service`), and a device of one model, hold nothing.
        """
        if len(self.models) < 2 or not self.orders_by_service:
            return False
        with self.lock:
            now = self.clock()
            for other in self.models:
                if other != model:
                    head = self.policy.select(other, now)
                    if head is not None and (self.lead(head.agent, agent) or 0.0) > 0.0:
                        return True
        return False

    def input_price(self, model: str, tokens: int, cached: int = 0) -> float:
        """``tokens`` of ``model``'s input, ``cached`` of them from the prefix cache, in the policy's own cost model.

        (The pool's when the policy has none, or is not a :class:`~fairagents.policies.BasePolicy`.)
        """
        cost = self.policy.cost if isinstance(self.policy, BasePolicy) else self.cost
        return prompt_cost(cost, model, tokens, cached)

    def served(self, agent: Agent) -> tuple[float, float]:
        """How far ``agent``'s app and the agent have been served, as the policy ranks them (lower: owed more).

        The policy's own counters when it keeps them (``counters_of``, as
        :class:`~fairagents.policies.HMFS` does), else the unified tokens the engines
        charged, over the weights.
        """
        with self.lock:
            if self._counters is not None:
                return self._counters(agent)  # type: ignore[no-any-return]
            app = agent.app.name
            return self._served_apps.get(app, 0.0), self._served_agents.get((app, agent.name), 0.0)

    def expect(self, request: Request) -> None:
        """The arbiter hands ``request`` to its model's engine: the engine's scheduler takes this very request.

        So the policy sees the caller's agent (weights, SLO), prompt and run as the
        arbiter knows them, not as rebuilt from vLLM's arguments.
        """
        self._expected[(request.model, request.id)] = request  # one dict operation: atomic, no lock needed

    def unexpect(self, model: str, request_id: str) -> None:
        """The handed request never reached the engine (it failed or was cancelled first)."""
        self._expected.pop((model, request_id), None)

    def expected(self, model: str, request_id: str) -> Request | None:
        """The arbiter's request of that id, handed to ``model``'s engine and not yet taken."""
        return self._expected.pop((model, request_id), None)

    # -- an engine's scheduler -----------------------------------------------------------

    def engine_arrive(self, request: Request, *, requeued: bool = False) -> Request:
        """``request`` waits in its engine's queue; with ``requeued`` (preempted) its prompt is not charged again.

        Returns the request the policy holds (a copy without prompt tokens when requeued).
        """
        key = (request.model, request.id)
        with self.lock:
            held = self._twins.get(key)
            if held is not None:
                if held[1] == _WAITING:
                    return held[0]  # already waiting: vLLM put it back where it was
                del self._twins[key]  # put back: it ends, and starts over
                self.policy.on_finish(held[0], Outcome.CANCELLED, self.clock())
                requeued = held[1] == _RUNNING  # preempted; one taken and never run still owes its prompt
            twin = dataclasses.replace(request, prompt_tokens=0) if requeued else request
            self.policy.on_arrival(twin, self.clock())  # if it raises, the policy holds nothing of it
            self._twins[key] = [twin, _WAITING]
            return twin

    def engine_select(self, model: str) -> Request | None:
        """The policy's choice among ``model``'s waiting requests (a request of another engine is never returned)."""
        with self.lock:
            return self.policy.select(model, self.clock())

    def engine_dispatch(self, model: str, request_id: str) -> bool:
        """The engine took the request into its batch and ran it: :meth:`engine_take`, then :meth:`engine_admit`."""
        with self.lock:
            return self.engine_take(model, request_id) and self.engine_admit(model, request_id)

    def engine_take(self, model: str, request_id: str) -> bool:
        """The engine chose the request for its batch: it leaves the queue, its prompt not charged yet.

        The engine may still put it back unscheduled (a grammar compiling); its prompt is
        charged by :meth:`engine_admit` once a step schedules it. A policy that cannot
        defer input (not a :class:`~fairagents.policies.DefersInput`) is charged here.
        """
        with self.lock:
            held = self._twins.get((model, request_id))
            if held is None or held[1] != _WAITING:
                return False
            twin, defers = held[0], isinstance(self.policy, DefersInput)
            try:
                if defers:
                    self.policy.on_take(twin, self.clock())
                else:
                    self.policy.on_dispatch(twin, self.clock())
            except Exception:  # a policy's or cost model's bug: the engine serves it uncharged, not dies of it
                self._drop(model, request_id, "dispatch")
                return False
            held[1] = _TAKEN if defers else _RUNNING
            if not defers:
                self._admitted(model, twin)
            return True

    def engine_admit(self, model: str, request_id: str, cached: int = 0) -> bool:
        """A step scheduled the taken request: its prompt is charged now (once; a resumed one has none).

        ``cached`` of its prompt tokens the engine read from its prefix cache: they are
        charged at the cost model's ``w_cached``. (A policy of one's own that is not a
        :class:`~fairagents.policies.BasePolicy` is told the whole prompt, as computed.)
        """
        with self.lock:
            held = self._twins.get((model, request_id))
            if held is None or held[1] != _TAKEN:
                return held is not None and held[1] == _RUNNING
            twin = held[0]
            cached = min(max(cached, 0), twin.prompt_tokens)  # a resumed request has no prompt left to charge
            try:
                if isinstance(self.policy, BasePolicy):
                    self.policy.on_input(twin, twin.prompt_tokens, self.clock(), cached)
                else:
                    self.policy.on_input(twin, twin.prompt_tokens, self.clock())  # type: ignore[union-attr]
            except Exception:  # as in engine_take: served on, uncharged
                self._drop(model, request_id, "admit")
                return False
            held[1] = _RUNNING
            self._admitted(model, twin, cached)
            return True

    def engine_input(self, model: str, request_id: str, prompt_tokens: int, computed: int) -> None:
        """A step ran a request the engine held with KV blocks (vLLM's ``kv_holding_waiting``): charge its input.

        Taken and not charged yet (its KV loaded from outside the engine): its prompt,
        the ``computed`` tokens it found as cached ones (:meth:`engine_admit`). Running
        (a streaming-input session's next chunk, ``prompt_tokens`` now long): the
        tokens of it not computed yet, as prompt. (A policy that charges input only at
        dispatch, not a :class:`~fairagents.policies.DefersInput`, is not charged later chunks.)
        """
        with self.lock:
            held = self._twins.get((model, request_id))
            if held is None or held[1] == _WAITING:
                return
            if held[1] == _TAKEN:
                self.engine_admit(model, request_id, computed)
                return
            tokens = max(prompt_tokens - computed, 0)
            if not tokens or not isinstance(self.policy, DefersInput):
                return
            try:
                self.policy.on_input(held[0], tokens, self.clock())
            except Exception:  # as in engine_take: served on, uncharged
                self._drop(model, request_id, "input")
                return
            self.tally(model).prefilled += tokens
            self._account(held[0].agent, model, self.cost.input_cost(model, tokens))

    def _admitted(self, model: str, twin: Request, cached: int = 0) -> None:
        tally = self.tally(model)
        tally.prefilled += twin.prompt_tokens
        tally.cached += cached
        if twin.prompt_tokens:
            self._account(twin.agent, model, prompt_cost(self.cost, model, twin.prompt_tokens, cached))

    def engine_progress(self, model: str, outputs: Iterable[tuple[str, int]]) -> None:
        """A step's output tokens, ``(request id, tokens)`` each, charged under one hold of the lock.

        Tokens of a request that is not running (delivered after it was preempted) are not
        charged. A policy that :attr:`~fairagents.policies.BasePolicy.charges_by_client` is
        charged each client's sum once (its requests of one app, agent and weights); any
        other, each request.
        """
        now = self.clock()
        with self.lock:
            twins = self._twins
            if not self._by_client:
                for request_id, tokens in outputs:
                    held = twins.get((model, request_id))
                    if held is not None and held[1] == _RUNNING and tokens > 0:
                        self._progress(model, [held[0]], tokens, now)
                return
            clients: dict[tuple[str, float, str, float], list[Any]] = {}  # client -> [its requests, tokens]
            for request_id, tokens in outputs:
                held = twins.get((model, request_id))
                if held is not None and held[1] == _RUNNING and tokens > 0:
                    who = held[0].agent
                    key = (who.app.name, who.app.weight, who.name, who.weight)
                    entry = clients.get(key)
                    if entry is None:
                        clients[key] = [[held[0]], tokens]
                    else:
                        entry[0].append(held[0])
                        entry[1] += tokens
            for requests, tokens in clients.values():
                self._progress(model, requests, tokens, now)

    def _progress(self, model: str, requests: list[Request], tokens: int, now: float) -> None:
        """Charge ``tokens`` of output to the client of ``requests`` (one request, or a client's of one step)."""
        try:
            if self._by_client:
                self.policy.charge_output(requests[0], tokens, now)  # type: ignore[attr-defined]
            else:
                self.policy.on_progress(requests[0], tokens, now)
        except Exception:  # refused (a charge that is not finite): they go on uncharged, alone
            for request in requests:
                self._drop(model, request.id, "progress")
            return
        self._account(requests[0].agent, model, self.cost.output_cost(model, tokens))

    def engine_end(self, model: str, request_id: str, outcome: Outcome) -> None:
        """The request left its engine (finished, aborted or failed), waiting or running; once per request."""
        with self.lock:
            held = self._twins.pop((model, request_id), None)
            if held is not None:
                self.policy.on_finish(held[0], outcome, self.clock())

    def discard(self, request: Request) -> None:
        """End a waiting request the policy holds but no engine serves (a driver's bug): it is never served."""
        with self.lock:
            self._twins.pop((request.model, request.id), None)
            self.policy.on_finish(request, Outcome.CANCELLED, self.clock())

    def engine_running(self, model: str, request_id: str) -> bool:
        """Whether the engine took the request from the policy's queue (taken or running on ``model``, not ended)."""
        held = self._twins.get((model, request_id))
        return held is not None and held[1] != _WAITING

    def forget(self, model: str) -> int:
        """``model``'s engine stopped: every request it held ends, uncharged further; how many there were."""
        now = self.clock()
        with self.lock:
            keys = [key for key in self._twins if key[0] == model]
            for key in keys:
                twin, state = self._twins.pop(key)
                self.policy.on_finish(twin, Outcome.CANCELLED if state == _WAITING else Outcome.FAILED, now)
            for key in [key for key in list(self._expected) if key[0] == model]:
                self._expected.pop(key, None)
            return len(keys)

    def _drop(self, model: str, request_id: str, step: str) -> None:
        """The policy refused a call about a request: log it, and end it there, so no counter takes its charges.

        Its engine serves it on, uncharged: one request's bad number never stops the
        engine that serves everyone's.
        """
        twin, _ = self._twins.pop((model, request_id))
        log.exception("fairagents.policy.refused", model=model, request_id=request_id, step=step,
                      app=twin.agent.app.name, agent=twin.agent.name)
        with contextlib.suppress(Exception):  # what the policy holds of it may be half-made: let it go
            self.policy.on_finish(twin, Outcome.FAILED, self.clock())

    def tally(self, model: str) -> EngineTally:
        """``model``'s engine tally (created on first use)."""
        tally = self.tallies.get(model)
        if tally is None:
            tally = self.tallies[model] = EngineTally()
        return tally

    def held(self, model: str | None = None) -> int:
        """Requests an engine (``model``'s, or any) has told the policy about and not ended."""
        return sum(1 for key in list(self._twins) if model is None or key[0] == model)

    def _account(self, agent: Agent, model: str, amount: float) -> None:
        app = agent.app.name
        self.charged[app] = self.charged.get(app, 0.0) + amount
        key = (model, app, agent.name)
        self.service[key] = self.service.get(key, 0.0) + amount
        if self._counters is None:  # served() reads these only for a policy that keeps no counters of its own
            self._served_apps[app] = self._served_apps.get(app, 0.0) + amount / agent.app.weight
            akey = (app, agent.name)
            self._served_agents[akey] = self._served_agents.get(akey, 0.0) + amount / agent.weight

