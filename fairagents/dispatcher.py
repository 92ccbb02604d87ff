"""The dispatcher: what is admitted, what runs, and what it costs — for the arbiter and the simulator alike.

One synchronous object owns every admission decision: the live arbiter is an async
adapter over it, and the simulator drives it on a virtual clock, so what is proven on
the simulator holds for the code that serves. It is pure like the policies: ``now``
comes in (seconds), and it calls no engine. Drivers report events — :meth:`~Dispatcher.arrive`,
:meth:`~Dispatcher.progress`, :meth:`~Dispatcher.finish`, :meth:`~Dispatcher.cancel`,
:meth:`~Dispatcher.fail`, :meth:`~Dispatcher.model_down`, :meth:`~Dispatcher.model_up`,
:meth:`~Dispatcher.close` — and each returns the :class:`~fairagents.records.Changes` it
caused: the tickets to start now, and those that ended. A model takes the policy's next
request while it has a free slot (and the pool one) and its token budget has room for
the request's reservation, ``prompt + max_tokens`` rounded up to the KV block. A model
whose engine schedules by the policy itself (``in_engine``) is handed each request as
it arrives (within its app's share): the engine's scheduler drives the same policy,
under the lock both share. The rules, the per-app share and queue bound, Statera
admission and what each costs are explained in [Capacity and admission](../concepts/capacity.md).

Examples:
    >>> import fairagents as fa
    >>> from fairagents.dispatcher import Dispatcher
    >>> cost = fa.UnifiedTokenCost()
    >>> d = Dispatcher(fa.policies.HMFS(cost), cost)
    >>> d.add_model("chat", fa.ModelProfile(d_model=4096, n_layers=1), slots=2, token_budget=50, max_model_len=100).slots
    2
    >>> who = fa.Agent("bot", fa.App("a"))
    >>> first = d.arrive(fa.Request("r1", who, "chat", prompt_tokens=10, max_tokens=20, arrival=0.0), now=0.0)
    >>> [t.request.id for t in first.started]
    ['r1']
    >>> d.arrive(fa.Request("r2", who, "chat", prompt_tokens=10, max_tokens=20, arrival=0.0), now=0.0).started
    []
    >>> d.model("chat").running, d.model("chat").reserved   # a free slot, but not 30 more tokens of KV
    (1, 30)
    >>> d.progress("r1", 5, now=1.0)
    10.0
    >>> [t.request.id for t in d.finish("r1", now=2.0).started]
    ['r2']
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from fairagents._logging import get_logger
from fairagents.cost import ModelProfile, UnifiedTokenCost, prompt_cost, service_bound
from fairagents.errors import (
    ContextLengthError,
    EngineError,
    FairAgentsError,
    InvalidParameterError,
    OverloadedError,
    ProtocolError,
    ShutdownError,
    UnknownModelError,
    shown,
)
from fairagents.policies.base import Policy
from fairagents.records import Changes, ModelState, Ticket, TicketState
from fairagents.request import Outcome, Request

if TYPE_CHECKING:
    from fairagents.admission import Statera

# The records live in fairagents.records; they are re-exported here for the dispatcher's drivers.
__all__ = ["Changes", "Dispatcher", "ModelState", "Ticket", "TicketState"]

log = get_logger("fairagents.dispatcher")


_NOTHING = Changes()
_RUNNING = TicketState.RUNNING


class Dispatcher:
    """Admission and dispatch over a pool of models, for one policy.

    Args:
        policy: the policy that orders waiting requests.
        cost: the cost model that prices every charge (unified tokens).
        pool_slots: most requests handed to engines at once across the pool (models
            sharing hardware); ``None``: each model is filled on its own.
        charge: called with ``(now, request, amount)`` for every charge.
        is_live: called with a request id just before it is dispatched; ``False``
            means its caller has gone: it ends as cancelled, uncharged.
        app_share: called with an app's name: the largest share (0 < share ≤ 1) of a
            model's slots and token budget that app may hold, or ``None`` for no cap.
        queue_bound: called with an app's name: the most requests that app may have
            waiting for one model (held back by its share included), or ``None`` for no
            bound; past it :meth:`arrive` (and :meth:`check_queue`) raise
            :class:`~fairagents.errors.OverloadedError`.
        admission: an admission controller that reserves predicted bounds instead of
            worst cases and steers each model's in-flight limit and token budget
            (:class:`~fairagents.admission.Statera`); ``None``: worst-case reservations
            under the fixed limits.
        gate: called with ``(ticket, model)`` for the policy's choice once it has a slot
            and fits the budget; ``False`` holds it (and the model) back until the next
            event or :meth:`refill`, as a request that does not fit is held. Arbiters that
            share counters and a model's capacity gate on the pool-wide view
            (:meth:`fairagents.shared.SharedView.gate`).
        lock: held for every event, so that the policy, which in-engine schedulers
            drive from their threads too, sees one call at a time
            (:attr:`fairagents.policies.pooled.PoolPolicy.lock`); ``None``: no lock.
        device_hold: called with the policy's choice for a model with a slot; ``True``
            holds it (and the model) back, because a client owed more waits on another
            engine of its device (:meth:`fairagents.policies.pooled.PoolPolicy.holds`):
            the model is then in :attr:`device_held` until a fill finds it free. Under a
            pool limit (``pool_slots``) it is not asked: a free slot of the pool goes to
            the policy's choice across its models, which is one order already.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.dispatcher import Dispatcher
        >>> Dispatcher(fa.policies.FCFS(), fa.UnifiedTokenCost(), pool_slots=0)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: pool slots must be an integer ≥ 1 or None, got 0
    """

    def __init__(
        self,
        policy: Policy,
        cost: UnifiedTokenCost,
        *,
        pool_slots: int | None = None,
        charge: Callable[[float, Request, float], None] | None = None,
        is_live: Callable[[str], bool] | None = None,
        app_share: Callable[[str], float | None] | None = None,
        queue_bound: Callable[[str], int | None] | None = None,
        admission: Statera | None = None,
        gate: Callable[[Ticket, ModelState], bool] | None = None,
        lock: contextlib.AbstractContextManager[Any] | None = None,
        device_hold: Callable[[Request], bool] | None = None,
    ) -> None:
        if pool_slots is not None:
            _check_count(pool_slots, "pool slots", optional=True)
        self.policy = policy
        self.cost = cost
        self.pool_slots = pool_slots
        self.pool_running = 0
        self._charge_cb = charge
        self._is_live = is_live
        self._models: dict[str, ModelState] = {}
        self._tickets: dict[str, Ticket] = {}
        self._withdrawn: list[Ticket] = []  # ended by is_live during the current event
        self._closed = False
        self._app_share = app_share
        self._queue_bound = queue_bound
        self.admission = admission
        self.gate = gate
        self.device_hold = device_hold
        self.device_held: set[str] = set()
        """Models whose head ``device_hold`` held at their last fill: their driver looks again (:meth:`refill`)."""
        self._held: dict[tuple[str, str], list[int]] = {}  # (app, model) -> [requests, tokens] running or shown
        self._held_back: dict[tuple[str, str], deque[Ticket]] = {}  # (app, model) -> waiting, not yet shown
        self._waiting: dict[tuple[str, str], int] = {}  # (app, model) -> requests waiting, held back or shown
        self._handed: list[Ticket] = []  # handed to in-engine models during the current event
        self.lock: contextlib.AbstractContextManager[Any] = lock if lock is not None else contextlib.nullcontext()

    # -- the pool ------------------------------------------------------------------

    def add_model(
        self,
        name: str,
        profile: ModelProfile,
        *,
        slots: int,
        token_budget: int | None,
        max_model_len: int,
        block: int = 1,
        in_engine: bool = False,
        kv_tokens: int | None = None,
    ) -> ModelState:
        """Add a model: its profile joins the cost model (and the policy's, if separate).

        ``in_engine``: its engine orders its requests by the policy itself; each is handed
        over as it arrives, and ``kv_tokens`` (the engine's KV capacity) bounds what it holds.
        """
        if name in self._models:
            raise InvalidParameterError(f"model {name!r} is already in the pool", model=name)
        _check_count(slots, "slots")
        _check_count(max_model_len, "max_model_len")
        _check_count(block, "KV block size")
        if token_budget is not None:
            _check_count(token_budget, "token budget")
        self.cost.register(name, profile)
        policy_cost = getattr(self.policy, "cost", None)
        if isinstance(policy_cost, UnifiedTokenCost) and policy_cost is not self.cost:
            policy_cost.register(name, profile)
        state = self._models[name] = ModelState(name, slots, None if in_engine else token_budget, max_model_len, block,
                                                in_engine=in_engine, kv_tokens=kv_tokens)
        if self.admission is not None and not in_engine:
            self.admission.add_model(state)
        self._report_bounds()
        return state

    def _report_bounds(self) -> None:
        """Tell each policy ``U`` of the models it orders: one per device in a pool of devices (HMFS's idle credit)."""
        policy_of = getattr(self.policy, "policy_of", None)  # a pool's devices: each its own seat of the policy
        groups: dict[int, tuple[Any, list[str]]] = {}
        for name in self._models:
            policy = self.policy if policy_of is None else policy_of(name)
            groups.setdefault(id(policy), (policy, []))[1].append(name)
        for policy, models in groups.values():
            report = getattr(policy, "set_bound", None)  # a policy may not take U (HMFS's idle credit does)
            if report is not None:
                try:
                    bound = self.bound(models=models)
                except InvalidParameterError:  # a batch past what a cost can price (2**40 tokens): U stays as it was
                    continue
                report(bound)

    def model(self, name: str) -> ModelState:
        """The admission state of ``name``."""
        state = self._models.get(name)
        if state is None:
            raise UnknownModelError.among(name, self._models)
        return state

    @property
    def models(self) -> Mapping[str, ModelState]:
        """Every model's admission state, by name (a read-only view, not a copy)."""
        return MappingProxyType(self._models)

    def tickets(self) -> list[Ticket]:
        """Requests waiting or running."""
        return list(self._tickets.values())

    def queued(self, model: str | None = None, app: str | None = None) -> int:
        """Requests waiting for ``model`` (or for any model), of ``app`` (or of any), held back ones included."""
        # An in-engine model's requests wait in its engine until their first token; the policy's count
        # would miss those its engine has not taken in yet, so every model is counted here alike.
        return sum(n for (a, m), n in list(self._waiting.items())
                   if (app is None or a == app) and (model is None or m == model))

    def share_cap(self, app: str, model: str) -> tuple[int, float | None] | None:
        """The most requests and KV tokens ``app`` may hold of ``model`` at once (``None``: no cap).

        Examples:
            >>> import fairagents as fa
            >>> from fairagents.dispatcher import Dispatcher
            >>> d = Dispatcher(fa.policies.FCFS(), fa.UnifiedTokenCost(), app_share=lambda app: 0.25)
            >>> _ = d.add_model("chat", fa.ModelProfile(d_model=64, n_layers=1), slots=8, token_budget=1000, max_model_len=500)
            >>> d.share_cap("flood", "chat")
            (2, 250.0)
        """
        share = None if self._app_share is None else self._app_share(app)
        if share is None or share >= 1:
            return None
        m = self.model(model)
        return max(1, int(share * m.slots)), None if m.token_budget is None else share * m.token_budget

    def check_queue(self, app: str, model: str) -> None:
        """Raise what :meth:`arrive` would for a full queue: ``app`` has its bound of requests waiting for ``model``.

        Changes nothing. ``retry_after`` is the model's average run time
        (:attr:`~fairagents.records.ModelState.run_time`; 1 s before any finished), within [0.05, 60] s.

        Raises:
            OverloadedError: the app's queue for the model is full.

        Examples:
            >>> import fairagents as fa
            >>> from fairagents.dispatcher import Dispatcher
            >>> d = Dispatcher(fa.policies.FCFS(), fa.UnifiedTokenCost(), queue_bound={"flood": 1}.get)
            >>> profile = fa.ModelProfile(d_model=64, n_layers=1)
            >>> _ = d.add_model("chat", profile, slots=1, token_budget=None, max_model_len=99)
            >>> flood = fa.Agent("bot", fa.App("flood"))
            >>> _ = d.arrive(fa.Request("r1", flood, "chat", 1, 1, arrival=0.0), now=0.0)   # runs
            >>> _ = d.arrive(fa.Request("r2", flood, "chat", 1, 1, arrival=0.0), now=0.0)   # waits
            >>> try:
            ...     d.check_queue("flood", "chat")
            ... except fa.OverloadedError as full:
            ...     print(full.retry_after, full)
            1.0 app 'flood' has 1 requests queued for model 'chat', its bound; retry later
            >>> d.check_queue("other", "chat")   # no bound
        """
        bound = None if self._queue_bound is None else self._queue_bound(app)
        if bound is not None and self._waiting.get((app, model), 0) >= bound:
            m = self.model(model)
            raise OverloadedError(
                f"app {app!r} has {bound} requests queued for model {model!r}, its bound; retry later",
                retry_after=min(max(m.run_time or 1.0, 0.05), 60.0), model=model, app=app,
            )

    def ticket(self, request_id: str) -> Ticket | None:
        """The ticket of a request that has not ended, if any."""
        return self._tickets.get(request_id)

    def reservation(self, model: str, prompt_tokens: int, max_tokens: int) -> int:
        """Tokens a request of that size reserves of ``model``'s budget (rounded up to its KV block)."""
        block = self.model(model).block
        return -(-(prompt_tokens + max_tokens) // block) * block

    def bound(self, max_request_tokens: int | None = None, *, models: Iterable[str] | None = None) -> float:
        """``U`` of the fairness guarantee under these limits (see :func:`~fairagents.service_bound`).

        Over ``models`` (default: every model of the pool).

        A model holds at most ``slots`` requests of at most ``max_request_tokens``
        (default and cap: its context), and at most its token budget — unless an
        admission controller reserves less than the worst case: then the budget no
        longer bounds the tokens its requests may come to hold, and only the slots do.
        An in-engine model's batch holds at most its engine's KV capacity.
        """
        longest, held = {}, {}
        for m in self._models.values() if models is None else map(self.model, models):
            longest[m.name] = m.max_model_len if max_request_tokens is None else min(max_request_tokens, m.max_model_len)
            slots = m.slots if self.pool_slots is None else min(m.slots, self.pool_slots)
            held[m.name] = slots * longest[m.name]
            if m.token_budget is not None and self.admission is None:
                held[m.name] = min(held[m.name], m.token_budget)
            if m.in_engine and m.kv_tokens is not None:  # what its batch can hold at once
                held[m.name] = min(held[m.name], m.kv_tokens)
        return service_bound(self.cost, held, pool=self.pool_slots, longest=longest)

    # -- events ------------------------------------------------------------------------

    def arrive(self, request: Request, now: float) -> Changes:
        """Queue ``request``; raises, changing nothing, if it can never run here.

        Raises:
            UnknownModelError: the model is not in the pool.
            OverloadedError: the app's queue for the model is full (:meth:`check_queue`).
            ContextLengthError: ``prompt + max_tokens`` exceeds the model's context or
                its whole token budget.
            EngineError: the model is down.
            ShutdownError: the dispatcher is closed.
        """
        with self.lock:
            return self._arrive(request, now)

    def _arrive(self, request: Request, now: float) -> Changes:
        about = {"model": request.model, "app": request.app, "agent": request.agent.name, "request_id": request.id}
        if self._closed:
            raise ShutdownError("the arbiter is closed and admits no new requests", **about)
        m = self.model(request.model)
        if request.id in self._tickets:
            raise ProtocolError(f"request id {request.id!r} is already queued or running", **about)
        self.check_queue(request.app, m.name)
        size = request.prompt_tokens + request.max_tokens
        if size > m.max_model_len:
            raise ContextLengthError(
                f"prompt ({request.prompt_tokens} tokens) + max_tokens ({request.max_tokens}) exceeds the context of "
                f"model {m.name!r} ({m.max_model_len} tokens)", **about,
            )
        reserved = self.reservation(m.name, request.prompt_tokens, request.max_tokens)
        whole = m.kv_tokens if m.in_engine else m.token_budget
        if whole is not None and reserved > whole:
            raise ContextLengthError(
                f"prompt ({request.prompt_tokens} tokens) + max_tokens ({request.max_tokens}) needs {reserved} tokens "
                f"of KV cache; model {m.name!r} holds {whole} in all", **about,
            )
        if m.down is not None:
            raise EngineError(f"model {m.name!r} is down: {m.down}", **about)
        ticket = Ticket(request, reserved)
        self._bound(ticket)
        key = (request.app, m.name)
        if self._held_back.get(key) or not self._within_share(ticket):
            self.cost.input_cost(m.name, request.prompt_tokens)  # what the policy checks: raises before queuing
            ticket.held_back = True
            self._held_back.setdefault(key, deque()).append(ticket)
        else:
            self._show(ticket, now)  # raises (queuing nothing) for a request the policy cannot price
        self._tickets[request.id] = ticket
        self._waiting[key] = self._waiting.get(key, 0) + 1
        if m.in_engine and not ticket.held_back:
            self._hand(ticket, m, now)
        try:
            return self._changes(m, now, [])
        except BaseException:  # the caller sees the error: what was handed for it must not stay held
            if ticket in self._handed:
                self._handed.remove(ticket)
                self._end(ticket, Outcome.CANCELLED, now)
            raise

    def progress(self, request_id: str, new_tokens: int, now: float, cached: int | None = None) -> float:
        """A running request produced ``new_tokens`` more output tokens; returns their charge.

        ``cached``: the prompt tokens its engine read from the prefix cache, where the engine
        says (kept on the ticket). A model whose engine schedules in itself is charged its
        prompt at the first token, those tokens at the cost model's ``w_cached``, as its
        engine charged the policy; one the dispatcher admits was charged its whole prompt
        at dispatch, before any hit was known.
        """
        # The hot path of every driver (one call per streamed chunk, per token in the simulator): lean on purpose.
        ticket = self._tickets.get(request_id)
        if ticket is None or ticket.state is not _RUNNING:
            raise ProtocolError(f"request {request_id!r} is not running", request_id=request_id)
        if not new_tokens:
            return 0.0
        if self._models[ticket.request.model].in_engine:  # its engine charges the policy: no call into it here
            return self._progress(ticket, new_tokens, now, cached)
        with self.lock:
            return self._progress(ticket, new_tokens, now, cached)

    def _progress(self, ticket: Ticket, new_tokens: int, now: float, cached: int | None = None) -> float:
        r = ticket.request
        m = self._models[r.model]
        if ticket.first_token is None:
            ticket.first_token = now
            hits = ticket.cached = min(cached, r.prompt_tokens) if cached and cached > 0 else 0
            if m.in_engine:  # out of the engine's queue: its prompt was charged there as it joined the batch
                ticket.dispatched = now
                self._unwait(r)
                self._charge(ticket, prompt_cost(self.cost, m.name, r.prompt_tokens, hits), now)
        ticket.produced += new_tokens
        if m.in_engine:  # its engine's scheduler charges the policy
            m.used += new_tokens
            amount = self.cost.output_cost(r.model, new_tokens)
            ticket.charged += amount
            if self._charge_cb is not None:
                self._charge_cb(now, r, amount)
            return amount
        admission = self.admission
        if admission is not None:
            admission.tick(m, now)  # occupancy up to now, before it changes
        m.used += new_tokens
        if r.prompt_tokens + ticket.produced > ticket.reserved:  # it outgrew its predicted bound
            self._grow(ticket, m, self.reservation(m.name, r.prompt_tokens, ticket.produced) - ticket.reserved)
        if admission is not None:
            admission.on_progress(m, ticket, new_tokens, now)
        self.policy.on_progress(r, new_tokens, now)
        amount = self.cost.output_cost(r.model, new_tokens)
        ticket.charged += amount  # _charge, inlined
        if self._charge_cb is not None:
            self._charge_cb(now, r, amount)
        return amount

    def finish(self, request_id: str, now: float) -> Changes:
        """A running request ran to its end."""
        return self.end(request_id, Outcome.FINISHED, now)

    def cancel(self, request_id: str, now: float) -> Changes:
        """The caller gave up: a waiting request leaves the queue uncharged, a running one stops."""
        return self.end(request_id, Outcome.CANCELLED, now)

    def fail(self, request_id: str, now: float) -> Changes:
        """The request failed (its engine raised, or it was aborted at shutdown)."""
        return self.end(request_id, Outcome.FAILED, now)

    def end(self, request_id: str, outcome: Outcome, now: float) -> Changes:
        """End a request with ``outcome``; a no-op for one that has already ended."""
        with self.lock:
            ticket = self._tickets.get(request_id)
            if ticket is None:
                return _NOTHING
            if outcome is Outcome.FINISHED and ticket.state is not TicketState.RUNNING:
                raise ProtocolError(f"request {request_id!r} finished without running", **_about(ticket))
            m = self._models[ticket.request.model]
            self._end(ticket, outcome, now)
            return self._changes(m, now, [ticket])

    def model_down(self, model: str, error: EngineError, now: float) -> Changes:
        """``model``'s engine failed: its waiting requests end (failed) and it takes no more.

        Its running requests end as their streams report the failure (:meth:`fail`).
        """
        m = self.model(model)
        if m.down is not None:
            return _NOTHING
        m.down = error
        ended = []
        with self.lock:
            for ticket in [t for t in self._tickets.values()
                           if t.request.model == model and t.state is TicketState.WAITING]:
                ticket.error = EngineError(f"model {model!r} is down: {error}", **_about(ticket))
                self._end(ticket, Outcome.FAILED, now)
                ended.append(ticket)
            return self._changes(m, now, ended)

    def model_up(self, model: str, now: float) -> Changes:
        """``model``'s engine serves again: it takes requests."""
        m = self.model(model)
        m.down = None
        with self.lock:
            return self._changes(m, now, [])

    def close(self, now: float) -> Changes:
        """Admit and dispatch nothing more: every waiting request ends (failed, with a ShutdownError)."""
        self._closed = True
        ended = []
        with self.lock:
            for ticket in [t for t in self._tickets.values() if t.state is TicketState.WAITING]:
                ticket.error = ShutdownError("the arbiter shut down before the request ran", **_about(ticket))
                self._end(ticket, Outcome.FAILED, now)
                ended.append(ticket)
        return Changes([], ended)

    def refill(self, now: float) -> Changes:
        """Dispatch into every model with room: what changed outside is worth a new look (a gate opened)."""
        if self._closed:
            return _NOTHING
        with self.lock:
            if self.pool_slots is not None:
                started = self._fill_pool(now)
            else:
                started = [t for m in self._models.values() for t in self._fill_model(m, now)]
            ended, self._withdrawn = self._withdrawn, []
            return Changes(started, ended) if started or ended else _NOTHING

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    # -- internals -----------------------------------------------------------------------

    def _end(self, ticket: Ticket, outcome: Outcome, now: float) -> None:
        r = ticket.request
        del self._tickets[r.id]
        m = self._models[r.model]
        if ticket.state is TicketState.WAITING:
            self._unwait(r)
        elif m.in_engine:
            m.running -= 1
            m.reserved -= ticket.reserved
            m.used -= r.prompt_tokens + ticket.produced
            if ticket.first_token is None:  # it was still in the engine's queue
                self._unwait(r)
            if outcome is Outcome.FINISHED and ticket.dispatched is not None:
                run = now - ticket.dispatched
                m.run_time = run if m.run_time is None else 0.8 * m.run_time + 0.2 * run
        else:
            m.running -= 1
            m.reserved -= ticket.reserved
            if self.admission is not None:
                self.admission.tick(m, now)
            m.used -= r.prompt_tokens + ticket.produced
            self.pool_running -= 1
            if self.admission is not None:
                self.admission.on_end(ticket, outcome is Outcome.FINISHED, self.cost)
            if outcome is Outcome.FINISHED and ticket.dispatched is not None:
                run = now - ticket.dispatched
                m.run_time = run if m.run_time is None else 0.8 * m.run_time + 0.2 * run
        ticket.state = TicketState.DONE
        ticket.outcome = outcome
        ticket.ended = now
        key = (r.app, r.model)
        if ticket.held_back:  # the policy never saw it
            self._held_back[key].remove(ticket)
            if not self._held_back[key]:
                del self._held_back[key]
            if not self._closed and m.down is None:
                self._show_held_back(key, now)  # the ones behind it may fit now
            return
        if not m.in_engine:  # an in-engine model's scheduler ends it in the policy
            self.policy.on_finish(r, outcome, now)
        held = self._held.get(key)
        if held is not None:
            held[0] -= 1
            held[1] -= ticket.reserved
            if not held[0]:
                del self._held[key]
        if not self._closed and m.down is None:
            self._show_held_back(key, now)

    def _unwait(self, r: Request) -> None:
        key = (r.app, r.model)
        n = self._waiting[key] - 1
        if n:
            self._waiting[key] = n
        else:
            del self._waiting[key]

    def _within_share(self, ticket: Ticket) -> bool:
        r = ticket.request
        cap = self.share_cap(r.app, r.model)
        held = self._held.get((r.app, r.model))
        if cap is None or held is None:
            return True  # no cap, or the app holds nothing of the model: one request may always run
        slots, tokens = cap
        return held[0] < slots and (tokens is None or held[1] + ticket.reserved <= tokens)

    def _show(self, ticket: Ticket, now: float) -> None:
        """Hand a waiting request to the policy (an in-engine model's: to its engine); it counts against its app's share."""
        r = ticket.request
        m = self._models[r.model]
        if m.in_engine:
            self.cost.input_cost(m.name, r.prompt_tokens)  # what the policy checks: raises before queuing
        else:
            self.policy.on_arrival(r, now)
        ticket.held_back = False
        held = self._held.setdefault((r.app, r.model), [0, 0])
        held[0] += 1
        held[1] += ticket.reserved

    def _hand(self, ticket: Ticket, m: ModelState, now: float) -> None:
        """Hand a request to an in-engine model's engine now: it runs from the arbiter's view, waits in the engine's."""
        r = ticket.request
        if self._is_live is not None and not self._is_live(r.id):
            self._end(ticket, Outcome.CANCELLED, now)  # its caller left while it was held back: uncharged
            self._withdrawn.append(ticket)
            return
        ticket.state = TicketState.RUNNING  # ``dispatched`` is set as it leaves the engine's queue (its first token)
        m.running += 1
        m.reserved += ticket.reserved
        m.used += r.prompt_tokens
        self._handed.append(ticket)

    def _show_held_back(self, key: tuple[str, str], now: float) -> None:
        """Show an app's held-back requests, in arrival order, while they fit its share.

        This runs on other requests' events: a policy that refuses a request here ends
        that request (failed, with the policy's error), never the event's caller.
        """
        queue = self._held_back.get(key)
        while queue and self._within_share(queue[0]):
            ticket = queue.popleft()
            try:
                self._show(ticket, now)
                m = self._models[ticket.request.model]
                if m.in_engine:
                    self._hand(ticket, m, now)
            except FairAgentsError as err:
                self._refused(ticket, err, now)
            except Exception as err:  # a custom policy's bug: the request fails, not the bystander
                self._refused(ticket, ProtocolError(f"the policy refused a held-back request: {err!r}",
                                                    **_about(ticket)), now)
        if queue is not None and not queue:
            del self._held_back[key]

    def _refused(self, ticket: Ticket, err: FairAgentsError, now: float) -> None:
        del self._tickets[ticket.request.id]
        self._unwait(ticket.request)
        ticket.held_back = False
        ticket.state = TicketState.DONE
        ticket.outcome = Outcome.FAILED
        ticket.ended = now
        ticket.error = err
        self._withdrawn.append(ticket)

    def _bound(self, ticket: Ticket) -> None:
        """Under an admission controller, reserve a waiting request's current predicted bound.

        Computed when the request arrives and again each time it is considered for
        dispatch (H-MAS Alg. 2 (B)), so a request that waited while the predictor learned
        is admitted on what is known now.
        """
        r = ticket.request
        if self.admission is None or self._models[r.model].in_engine:
            return
        ticket.predicted, ticket.bound = self.admission.admit(r, self.cost)
        change = self.reservation(r.model, r.prompt_tokens, ticket.bound) - ticket.reserved
        ticket.reserved += change
        held = self._held.get((r.app, r.model)) if r.id in self._tickets and not ticket.held_back else None
        if held is not None:  # shown to the policy: its app's share counts its reservation
            held[1] += change

    def _grow(self, ticket: Ticket, m: ModelState, tokens: int) -> None:
        """Raise a running request's reservation (and its app's share of it) by ``tokens``."""
        r = ticket.request
        ticket.reserved += tokens
        m.reserved += tokens
        held = self._held.get((r.app, r.model))
        if held is not None:
            held[1] += tokens

    def _changes(self, touched: ModelState, now: float, ended: list[Ticket]) -> Changes:
        if self.admission is not None:
            for m in self._models.values() if self.pool_slots is not None else (touched,):
                if not m.in_engine:
                    self.admission.tick(m, now)
        started = self._fill(touched, now)
        if self._handed:
            started, self._handed = self._handed + started, []
        if self._withdrawn:
            ended = ended + self._withdrawn
            self._withdrawn = []
        return Changes(started, ended)

    def _fill(self, touched: ModelState, now: float) -> list[Ticket]:
        """Dispatch while there is room: into ``touched``, or anywhere in the pool under a pool limit."""
        if self._closed:
            return []
        if self.pool_slots is None:
            # a model held for its device first: it has waited for this turn, the touched one has just had one
            held = [t for name in sorted(self.device_held) if name != touched.name
                    for t in self._fill_model(self._models[name], now)]
            return held + self._fill_model(touched, now)
        return self._fill_pool(now)

    def _fill_model(self, m: ModelState, now: float) -> list[Ticket]:
        started: list[Ticket] = []
        if m.in_engine:
            return started  # nothing of it waits here: its engine has it all
        select, hold = self.policy.select, self.device_hold
        self.device_held.discard(m.name)
        while m.has_slot():
            req = select(m.name, now)
            if req is None:
                break
            if hold is not None and hold(req):
                self.device_held.add(m.name)  # a client owed more waits on another engine of its device
                break
            ticket = self._tickets[req.id]
            self._bound(ticket)
            if not m.fits(ticket):
                break  # the head waits for KV; nothing jumps ahead of it
            if self.gate is not None and not self.gate(ticket, m):
                break  # held back from outside (the pool's shared view), like the head that does not fit
            if self._dispatch(ticket, m, now):
                started.append(ticket)
        return started

    def _fill_pool(self, now: float) -> list[Ticket]:
        started: list[Ticket] = []
        room = [m.name for m in self._models.values() if not m.in_engine and m.has_slot()]
        while room and self.pool_running < self.pool_slots:  # type: ignore[operator]
            req = self.policy.select_among(room, now)
            if req is None:
                break
            m = self._models[req.model]
            ticket = self._tickets[req.id]
            self._bound(ticket)
            if not m.fits(ticket) or (self.gate is not None and not self.gate(ticket, m)):
                room.remove(m.name)  # its head waits for KV (or the gate); other models may still go
                continue
            if self._dispatch(ticket, m, now):
                started.append(ticket)
                if not m.has_slot():
                    room.remove(m.name)
        return started

    def _dispatch(self, ticket: Ticket, m: ModelState, now: float) -> bool:
        r = ticket.request
        if self._is_live is not None and not self._is_live(r.id):
            self._end(ticket, Outcome.CANCELLED, now)  # its caller left before its turn: uncharged
            self._withdrawn.append(ticket)
            return False
        try:
            self.policy.on_dispatch(r, now)  # charges first: a refused charge leaves the request waiting in it
        except Exception as err:  # that request fails, not the event's caller (often another request)
            error = err if isinstance(err, FairAgentsError) else ProtocolError(
                f"the policy refused to dispatch the request: {err!r}", **_about(ticket))
            log.error("fairagents.dispatcher.dispatch_refused", error=str(error), **_about(ticket))
            self._end(ticket, Outcome.FAILED, now)
            ticket.error = error
            self._withdrawn.append(ticket)
            return False
        self._unwait(r)
        ticket.state = TicketState.RUNNING
        ticket.dispatched = now
        m.running += 1
        m.reserved += ticket.reserved
        if self.admission is not None:
            self.admission.tick(m, now)
        m.used += r.prompt_tokens
        self.pool_running += 1
        self._charge(ticket, self.cost.input_cost(m.name, r.prompt_tokens), now)
        return True

    def _charge(self, ticket: Ticket, amount: float, now: float) -> None:
        ticket.charged += amount
        if self._charge_cb is not None:
            self._charge_cb(now, ticket.request, amount)


def _about(ticket: Ticket) -> dict[str, Any]:
    r = ticket.request
    return {"model": r.model, "app": r.app, "agent": r.agent.name, "request_id": r.id}


def _check_count(value: Any, what: str, *, optional: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        extra = " or None" if optional else ""
        raise InvalidParameterError(f"{what} must be an integer ≥ 1{extra}, got {shown(value)}")

