"""First come, first served: vLLM's own order, the baseline everything is compared with."""

from __future__ import annotations

import heapq
from typing import ClassVar

from fairagents.cost import CostModel, RawTokenCost
from fairagents.policies.base import BasePolicy
from fairagents.request import Request

__all__ = ["FCFS"]


class FCFS(BasePolicy):
    """Runs requests of a model in order of their arrival time, whoever sent them.

    Ordering is by ``Request.arrival`` (ties by order of ``on_arrival``), so a request
    whose preprocessing finished late keeps its place.

    Args:
        cost: how service is counted; FCFS does not use it to order, only to
            reject requests for models it cannot price. Defaults to raw tokens.

    Examples:
        >>> import fairagents as fa
        >>> policy = fa.policies.FCFS()
        >>> who = fa.Agent("a", fa.App("x"))
        >>> late = fa.Request(id="late", agent=who, model="chat", prompt_tokens=1, max_tokens=1, arrival=2.0)
        >>> early = fa.Request(id="early", agent=who, model="chat", prompt_tokens=1, max_tokens=1, arrival=1.0)
        >>> policy.on_arrival(late, now=2.0); policy.on_arrival(early, now=2.0)
        >>> policy.select("chat", now=2.0).id
        'early'
    """

    name: ClassVar[str] = "fcfs"

    def __init__(self, cost: CostModel | None = None) -> None:
        super().__init__(cost if cost is not None else RawTokenCost())
        self._heaps: dict[str, list[tuple[float, int, Request]]] = {}
        self._gone: dict[str, set[str]] = {}  # per model: ids left the queue but still in its heap (lazy removal)
        self._seq = 0

    def select(self, model: str, now: float) -> Request | None:
        heap = self._heaps.get(model)
        if not heap:
            return None
        gone = self._gone.get(model)
        while heap and gone and heap[0][2].id in gone:
            gone.discard(heapq.heappop(heap)[2].id)
        return heap[0][2] if heap else None

    def _enqueue(self, req: Request, now: float) -> None:
        self._seq += 1
        heapq.heappush(self._heaps.setdefault(req.model, []), (req.arrival, self._seq, req))

    def _dequeue(self, req: Request, now: float, dispatched: bool) -> None:
        heap = self._heaps[req.model]
        if heap[0][2] is req:
            heapq.heappop(heap)
        else:
            self._gone.setdefault(req.model, set()).add(req.id)
