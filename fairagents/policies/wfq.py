"""Weighted fair queueing by virtual finish time, H-MAS's fairness-oriented policy (Appendix C.2).

H-MAS names WFQ without defining it; this is standard WFQ with a self-clocked virtual
time (SCFQ). A request ``r`` of client ``c`` (weight ``w_c``) is stamped when it arrives::

    S_r = max(F_c, V)        F_r = S_r + L_r / w_c        F_c ← F_r

A model runs its waiting request of least finish tag, and ``V`` becomes the tag of the
request dispatched. ``L_r`` is the predicted size in unified tokens,
``w_input · T(prompt) + w_output · T(l_pred)``; a tag is fixed at arrival, so
mispredictions are not corrected. A request preempted inside an engine resumes with the
tags it had: its client was given its size once. Clients are apps (``client="app"``) or agents
(``client="agent"``), each with its own weight; tags and ``V`` are global across the
pool. Unlike :class:`~fairagents.policies.VTC`, which charges tokens as they are served,
WFQ charges a request's predicted size up front, so among clients of equal standing the
shorter request goes first. A cancelled waiting request that was its client's latest
gives its virtual service back. No request starves.

See the policies page in the docs (*Choosing a policy*, the H-MAS pool) for the bound.
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar, Literal

from fairagents.cost import CostModel
from fairagents.errors import InvalidParameterError
from fairagents.identity import Agent
from fairagents.policies._predicted import Estimate, PredictivePolicy
from fairagents.policies.predict import LengthPredictor
from fairagents.request import Outcome, Request

__all__ = ["WFQ"]

#: Running requests cancelled whose tags are kept for their resumption (vLLM preempts one by
#: cancelling it in the policy and queueing it again); the oldest are forgotten past this.
_STOPPED_KEPT = 4096


class WFQ(PredictivePolicy):
    """Least virtual finish tag first; a client is an app (default) or an agent.

    Args:
        cost: the unified cost model that prices a request's size (and gives each
            model's modality).
        client: ``"app"`` (weighted by the app's weight) or ``"agent"`` (every agent
            of every app is its own client, weighted by the agent's weight).
        predictor: the output-length predictor; pass one to share it with other
            policies, a new one by default.

    Examples:
        >>> import fairagents as fa
        >>> cost = fa.UnifiedTokenCost({"chat": fa.ModelProfile(d_model=4096, n_layers=1)})
        >>> policy = fa.policies.wfq.WFQ(cost)
        >>> a, b = fa.Agent("t", fa.App("a", weight=2.0)), fa.Agent("t", fa.App("b"))
        >>> for i, who in [("a1", a), ("a2", a), ("b1", b)]:
        ...     policy.on_arrival(fa.Request(id=i, agent=who, model="chat", prompt_tokens=10,
        ...                                  max_tokens=20, arrival=0.0), now=0.0)
        >>> [policy.tags(policy.select("chat", 0.0))]   # L = 10 + 2 · 10 = 30, a's weight 2: F = 15
        [(0.0, 15.0)]
        >>> order = []
        >>> while (r := policy.select("chat", 0.0)) is not None:
        ...     order.append((r.id, policy.tags(r)[1])); policy.on_dispatch(r, 0.0)
        >>> order
        [('a1', 15.0), ('a2', 30.0), ('b1', 30.0)]
    """

    name: ClassVar[str] = "wfq"
    orders_by_service: ClassVar[bool] = True

    def __init__(
        self,
        cost: CostModel | None = None,
        *,
        client: Literal["app", "agent"] = "app",
        predictor: LengthPredictor | None = None,
    ) -> None:
        if client not in ("app", "agent"):
            raise InvalidParameterError(f"WFQ client must be 'app' or 'agent', got {client!r}")
        super().__init__(cost, predictor=predictor)
        self.client = client
        self._vtime = 0.0
        self._last: dict[object, float] = {}  # client -> finish tag of its latest request
        self._start: dict[str, float] = {}  # waiting request id -> start tag
        self._waiting_of: dict[object, deque[str]] = {}  # client -> its waiting request ids, in arrival order
        self._given: dict[object, float] = {}  # client -> finish tag of its latest dispatched request
        self._dispatched_tags: dict[str, tuple[float, float]] = {}  # running request id -> (start, finish)
        self._stopped: dict[str, tuple[float, float]] = {}  # cancelled while running, oldest first: its tags

    def virtual_time(self) -> float:
        """``V``: the finish tag of the latest dispatched request (0 before any)."""
        return self._vtime

    def tags(self, req: Request) -> tuple[float, float]:
        """``(S_r, F_r)``, the start and finish tags of a waiting request.

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.wfq.WFQ(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)},
            ...                                                   d_base=64))
            >>> r = fa.Request(id="r", agent=fa.Agent("a", fa.App("x", weight=4.0)), model="m",
            ...                prompt_tokens=8, max_tokens=8, arrival=0.0)
            >>> policy.on_arrival(r, now=0.0)
            >>> policy.tags(r)   # L = 8 + 2 · 4 = 16, weight 4
            (0.0, 4.0)
        """
        return self._start[req.id], self._queues.key(req)

    def lead(self, head: Agent, other: Agent) -> float | None:
        """How far ``other``'s client was given virtual service beyond where ``head``'s next request starts.

        ``other``'s standing is the finish tag of its latest dispatched request (what it
        was given, its running requests' predicted sizes included); ``head``'s is the
        start tag of its earliest waiting request (what it was given before it). A new
        request starts at the virtual time, so it is owed nothing at arrival; it is owed
        what others are given while it waits (its turn skipped: a grammar compiling, the
        batch full). Requests merely queued count for nobody. At ``head``'s weight.

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.WFQ(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=4096, n_layers=1)}))
            >>> flood, quiet = fa.Agent("t", fa.App("flood")), fa.Agent("t", fa.App("quiet"))
            >>> policy.on_arrival(fa.Request("q", quiet, "m", 10, 10, arrival=0.0), now=0.0)
            >>> for i in range(3):
            ...     policy.on_arrival(fa.Request(f"f{i}", flood, "m", 10, 10, arrival=0.0), now=0.0)
            >>> policy.lead(quiet, flood)   # nothing given to anyone yet
            0.0
            >>> for r in [r for r in policy.waiting_requests() if r.id in ("f0", "f1")]:
            ...     policy.on_dispatch(r, now=0.0)   # the flood is given two while q waits (its grammar compiling)
            >>> policy.lead(quiet, flood) > 0
            True
        """
        mine, theirs = self._client_of(head), self._client_of(other)
        if mine[0] == theirs[0]:
            return None
        waiting = self._waiting_of.get(mine[0])  # its head is waiting: _dequeue drops the others from the front
        mine_given = self._start[waiting[0]] if waiting else self._given.get(mine[0], 0.0)
        return (self._given.get(theirs[0], 0.0) - mine_given) * mine[1]

    def _client_of(self, agent: Agent) -> tuple[object, float]:
        return (agent.app.name, agent.app.weight) if self.client == "app" else (agent.key, agent.weight)

    def _client(self, req: Request) -> tuple[object, float]:
        if self.client == "app":
            return req.agent.app.name, req.agent.app.weight
        return req.agent.key, req.agent.weight

    def on_finish(self, req: Request, outcome: Outcome, now: float) -> None:
        """End ``req``; a running one cancelled keeps its tags for a while, in case it resumes (a preemption)."""
        if outcome is Outcome.CANCELLED and req.id in self._running:
            self._stopped[req.id] = self._dispatched_tags[req.id]
            if len(self._stopped) > _STOPPED_KEPT:
                del self._stopped[next(iter(self._stopped))]
        self._dispatched_tags.pop(req.id, None)
        super().on_finish(req, outcome, now)

    def _key(self, req: Request, est: Estimate, now: float) -> float:
        client, weight = self._client(req)
        kept = self._stopped.pop(req.id, None)
        if kept is not None:  # a preempted request resuming: it was given its size once, and keeps its place
            self._start[req.id] = kept[0]
            self._waiting_of.setdefault(client, deque()).append(req.id)
            return kept[1]
        size = self.cost.input_cost(req.model, req.prompt_tokens) + self.cost.output_cost(req.model, est.length)
        start = max(self._last.get(client, 0.0), self._vtime)
        finish = self._last[client] = start + size / weight
        self._start[req.id] = start
        self._waiting_of.setdefault(client, deque()).append(req.id)
        return finish

    def _dequeue(self, req: Request, now: float, dispatched: bool) -> None:
        finish = self._queues.key(req)
        start = self._start.pop(req.id)
        super()._dequeue(req, now, dispatched)
        client, _ = self._client(req)
        waiting = self._waiting_of.get(client)
        while waiting and waiting[0] not in self._start:  # left the queue: kept bounded by what waits
            waiting.popleft()
        if waiting is not None and not waiting:
            del self._waiting_of[client]
        if dispatched:
            self._vtime = max(self._vtime, finish)
            self._given[client] = max(self._given.get(client, 0.0), finish)
            self._dispatched_tags[req.id] = (start, finish)
        else:
            if self._last.get(client) == finish:
                self._last[client] = start
