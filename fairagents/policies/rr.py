"""Round robin over apps: each app with waiting requests takes one dispatch in turn.

ExFairS's baseline. It shares dispatches, not service: an app of long requests
gets as many turns as an app of short ones, and so more of the model.
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar

from fairagents.cost import CostModel, RawTokenCost
from fairagents.policies._structures import Fifo
from fairagents.policies.base import BasePolicy
from fairagents.request import Request

__all__ = ["RoundRobin"]


class RoundRobin(BasePolicy):
    """Takes turns between apps, per model; first come, first served inside an app.

    Args:
        cost: used only to reject requests for models it cannot price; defaults
            to raw tokens.

    Examples:
        >>> import fairagents as fa
        >>> policy = fa.policies.RoundRobin()
        >>> a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
        >>> reqs = [fa.Request(id=i, agent=w, model="m", prompt_tokens=1, max_tokens=1, arrival=0.0)
        ...         for i, w in [("a1", a), ("a2", a), ("b1", b)]]
        >>> for r in reqs: policy.on_arrival(r, now=0.0)
        >>> order = []
        >>> while (r := policy.select("m", now=0.0)) is not None:
        ...     policy.on_dispatch(r, now=0.0); order.append(r.id)
        >>> order
        ['a1', 'b1', 'a2']
    """

    name: ClassVar[str] = "rr"

    def __init__(self, cost: CostModel | None = None) -> None:
        super().__init__(cost if cost is not None else RawTokenCost())
        self._turns: dict[str, deque[str]] = {}  # model -> apps in turn order
        self._in_turns: dict[str, set[str]] = {}
        self._queues: dict[tuple[str, str], Fifo] = {}  # (app, model) -> requests
        self._waiting_for: dict[tuple[str, str], int] = {}
        self._last_turn: dict[str, int] = {}  # app -> number of its latest dispatch, pool-wide
        self._dispatches = 0

    def select(self, model: str, now: float) -> Request | None:
        turns = self._turns.get(model)
        while turns:
            app = turns[0]
            if self._waiting_for.get((app, model)):
                return self._queues[(app, model)].head()
            turns.popleft()  # the app's queue emptied out of turn (cancellations)
            self._in_turns[model].discard(app)
        return None

    def _rank(self, req: Request) -> tuple[int, float]:
        # Across models: the app whose last turn is oldest goes first.
        return self._last_turn.get(req.app, -1), req.arrival

    def _enqueue(self, req: Request, now: float) -> None:
        key = (req.app, req.model)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = Fifo()
        queue.push(req)
        self._waiting_for[key] = self._waiting_for.get(key, 0) + 1
        in_turns = self._in_turns.setdefault(req.model, set())
        if req.app not in in_turns:
            in_turns.add(req.app)
            self._turns.setdefault(req.model, deque()).append(req.app)

    def _dequeue(self, req: Request, now: float, dispatched: bool) -> None:
        key = (req.app, req.model)
        self._queues[key].remove(req)
        self._waiting_for[key] -= 1
        turns = self._turns[req.model]
        if dispatched:
            self._dispatches += 1
            self._last_turn[req.app] = self._dispatches
        if dispatched and turns and turns[0] == req.app:
            # A dispatch ends the app's turn: to the back of the line, or out of it.
            turns.popleft()
            if self._waiting_for[key]:
                turns.append(req.app)
            else:
                self._in_turns[req.model].discard(req.app)
