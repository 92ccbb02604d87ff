"""Virtual Token Counter (Sheng et al., OSDI'24): flat fair sharing over clients.

One counter per client, charged ``w_input`` per prompt token at dispatch and
``w_output`` per generated token as it streams, divided by the client's weight; the
client with the lowest counter among those waiting for a model goes next, and a
client that becomes active is lifted to the lowest active counter (no banked credit).
No hierarchy, and raw tokens by default: a token is a token on every model.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from fairagents.cost import CostModel, RawTokenCost
from fairagents.errors import InvalidParameterError
from fairagents.identity import Agent
from fairagents.policies._structures import CounterLevel, Fifo
from fairagents.policies.base import BasePolicy
from fairagents.request import Request

__all__ = ["VTC"]


class VTC(BasePolicy):
    """Flat VTC with counter lift; a client is an app (default) or an agent.

    Args:
        cost: how tokens are charged; raw tokens with VTC's 1:2 input:output
            weights by default. Pass a :class:`~fairagents.UnifiedTokenCost` for
            "VTC on unified tokens".
        client: ``"app"`` (weighted by the app's weight) or ``"agent"`` (every
            agent of every app is its own client, weighted by the agent's weight).

    Examples:
        >>> import fairagents as fa
        >>> policy = fa.policies.VTC()
        >>> a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
        >>> for i, who in [("a1", a), ("a2", a), ("b1", b)]:
        ...     policy.on_arrival(fa.Request(id=i, agent=who, model="m", prompt_tokens=10,
        ...                                  max_tokens=4, arrival=0.0), now=0.0)
        >>> first = policy.select("m", now=0.0); policy.on_dispatch(first, now=0.0)
        >>> first.id, policy.select("m", now=0.0).id   # a paid 10 tokens, so b is next
        ('a1', 'b1')
        >>> policy.counters()
        {'a': 10.0, 'b': 0.0}
    """

    name: ClassVar[str] = "vtc"
    orders_by_service: ClassVar[bool] = True
    charges_by_client: ClassVar[bool] = True

    def __init__(self, cost: CostModel | None = None, *, client: Literal["app", "agent"] = "app") -> None:
        if client not in ("app", "agent"):
            raise InvalidParameterError(f"VTC client must be 'app' or 'agent', got {client!r}")
        super().__init__(cost if cost is not None else RawTokenCost())
        self.client = client
        self._level: CounterLevel[object] = CounterLevel()
        self._queues: dict[tuple[object, str], Fifo] = {}

    def counters(self) -> dict[object, float]:
        """Current virtual counter of each client seen so far (service / weight)."""
        return dict(self._level.counter)

    def lead(self, head: Agent, other: Agent) -> float | None:
        """How far ``other``'s client is served beyond ``head``'s (by their counters, at ``head``'s weight)."""
        mine, theirs = self._client_of(head), self._client_of(other)
        counter = self._level.counter
        if mine[0] == theirs[0] or mine[0] not in counter or theirs[0] not in counter:
            return None
        return (counter[theirs[0]] - counter[mine[0]]) * mine[1]

    def _client_of(self, agent: Agent) -> tuple[object, float]:
        return (agent.app.name, agent.app.weight) if self.client == "app" else (agent.key, agent.weight)

    def select(self, model: str, now: float) -> Request | None:
        client = self._level.lowest(model)
        if client is None:
            return None
        return self._queues[(client, model)].head()

    def _rank(self, req: Request) -> tuple[float, float]:
        return self._level.counter[self._client(req)[0]], req.arrival

    def _client(self, req: Request) -> tuple[object, float]:
        if self.client == "app":
            return req.agent.app.name, req.agent.app.weight
        return req.agent.key, req.agent.weight

    def _enqueue(self, req: Request, now: float) -> None:
        client, weight = self._client(req)
        key = (client, req.model)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = Fifo()
        queue.push(req)
        self._level.enqueue(client, weight, req.model)

    def _dequeue(self, req: Request, now: float, dispatched: bool) -> None:
        client, _ = self._client(req)
        self._queues[(client, req.model)].remove(req)
        self._level.dequeue(client, req.model)

    def _charge(self, req: Request, amount: float, now: float) -> None:
        # CounterLevel.charge inlined, on the client of _client: this runs for every streamed chunk.
        client = req.agent.app.name if self.client == "app" else req.agent.key
        level = self._level
        level.counter[client] += amount * level.inverse_weight[client]
