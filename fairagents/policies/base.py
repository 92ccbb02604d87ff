"""The policy interface, and the bookkeeping every built-in policy shares.

A policy decides which waiting request a model runs next. It is pure and
synchronous: no asyncio, no clock of its own (``now`` comes in, in seconds), no
engine calls. The same object then runs in microseconds under a unit test, in the
simulator on a virtual clock, and inside the live arbiter.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterable
from typing import Any, ClassVar, Protocol, runtime_checkable

from fairagents.cost import CostModel, prompt_cost
from fairagents.errors import ProtocolError
from fairagents.identity import Agent
from fairagents.request import Outcome, Request

__all__ = ["BasePolicy", "DefersInput", "Policy", "checked_charge"]


def checked_charge(amount: float, req: Request) -> float:
    """``amount`` if it is a charge a counter may take: a finite number ≥ 0 (unified tokens).

    A cost model that prices a NaN or an infinity would poison every comparison after
    it, so the charge is refused where it is made, before any counter moves.

    Raises:
        ProtocolError: ``amount`` is NaN, infinite or negative (a cost model's bug).

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.policies.base import checked_charge
        >>> req = fa.Request("r1", fa.Agent("a", fa.App("x")), "m", 1, 1, arrival=0.0)
        >>> checked_charge(2.5, req)
        2.5
        >>> checked_charge(float("nan"), req)
        Traceback (most recent call last):
        ...
        fairagents.errors.ProtocolError: request 'r1' was priced at nan unified tokens; a charge is a finite number ≥ 0
    """
    if not 0.0 <= amount < math.inf:  # NaN fails every comparison
        raise ProtocolError(f"request {req.id!r} was priced at {amount!r} unified tokens; a charge is a finite "
                            "number ≥ 0", model=req.model, app=req.app, agent=req.agent.name, request_id=req.id)
    return amount


@runtime_checkable
class Policy(Protocol):
    """Decides whose request a model runs next.

    Contract, for anything that drives a policy (the simulator, the arbiter):

    - ``on_arrival`` once per request, before anything else about it. A request
      the policy cannot price (an unknown model) raises and is not queued.
    - ``select(model, now)`` whenever ``model`` has room. It does not change what
      is queued (calling it twice gives the same answer) and returns a waiting
      request for ``model`` whenever there is one (work conservation).
    - ``select_among(models, now)`` when the models share capacity (a pool-wide
      in-flight limit) and one slot is free: the request to run next on any of
      ``models`` (those with room), by the same rule across models, since counters
      are global across the pool. Pure like ``select``.
    - ``on_dispatch`` when a waiting request is handed to its engine: it leaves
      the queue and its input is charged.
    - ``on_progress`` as output is generated (``new_output_tokens`` ≥ 0 since the
      last call): the output is charged as it happens, not at the end.
    - ``on_finish`` exactly once when a request ends, waiting or running; a
      waiting request that is cancelled leaves the queue uncharged.

    Examples:
        >>> import fairagents as fa
        >>> policy = fa.policies.make_policy("fcfs")
        >>> who = fa.Agent("a", fa.App("x"))
        >>> req = fa.Request(id="r1", agent=who, model="chat", prompt_tokens=4, max_tokens=8, arrival=0.0)
        >>> policy.on_arrival(req, now=0.0)
        >>> policy.select("chat", now=0.0) is req
        True
        >>> policy.on_dispatch(req, now=0.0); policy.queued()
        0
    """

    name: ClassVar[str]

    def on_arrival(self, req: Request, now: float) -> None:
        """A request arrived; queue it."""
        ...

    def select(self, model: str, now: float) -> Request | None:
        """The waiting request ``model`` should run next, or ``None`` if none waits."""
        ...

    def select_among(self, models: Iterable[str], now: float) -> Request | None:
        """The waiting request to run next on any of ``models``, or ``None`` if none waits."""
        ...

    def on_dispatch(self, req: Request, now: float) -> None:
        """``req`` left the queue for its engine; charge its input."""
        ...

    def on_progress(self, req: Request, new_output_tokens: int, now: float) -> None:
        """``req`` generated ``new_output_tokens`` more tokens; charge them."""
        ...

    def on_finish(self, req: Request, outcome: Outcome, now: float) -> None:
        """``req`` ended (finished, cancelled or failed), waiting or running."""
        ...

    def queued(self, model: str | None = None) -> int:
        """Number of waiting requests, for one model or all."""
        ...


@runtime_checkable
class DefersInput(Protocol):
    """A policy that can take a request into a batch before charging its input (every :class:`BasePolicy`).

    An engine's scheduler may choose a request and then not schedule it (a grammar
    still compiling); it charges the input only once the engine confirms it admitted the
    request. A policy without these methods is charged at once, by ``on_dispatch``.

    Examples:
        >>> import fairagents as fa
        >>> policy, who = fa.policies.HMFS(), fa.Agent("t", fa.App("a"))
        >>> isinstance(policy, fa.policies.DefersInput)
        True
        >>> policy.cost.register("m", fa.ModelProfile(d_model=4096, n_layers=1))
        >>> r = fa.Request("r1", who, "m", prompt_tokens=10, max_tokens=4, arrival=0.0)
        >>> policy.on_arrival(r, now=0.0); policy.on_take(r, now=0.0)
        >>> policy.counters_of(who)          # taken: nothing charged yet
        (0.0, 0.0)
        >>> policy.on_input(r, 10, now=0.1, cached=5)  # the engine ran it, 5 tokens read from its prefix cache
        >>> policy.counters_of(who)
        (5.5, 5.5)
    """

    def on_take(self, req: Request, now: float) -> None:
        """``req`` left the queue for its engine; its input is not charged yet."""
        ...

    def on_input(self, req: Request, tokens: int, now: float, cached: int = 0) -> None:
        """The engine admitted ``tokens`` of ``req``'s input, ``cached`` of them read from its prefix cache: charge them."""
        ...


class BasePolicy(abc.ABC):
    """Shared bookkeeping: which requests wait and run, charging through a cost model.

    Subclasses implement the ordering (``_enqueue``, ``_dequeue``, ``select``) and,
    if they keep counters, ``_charge``. The base class validates every transition
    so that a driver bug surfaces as an error rather than a silent unfairness.

    Examples:
        Newest first, the smallest subclass (the base class validates the calls):

        >>> import fairagents as fa
        >>> class Newest(fa.policies.BasePolicy):
        ...     name = "newest"
        ...     def __init__(self):
        ...         super().__init__(fa.RawTokenCost())
        ...         self.stacks: dict[str, list[fa.Request]] = {}
        ...     def select(self, model, now):
        ...         stack = self.stacks.get(model)
        ...         return stack[-1] if stack else None
        ...     def _enqueue(self, req, now):
        ...         self.stacks.setdefault(req.model, []).append(req)
        ...     def _dequeue(self, req, now, dispatched):
        ...         self.stacks[req.model].remove(req)
        >>> policy, who = Newest(), fa.Agent("a", fa.App("x"))
        >>> for i in ("r1", "r2"):
        ...     policy.on_arrival(fa.Request(i, who, "m", 1, 1, arrival=0.0), now=0.0)
        >>> r2 = policy.select("m", now=0.0); policy.on_dispatch(r2, now=0.0); r2.id
        'r2'
        >>> policy.on_dispatch(r2, now=0.0)
        Traceback (most recent call last):
        ...
        fairagents.errors.ProtocolError: request 'r2' is not waiting
    """

    name: ClassVar[str]
    #: Whether :func:`~fairagents.policies.make_policy` hands it the pool's unified cost model.
    charges_unified_tokens: ClassVar[bool] = False
    #: Whether it orders clients by the service they received, so that :meth:`lead` compares two (a
    #: waiting client owed service may then preempt a more-served one inside an engine).
    orders_by_service: ClassVar[bool] = False
    #: Whether its output charge depends only on a request's client and model (``_charge`` adds to the
    #: client's counters, ``on_progress`` is the base class's): an engine may then sum a step's output
    #: per client and charge each sum once (:meth:`charge_output`).
    charges_by_client: ClassVar[bool] = False
    #: Whether the order it serves depends on the agents' SLOs (deadlines, SLO attainment). An SLO
    #: then weighs against other apps' requests, so a server takes agents' SLOs from its configuration only.
    reads_slos: ClassVar[bool] = False

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self._output_cost = cost.output_cost  # bound once: called for every streamed chunk
        # A policy that keeps no counters (no _charge of its own) needs output validated, never priced.
        self._counts_service = type(self)._charge is not BasePolicy._charge
        self._waiting: dict[str, Request] = {}
        self._running: dict[str, Request] = {}
        self._waiting_per_model: dict[str, int] = {}
        self._taking = False  # in on_take's _dequeue: a policy that wraps others takes from them too

    # -- driver-facing -----------------------------------------------------

    def on_arrival(self, req: Request, now: float) -> None:
        """Queue ``req``; raises (queuing nothing) if it cannot be priced or is a duplicate."""
        if req.id in self._waiting or req.id in self._running:
            raise ProtocolError(f"request id {req.id!r} is already queued or running")
        self.cost.input_cost(req.model, req.prompt_tokens)  # raises UnknownModelError before queuing
        self._waiting[req.id] = req
        self._waiting_per_model[req.model] = self._waiting_per_model.get(req.model, 0) + 1
        self._enqueue(req, now)

    def on_dispatch(self, req: Request, now: float) -> None:
        """Move ``req`` from the queue to running and charge its input.

        Raises:
            ProtocolError: ``req`` is not waiting, or its input prices at a charge that is
                not a finite number ≥ 0 (the request stays waiting; nothing is charged).
        """
        self._leave_queue(req, now, charge_input=True)

    def on_take(self, req: Request, now: float) -> None:
        """Move ``req`` from the queue to running, its input charged later by :meth:`on_input` (see :class:`DefersInput`)."""
        self._leave_queue(req, now, charge_input=False)

    def on_input(self, req: Request, tokens: int, now: float, cached: int = 0) -> None:
        """Charge ``tokens`` of input to a running request taken by :meth:`on_take`, as its engine confirms them.

        ``cached`` of them the engine read from its prefix cache: they are charged at the
        cost model's ``w_cached`` (:func:`~fairagents.cost.prompt_cost`).

        Raises:
            ProtocolError: ``req`` is not running, or the charge is not a finite number ≥ 0.
            InvalidParameterError: ``cached`` is not in ``[0, tokens]``.
        """
        if req.id not in self._running:
            raise ProtocolError(f"request {req.id!r} is not running")
        if tokens:
            self._charge(req, checked_charge(prompt_cost(self.cost, req.model, tokens, cached), req), now)

    def _leave_queue(self, req: Request, now: float, *, charge_input: bool) -> None:
        if req.id not in self._waiting:
            raise ProtocolError(f"request {req.id!r} is not waiting")
        amount = checked_charge(self.cost.input_cost(req.model, req.prompt_tokens), req)
        del self._waiting[req.id]
        self._waiting_per_model[req.model] -= 1
        self._taking = not charge_input
        try:
            self._dequeue(req, now, dispatched=True)
        finally:
            self._taking = False
        self._running[req.id] = req
        if charge_input:
            self._charge(req, amount, now)

    def on_progress(self, req: Request, new_output_tokens: int, now: float) -> None:
        """Charge ``new_output_tokens`` of output to ``req``'s app and agent.

        Raises:
            ProtocolError: ``req`` is not running, or the output prices at a charge that is
                not a finite number ≥ 0 (nothing is charged).
        """
        if req.id not in self._running:
            raise ProtocolError(f"request {req.id!r} is not running")
        if new_output_tokens:  # the cost model rejects a negative or non-integer count
            if self._counts_service:
                self._charge(req, checked_charge(self._output_cost(req.model, new_output_tokens), req), now)
            elif type(new_output_tokens) is not int or new_output_tokens < 0:
                self._output_cost(req.model, new_output_tokens)  # raises for a bad count, as pricing it would

    def charge_output(self, req: Request, new_output_tokens: int, now: float) -> None:
        """Charge ``new_output_tokens`` of output to ``req``'s client: those of every running request of that
        client and model in one engine step, summed (for a policy that :attr:`charges_by_client`).

        The same charge as :meth:`on_progress` of each; an engine with a thousand requests in
        its batch prices and charges its step once per client.

        Raises:
            ProtocolError: as :meth:`on_progress`.
        """
        if not self._counts_service:
            self.on_progress(req, new_output_tokens, now)
            return
        if req.id not in self._running:
            raise ProtocolError(f"request {req.id!r} is not running")
        self._charge(req, checked_charge(self._output_cost(req.model, new_output_tokens), req), now)

    def on_finish(self, req: Request, outcome: Outcome, now: float) -> None:
        """Forget ``req``; a waiting one leaves the queue uncharged."""
        if self._waiting.pop(req.id, None) is not None:
            self._waiting_per_model[req.model] -= 1
            self._dequeue(req, now, dispatched=False)
        elif self._running.pop(req.id, None) is None:
            raise ProtocolError(f"request {req.id!r} is neither waiting nor running")

    def lead(self, head: Agent, other: Agent) -> float | None:
        """How far ``other``'s client is served beyond ``head``'s, in the policy's cost at ``head``'s weight.

        At the level where the two differ (their apps, or two agents of one app, as the
        policy defines a client); ``None`` when they are one client, or the policy does
        not order by service (:attr:`orders_by_service`). A waiting request of ``head``
        may preempt a running one of ``other`` when the lead exceeds what preempting
        costs (the head's prompt and the work thrown away).
        """
        return None

    def leads(self, head: Agent, others: Iterable[Agent]) -> list[float | None]:
        """:meth:`lead` of ``head`` over each of ``others`` (a policy may compute them faster together)."""
        return [self.lead(head, other) for other in others]

    def queued(self, model: str | None = None) -> int:
        """Number of waiting requests, for one model or all."""
        if model is None:
            return len(self._waiting)
        return self._waiting_per_model.get(model, 0)

    def waiting_requests(self) -> list[Request]:
        """The requests waiting, in no particular order."""
        return list(self._waiting.values())

    def running(self) -> int:
        """Number of dispatched requests that have not finished."""
        return len(self._running)

    @abc.abstractmethod
    def select(self, model: str, now: float) -> Request | None:
        """The waiting request ``model`` should run next, or ``None``."""

    def select_among(self, models: Iterable[str], now: float) -> Request | None:
        """The waiting request to run next on any of ``models``: each model's choice, least ``_rank`` first.

        A pool has a handful of models, so asking each costs little; ties keep the
        order of ``models``.
        """
        best: Request | None = None
        best_rank: Any = None
        for model in models:
            req = self.select(model, now)
            if req is not None:
                rank = self._rank(req)
                if best is None or rank < best_rank:
                    best, best_rank = req, rank
        return best

    # -- subclass hooks ----------------------------------------------------

    @abc.abstractmethod
    def _enqueue(self, req: Request, now: float) -> None:
        """Add a newly waiting request to the ordering structures."""

    @abc.abstractmethod
    def _dequeue(self, req: Request, now: float, dispatched: bool) -> None:
        """Remove a request that stopped waiting: dispatched, or cancelled if not ``dispatched``."""

    def _rank(self, req: Request) -> Any:
        """How urgent a model's own choice is against other models' (lower first); arrival by default."""
        return req.arrival

    def _charge(self, req: Request, amount: float, now: float) -> None:
        """Account ``amount`` of service to ``req``'s client(s); no-op by default."""
