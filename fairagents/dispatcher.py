"""The dispatcher: what is admitted, what runs, and what it costs — for the arbiter and the simulator alike.

One synchronous object owns every admission decision. The live
:class:`~fairagents.Arbiter` is an async adapter over it (futures, streams, engine
calls); the simulator drives the same object on a virtual clock. So the guarantees
proven on the simulator are properties of the code that serves.

It is pure like the policies: no asyncio, no clock of its own (``now`` comes in, in
seconds), no engine calls. Drivers report **events** — :meth:`~Dispatcher.arrive`,
:meth:`~Dispatcher.cancel`, :meth:`~Dispatcher.progress`, :meth:`~Dispatcher.finish`,
:meth:`~Dispatcher.fail`, :meth:`~Dispatcher.model_down`, :meth:`~Dispatcher.model_up`,
:meth:`~Dispatcher.close` — and each returns the :class:`Changes` it caused: the
tickets to start on their engines now, and the tickets that ended. Dispatching is
not an event of its own: it happens inside every event, whenever a model has room.

**Admission.** A model takes a waiting request when all three hold:

- it has a free **slot** (its in-flight limit: requests handed to its engine at once);
- the pool has a free slot, if the models share a pool-wide limit;
- its **token budget** has room for the request's reservation: ``prompt + max_tokens``
  tokens, rounded up to the engine's KV block, of the model's KV capacity.

The reservation is the request's worst case, so the engine never runs out of KV for
what it was handed: it never preempts, and nothing waits in its own (FCFS) queue, so
the order of service stays the policy's. The price is throughput when requests ask
for far more ``max_tokens`` than they use: the budget then runs fewer requests than
the KV could hold. That is the choice made here — a guarantee over a guess; set a
larger budget than the KV (``token_budget=``) to overcommit knowingly, and the engine
then preempts in its own order when output runs long.

**Per-app share (optional).** ``app_share`` caps what one app may hold of a model: at
most ``max(1, ⌊share × slots⌋)`` of its slots and ``share × token budget`` of its KV
tokens (an app holding nothing may always run one request). So a flooding app cannot
take every slot, and another app's request finds one free within one request's run
time. The cap holds requests back *before* the policy sees them: an app's requests
are shown to the policy only while those it has running or shown fit within its cap;
the rest wait, in arrival order, in the dispatcher, and are shown as the app's running
requests end. Every request the policy picks can therefore run, and to the policy a
held-back request simply arrives later. Capping is not work-conserving — with only
the capped app asking, the rest of the model stays idle — which is the point: it
buys the other apps' latency with the capped app's throughput.

**Admission control (optional).** ``admission=Statera()`` trades the worst-case
guarantee for throughput, as H-MAS does (:mod:`fairagents.admission`): a request
reserves ``prompt`` plus a conformal upper bound on its output instead of
``max_tokens`` (exceeded with probability ``ε``; a request that outgrows it has its
reservation raised as it goes), and a two-loop controller tightens each model's
in-flight limit and token budget (``slot_limit``, ``budget_limit``) when the model runs
hot. A model with nothing running always takes the policy's next request.

When the policy's choice for a model does not fit the budget, the model takes nothing
else until it does (no smaller request jumps ahead): skipping would hand the model to
whoever asks least, and a large request could wait forever. A request whose
reservation exceeds the whole budget is refused at arrival
(:class:`~fairagents.ContextLengthError`), so the head always fits once the model
drains: a model with waiting requests is never left with nothing running (work
conservation).

**Pricing.** One cost model prices everything (:attr:`Dispatcher.cost`): input is
charged at dispatch and output as :meth:`~Dispatcher.progress` reports it; the
``charge`` callback receives every amount (the arbiter's ledger, the simulator's
charge list). The policy prices its own counters through its cost model, which is the
same object unless the policy counts raw tokens on purpose (``vtc``).

**It never raises into a bystander.** Events about one request raise only for that
request's own bad input (at :meth:`~Dispatcher.arrive`, before anything changes) or a
driver's bug (:class:`~fairagents.errors.ProtocolError`). Ending a request that has
already ended is a no-op, so a cancellation and a completion racing in one tick are
both safe. ``is_live`` lets the driver veto a dispatch: a request whose caller left
before its turn came is ended as cancelled, uncharged, and the slot goes to the next.

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

import enum
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from fairagents.cost import ModelProfile, UnifiedTokenCost, service_bound
from fairagents.errors import (
    ContextLengthError,
    EngineError,
    FairAgentsError,
    InvalidParameterError,
    ProtocolError,
    ShutdownError,
    UnknownModelError,
)
from fairagents.metrics import RequestRecord
from fairagents.policies.base import Policy
from fairagents.request import Outcome, Request

if TYPE_CHECKING:
    from fairagents.admission import Statera

__all__ = ["Changes", "Dispatcher", "ModelState", "Ticket", "TicketState"]


class TicketState(enum.Enum):
    """Where a request is.

    Examples:
        >>> from fairagents.dispatcher import TicketState
        >>> TicketState.WAITING.value
        'waiting'
    """

    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's admission and accounting, from arrival to its end.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.dispatcher import Ticket
        >>> who = fa.Agent("bot", fa.App("a"))
        >>> Ticket(fa.Request("r1", who, "chat", 10, 20, 0.0), reserved=32).state.value
        'waiting'
    """

    request: Request
    reserved: int
    """Tokens of the model's budget this request holds while it runs (raw tokens)."""
    state: TicketState = TicketState.WAITING
    dispatched: float | None = None
    """When it was handed to its engine (seconds), if it was."""
    first_token: float | None = None
    """When its first output arrived (seconds), if it did."""
    ended: float | None = None
    """When it ended (seconds), if it did."""
    produced: int = 0
    """Output tokens generated (raw tokens)."""
    charged: float = 0.0
    """Service charged for it so far (the cost model's units: unified tokens)."""
    outcome: Outcome | None = None
    error: FairAgentsError | None = None
    """Why the dispatcher ended it, when it did so itself (model down, shut down)."""
    held_back: bool = False
    """Waiting in the dispatcher, not yet shown to the policy: its app is at its share of the model."""
    predicted: int | None = None
    """Output tokens predicted, under an admission controller (``l_pred``; at arrival, and again
    each time the request is considered for dispatch)."""
    bound: int | None = None
    """Output tokens reserved for, under an admission controller (``l_upper``; when ``predicted`` is)."""

    def record(self) -> RequestRecord:
        """The request's record (valid once it ended)."""
        r = self.request
        return RequestRecord(
            r.id, r.app, r.agent.name, r.model, r.arrival, self.dispatched, self.first_token,
            self.ended if self.ended is not None else r.arrival, r.prompt_tokens, self.produced,
            self.outcome or Outcome.FAILED, r.agent.effective_slo,
        )


@dataclass(frozen=True, slots=True)
class Changes:
    """What one event caused: requests to start on their engines now, and requests that ended.

    Examples:
        >>> from fairagents.dispatcher import Changes
        >>> Changes().started, Changes().ended
        ([], [])
    """

    started: list[Ticket] = field(default_factory=list)
    """Dispatched by this event, in dispatch order: the driver starts each on its engine."""
    ended: list[Ticket] = field(default_factory=list)
    """Ended by this event, the event's own request included; each ``outcome`` is set."""


@dataclass(eq=False, slots=True)
class ModelState:
    """A model's admission state.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.dispatcher import ModelState
        >>> ModelState("chat", slots=4, token_budget=None, max_model_len=128, block=1).has_slot()
        True
    """

    name: str
    slots: int
    """Most requests handed to the engine at once."""
    token_budget: int | None
    """Most KV tokens reserved at once (``None``: no token budget)."""
    max_model_len: int
    """Longest ``prompt + max_tokens`` the model takes (raw tokens)."""
    block: int
    """Reservations are rounded up to this many tokens (the engine's KV block)."""
    running: int = 0
    reserved: int = 0
    """KV tokens reserved by its running requests."""
    used: int = 0
    """KV tokens its running requests hold now: prompt + output so far."""
    down: EngineError | None = None
    """Why it is down, while it is."""
    slot_limit: int | None = None
    """In-flight limit set by an admission controller (≤ ``slots``), if one steers the model."""
    budget_limit: int | None = None
    """Token budget set by an admission controller (≤ ``token_budget``), if one steers the model."""

    def has_slot(self) -> bool:
        if self.down is not None or self.running >= self.slots:
            return False
        return self.slot_limit is None or self.running < self.slot_limit or not self.running

    def fits(self, ticket: Ticket) -> bool:
        if self.token_budget is None or not self.running:
            return True  # alone, a request always fits: arrive() refused any larger than the whole budget
        budget = self.token_budget if self.budget_limit is None else self.budget_limit
        return self.reserved + ticket.reserved <= budget


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
        admission: an admission controller that reserves predicted bounds instead of
            worst cases and steers each model's in-flight limit and token budget
            (:class:`~fairagents.admission.Statera`); ``None``: worst-case reservations
            under the fixed limits.
        gate: called with ``(ticket, model)`` for the policy's choice once it has a slot
            and fits the budget; ``False`` holds it (and the model) back until the next
            event or :meth:`refill`, as a request that does not fit is held. Arbiters that
            share counters and a model's capacity gate on the pool-wide view
            (:meth:`fairagents.shared.SharedView.gate`).

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
        admission: Statera | None = None,
        gate: Callable[[Ticket, ModelState], bool] | None = None,
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
        self.admission = admission
        self.gate = gate
        self._held: dict[tuple[str, str], list[int]] = {}  # (app, model) -> [requests, tokens] running or shown
        self._held_back: dict[tuple[str, str], deque[Ticket]] = {}  # (app, model) -> waiting, not yet shown

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
    ) -> ModelState:
        """Add a model: its profile joins the cost model (and the policy's, if separate)."""
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
        state = self._models[name] = ModelState(name, slots, token_budget, max_model_len, block)
        if self.admission is not None:
            self.admission.add_model(state)
        return state

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

    def queued(self, model: str | None = None) -> int:
        """Requests waiting for ``model`` (or for any model), those held back by an app's share included."""
        shown = self.policy.queued(model)
        held = sum(len(q) for (_, m), q in self._held_back.items() if model is None or m == model)
        return shown + held

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

    def ticket(self, request_id: str) -> Ticket | None:
        """The ticket of a request that has not ended, if any."""
        return self._tickets.get(request_id)

    def reservation(self, model: str, prompt_tokens: int, max_tokens: int) -> int:
        """Tokens a request of that size reserves of ``model``'s budget (rounded up to its KV block)."""
        block = self.model(model).block
        return -(-(prompt_tokens + max_tokens) // block) * block

    def bound(self, max_request_tokens: int | None = None) -> float:
        """``U`` of the fairness guarantee under these limits (see :func:`~fairagents.service_bound`).

        A model holds at most ``slots`` requests of at most ``max_request_tokens``
        (default and cap: its context), and at most its token budget — unless an
        admission controller reserves less than the worst case: then the budget no
        longer bounds the tokens its requests may come to hold, and only the slots do.
        """
        longest, held = {}, {}
        for m in self._models.values():
            longest[m.name] = m.max_model_len if max_request_tokens is None else min(max_request_tokens, m.max_model_len)
            slots = m.slots if self.pool_slots is None else min(m.slots, self.pool_slots)
            held[m.name] = slots * longest[m.name]
            if m.token_budget is not None and self.admission is None:
                held[m.name] = min(held[m.name], m.token_budget)
        return service_bound(self.cost, held, pool=self.pool_slots, longest=longest)

    # -- events ------------------------------------------------------------------------

    def arrive(self, request: Request, now: float) -> Changes:
        """Queue ``request``; raises, changing nothing, if it can never run here.

        Raises:
            UnknownModelError: the model is not in the pool.
            ContextLengthError: ``prompt + max_tokens`` exceeds the model's context or
                its whole token budget.
            EngineError: the model is down.
            ShutdownError: the dispatcher is closed.
        """
        about = {"model": request.model, "app": request.app, "agent": request.agent.name, "request_id": request.id}
        if self._closed:
            raise ShutdownError("the arbiter is closed and admits no new requests", **about)
        m = self.model(request.model)
        if request.id in self._tickets:
            raise ProtocolError(f"request id {request.id!r} is already queued or running", **about)
        size = request.prompt_tokens + request.max_tokens
        if size > m.max_model_len:
            raise ContextLengthError(
                f"prompt ({request.prompt_tokens} tokens) + max_tokens ({request.max_tokens}) exceeds the context of "
                f"model {m.name!r} ({m.max_model_len} tokens)", **about,
            )
        reserved = self.reservation(m.name, request.prompt_tokens, request.max_tokens)
        if m.token_budget is not None and reserved > m.token_budget:
            raise ContextLengthError(
                f"prompt ({request.prompt_tokens} tokens) + max_tokens ({request.max_tokens}) needs {reserved} tokens "
                f"of KV cache; model {m.name!r} holds {m.token_budget} in all", **about,
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
        return self._changes(m, now, [])

    def progress(self, request_id: str, new_tokens: int, now: float) -> float:
        """A running request produced ``new_tokens`` more output tokens; returns their charge."""
        # The hot path of every driver (one call per streamed chunk, per token in the simulator): lean on purpose.
        ticket = self._tickets.get(request_id)
        if ticket is None or ticket.state is not _RUNNING:
            raise ProtocolError(f"request {request_id!r} is not running", request_id=request_id)
        if not new_tokens:
            return 0.0
        r = ticket.request
        if ticket.first_token is None:
            ticket.first_token = now
        ticket.produced += new_tokens
        m = self._models[r.model]
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
        for ticket in [t for t in self._tickets.values() if t.request.model == model and t.state is TicketState.WAITING]:
            ticket.error = EngineError(f"model {model!r} is down: {error}", **_about(ticket))
            self._end(ticket, Outcome.FAILED, now)
            ended.append(ticket)
        return self._changes(m, now, ended)

    def model_up(self, model: str, now: float) -> Changes:
        """``model``'s engine serves again: it takes requests."""
        m = self.model(model)
        m.down = None
        return self._changes(m, now, [])

    def close(self, now: float) -> Changes:
        """Admit and dispatch nothing more: every waiting request ends (failed, with a ShutdownError)."""
        self._closed = True
        ended = []
        for ticket in [t for t in self._tickets.values() if t.state is TicketState.WAITING]:
            ticket.error = ShutdownError("the arbiter shut down before the request ran", **_about(ticket))
            self._end(ticket, Outcome.FAILED, now)
            ended.append(ticket)
        return Changes([], ended)

    def refill(self, now: float) -> Changes:
        """Dispatch into every model with room: what changed outside is worth a new look (a gate opened)."""
        if self._closed:
            return _NOTHING
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
        if ticket.state is TicketState.RUNNING:
            m.running -= 1
            m.reserved -= ticket.reserved
            if self.admission is not None:
                self.admission.tick(m, now)
            m.used -= r.prompt_tokens + ticket.produced
            self.pool_running -= 1
            if self.admission is not None:
                self.admission.on_end(ticket, outcome is Outcome.FINISHED, self.cost)
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
        self.policy.on_finish(r, outcome, now)
        held = self._held.get(key)
        if held is not None:
            held[0] -= 1
            held[1] -= ticket.reserved
            if not held[0]:
                del self._held[key]
        if not self._closed and m.down is None:
            self._show_held_back(key, now)

    def _within_share(self, ticket: Ticket) -> bool:
        r = ticket.request
        cap = self.share_cap(r.app, r.model)
        held = self._held.get((r.app, r.model))
        if cap is None or held is None:
            return True  # no cap, or the app holds nothing of the model: one request may always run
        slots, tokens = cap
        return held[0] < slots and (tokens is None or held[1] + ticket.reserved <= tokens)

    def _show(self, ticket: Ticket, now: float) -> None:
        """Hand a waiting request to the policy; it now counts against its app's share."""
        r = ticket.request
        self.policy.on_arrival(r, now)
        ticket.held_back = False
        held = self._held.setdefault((r.app, r.model), [0, 0])
        held[0] += 1
        held[1] += ticket.reserved

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
            except FairAgentsError as err:
                self._refused(ticket, err, now)
            except Exception as err:  # a custom policy's bug: the request fails, not the bystander
                self._refused(ticket, ProtocolError(f"the policy refused a held-back request: {err!r}",
                                                    **_about(ticket)), now)
        if queue is not None and not queue:
            del self._held_back[key]

    def _refused(self, ticket: Ticket, err: FairAgentsError, now: float) -> None:
        del self._tickets[ticket.request.id]
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
        if self.admission is None:
            return
        r = ticket.request
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
                self.admission.tick(m, now)
        started = self._fill(touched, now)
        if self._withdrawn:
            ended = ended + self._withdrawn
            self._withdrawn = []
        return Changes(started, ended)

    def _fill(self, touched: ModelState, now: float) -> list[Ticket]:
        """Dispatch while there is room: into ``touched``, or anywhere in the pool under a pool limit."""
        if self._closed:
            return []
        if self.pool_slots is None:
            return self._fill_model(touched, now)
        return self._fill_pool(now)

    def _fill_model(self, m: ModelState, now: float) -> list[Ticket]:
        started: list[Ticket] = []
        select = self.policy.select
        while m.has_slot():
            req = select(m.name, now)
            if req is None:
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
        room = [m.name for m in self._models.values() if m.has_slot()]
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
        self.policy.on_dispatch(r, now)
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
        raise InvalidParameterError(f"{what} must be an integer ≥ 1{extra}, got {value!r}")

