"""Weighted fair queueing by virtual finish time, H-MAS's fairness-oriented policy (Appendix C.2).

H-MAS names WFQ in its pool ("fairness-oriented policies (WFQ/Stride/…) that enforce
tenant/class fairness", Appendix C.2; §3.4.1) without defining it, so this is standard
WFQ (Demers, Keshav & Shenker, SIGCOMM'89) with a self-clocked virtual time (SCFQ,
Golestani, INFOCOM'94). A request ``r`` of client ``c`` (weight ``w_c``) is stamped when
it arrives with::

    S_r = max(F_c, V)        F_r = S_r + L_r / w_c        F_c ← F_r

where ``F_c`` is the finish tag of ``c``'s previous request, ``V`` the virtual time and
``L_r`` the request's size; a model runs its waiting request of least finish tag, and
``V`` becomes the finish tag of the request dispatched (the largest so far: tags are
dispatched in increasing order). ``L_r`` is priced by the cost model, in unified
tokens: ``w_input · T(prompt) + w_output · T(l_pred)``, with ``l_pred`` from the shared
output-length predictor, since a request's real length is not known until it ends.

Where the paper is silent, and what is done here:

- **Clients** are apps, weighted by the app's weight (``client="app"``), or agents,
  each weighted by its own weight (``client="agent"``), as in VTC.
- **Virtual time.** Self-clocked (above) rather than a GPS emulation: an LLM engine has
  no fixed rate to emulate. ``V`` and the tags are global across the pool's models,
  so a client's share is of the whole pool, as with VTC and HMFS.
- **Mispredictions are not corrected.** A tag is fixed at arrival from ``l_pred``;
  a client whose lengths are under-predicted gets more than its share until the
  predictor learns (its error is in ``policy.predictor.error``).
- **A cancelled waiting request** gives its virtual service back when it was its
  client's latest (``F_c`` returns to its start tag); otherwise it is not refunded.

How it differs from VTC (:class:`~fairagents.policies.VTC`). VTC looks back: it
charges each client for tokens actually served, as they stream, and runs the client
with the least counter. WFQ looks ahead: it charges a request its predicted size when
it arrives and runs the least finish tag, so among clients of equal standing the
shorter request goes first, and a client's share is exact only as far as the
predictions are. Both give an idle client no banked credit (VTC's counter lift, WFQ's
``max(F_c, V)``).

Starvation. None: a request arriving after ``r`` is stamped at or above the virtual
time of its arrival, which is at least ``V(a_r)``, and each client's tags rise by at
least its smallest ``L / w`` per request, so each client passes ``r`` at most
``(F_r − V(a_r)) · w_c / L_min + 1`` times, however long it keeps sending.

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

from __future__ import annotations

from typing import ClassVar, Literal

from fairagents.cost import CostModel
from fairagents.errors import InvalidParameterError
from fairagents.policies._predicted import Estimate, PredictivePolicy
from fairagents.policies.predict import LengthPredictor
from fairagents.request import Request

__all__ = ["WFQ"]


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
        >>> fa.policies.wfq.WFQ(client="agent").client
        'agent'
    """

    name: ClassVar[str] = "wfq"

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

    def virtual_time(self) -> float:
        """``V``: the finish tag of the latest dispatched request (0 before any).

        Examples:
            >>> import fairagents as fa
            >>> fa.policies.wfq.WFQ().virtual_time()
            0.0
        """
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

    def _client(self, req: Request) -> tuple[object, float]:
        if self.client == "app":
            return req.agent.app.name, req.agent.app.weight
        return req.agent.key, req.agent.weight

    def _key(self, req: Request, est: Estimate, now: float) -> float:
        client, weight = self._client(req)
        size = self.cost.input_cost(req.model, req.prompt_tokens) + self.cost.output_cost(req.model, est.length)
        start = max(self._last.get(client, 0.0), self._vtime)
        finish = self._last[client] = start + size / weight
        self._start[req.id] = start
        return finish

    def _dequeue(self, req: Request, now: float, dispatched: bool) -> None:
        finish = self._queues.key(req)
        start = self._start.pop(req.id)
        super()._dequeue(req, now, dispatched)
        if dispatched:
            self._vtime = max(self._vtime, finish)
        else:
            client, _ = self._client(req)
            if self._last.get(client) == finish:
                self._last[client] = start
