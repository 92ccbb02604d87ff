"""The records the dispatcher shares with its drivers: tickets, model states, changes, request records.

A :class:`Ticket` follows one request from arrival to its end; a :class:`ModelState`
holds one model's admission state; each dispatcher event returns the :class:`Changes`
it caused; an ended ticket gives its :class:`RequestRecord`, which the arbiter's
ledger, the simulator and the metrics read alike. The rules that move them are the
dispatcher's (:mod:`fairagents.dispatcher`; see [Capacity and admission](../concepts/capacity.md)).

Examples:
    >>> import fairagents as fa
    >>> from fairagents.records import Ticket
    >>> ticket = Ticket(fa.Request("r1", fa.Agent("bot", fa.App("a")), "chat", 10, 20, arrival=0.0), reserved=30)
    >>> ticket.state.value, ticket.record().outcome.value   # a record of a request that never ran
    ('waiting', 'failed')
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from fairagents.errors import EngineError, FairAgentsError
from fairagents.identity import SLO
from fairagents.request import Outcome, Request

__all__ = ["Changes", "ModelState", "RequestRecord", "Ticket", "TicketState"]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """The life of one request (times in seconds on the run's clock).

    Examples:
        >>> from fairagents.records import RequestRecord
        >>> from fairagents import Outcome
        >>> r = RequestRecord("r1", "app", "agent", "chat", arrival=0.0, dispatched=0.5,
        ...                   first_token=0.7, finished=1.7, prompt_tokens=8, output_tokens=11,
        ...                   outcome=Outcome.FINISHED)
        >>> r.queue_wait, r.ttft, r.tpot, r.e2e
        (0.5, 0.7, 0.1, 1.7)
    """

    id: str
    app: str
    agent: str
    model: str
    arrival: float
    """When the request arrived."""
    dispatched: float | None
    """When it left the queue for its engine (``None`` if it never did)."""
    first_token: float | None
    """When its first output token was produced."""
    finished: float
    """When it ended, however it ended."""
    prompt_tokens: int
    """Prompt length (raw tokens)."""
    output_tokens: int
    """Output tokens actually generated (raw tokens)."""
    outcome: Outcome
    slo: SLO | None = None
    run: str | None = None
    """The run (one invocation of an agent workflow) it belonged to; ``None``: a run of its own."""

    @property
    def queue_wait(self) -> float | None:
        """Seconds between arrival and dispatch."""
        return None if self.dispatched is None else self.dispatched - self.arrival

    @property
    def ttft(self) -> float | None:
        """Seconds between arrival and the first output token."""
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first."""
        if self.first_token is None or self.output_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.output_tokens - 1)

    @property
    def e2e(self) -> float:
        """Seconds between arrival and the end."""
        return self.finished - self.arrival

    def slo_met(self) -> bool | None:
        """Whether a finished request met its SLO (``None`` without an SLO or if it did not finish)."""
        if self.slo is None or self.outcome is not Outcome.FINISHED or self.first_token is None:
            return None
        return self.slo.met(ttft=self.first_token - self.arrival, tpot=self.tpot, e2e=self.e2e)


class TicketState(enum.Enum):
    """Where a request is: waiting in the dispatcher, running on its engine, or done."""

    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's admission and accounting, from arrival to its end."""

    request: Request
    reserved: int
    """Tokens of the model's budget this request holds while it runs (raw tokens)."""
    state: TicketState = TicketState.WAITING
    dispatched: float | None = None
    """When it was handed to its engine (seconds), if it was; for an in-engine model, when it left the
    engine's queue (its first token), since it is handed over on arrival."""
    first_token: float | None = None
    """When its first output arrived (seconds), if it did."""
    ended: float | None = None
    """When it ended (seconds), if it did."""
    produced: int = 0
    """Output tokens generated (raw tokens)."""
    charged: float = 0.0
    """Service charged for it so far (the cost model's units: unified tokens)."""
    cached: int = 0
    """Prompt tokens its engine read from the prefix cache, as reported with its first token (in-engine models)."""
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
            self.outcome or Outcome.FAILED, r.agent.effective_slo, r.run,
        )


@dataclass(frozen=True, slots=True)
class Changes:
    """What one event caused: requests to start on their engines now, and requests that ended."""

    started: list[Ticket] = field(default_factory=list)
    """Dispatched by this event, in dispatch order: the driver starts each on its engine."""
    ended: list[Ticket] = field(default_factory=list)
    """Ended by this event, the event's own request included; each ``outcome`` is set."""


@dataclass(eq=False, slots=True)
class ModelState:
    """A model's admission state.

    Examples:
        >>> from fairagents.records import ModelState
        >>> m = ModelState("chat", slots=2, token_budget=None, max_model_len=128, block=1, running=2)
        >>> m.has_slot(), m.run_time is None   # full; nothing finished yet
        (False, True)
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
    run_time: float | None = None
    """Seconds a finished request ran (dispatch to end), an exponential average (0.8 old, 0.2 new);
    ``None`` until one finished. A full queue's ``retry_after`` is drawn from it."""
    in_engine: bool = False
    """Its engine schedules by the pool's policy itself: each request is handed over as it arrives
    (:class:`~fairagents.vllm.FairScheduler`); ``slots`` is then the engine's batch capacity."""
    kv_tokens: int | None = None
    """KV tokens the engine of an in-engine model holds in all (``None``: unknown)."""

    def has_slot(self) -> bool:
        """Whether it may take one more request now (up, below its limits; alone, always)."""
        if self.down is not None or self.running >= self.slots:
            return False
        return self.slot_limit is None or self.running < self.slot_limit or not self.running

    def fits(self, ticket: Ticket) -> bool:
        """Whether ``ticket``'s reservation fits its token budget now (alone, it always does)."""
        if self.token_budget is None or not self.running:
            return True  # alone, a request always fits: arrive() refused any larger than the whole budget
        budget = self.token_budget if self.budget_limit is None else self.budget_limit
        return self.reserved + ticket.reserved <= budget
