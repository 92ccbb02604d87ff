"""Data structures the policies share: FIFO queues and virtual counters with lift.

Everything here keeps a scheduling decision at O(log n) in the number of clients.
The key trick: virtual counters never decrease (charges are ≥ 0 and the lift is a
``max``), so a heap entry's stored counter is a lower bound on the client's current
counter. A charge therefore only writes a dict; the heap re-keys a client lazily,
when it reaches the top with a stale key.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from fairagents.errors import ProtocolError
from fairagents.request import Request

K = TypeVar("K", bound=Hashable)


class Fifo:
    """Requests in arrival order, with O(1) removal from anywhere (lazily, by id)."""

    __slots__ = ("_gone", "_queue")

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()
        self._gone: set[str] = set()

    def push(self, req: Request) -> None:
        self._queue.append(req)

    def head(self) -> Request | None:
        queue, gone = self._queue, self._gone
        while queue and gone and queue[0].id in gone:
            gone.discard(queue.popleft().id)
        return queue[0] if queue else None

    def remove(self, req: Request) -> None:
        if self._queue and self._queue[0] is req:
            self._queue.popleft()
        else:
            self._gone.add(req.id)


class LazyMinHeap(Generic[K]):
    """The members of a set, ordered by a score that only grows.

    Scores live in a dict shared with the owner (``scores``); the heap never needs
    telling when one grows. Ties go to the member re-keyed least recently, which
    makes equal counters take turns.
    """

    __slots__ = ("_heap", "_member", "_scores", "_seq")

    def __init__(self, scores: dict[K, float]) -> None:
        self._scores = scores
        self._heap: list[tuple[float, int, K]] = []
        self._member: dict[K, int] = {}  # member -> seq of its one live heap entry
        self._seq = 0

    def __len__(self) -> int:
        return len(self._member)

    def __contains__(self, member: object) -> bool:
        return member in self._member

    def add(self, member: K) -> None:
        self._seq += 1
        self._member[member] = self._seq
        heapq.heappush(self._heap, (self._scores[member], self._seq, member))
        if len(self._heap) > 2 * len(self._member) + 64:
            self._compact()

    def discard(self, member: K) -> None:
        self._member.pop(member, None)

    def min(self) -> K | None:
        """The member of least score (ties: re-keyed least recently), or ``None`` if there is none.

        Each member is re-keyed at most once per call, so the loop ends on any scores
        (a NaN, which equals nothing, included): every pass pops an entry or re-keys a
        member whose entry predates the call.
        """
        heap, members, scores = self._heap, self._member, self._scores
        fresh = self._seq  # entries with a later seq were re-keyed by this call: their score is current
        while heap:
            score, seq, member = heap[0]
            if members.get(member) != seq:  # discarded, or re-added since
                heapq.heappop(heap)
                continue
            if seq <= fresh:
                current = scores[member]
                if current != score:  # its counter grew: re-key it and look again
                    self._seq += 1
                    members[member] = self._seq
                    heapq.heapreplace(heap, (current, self._seq, member))
                    continue
            return member
        return None

    def _compact(self) -> None:
        live = [(self._scores[m], seq, m) for m, seq in self._member.items()]
        heapq.heapify(live)
        self._heap = live


def _inverse(weight: float) -> float:
    """``1 / weight``, for a weight that keeps it finite (weights are checked where they are given)."""
    inverse = 1.0 / weight
    if not 0.0 < inverse < math.inf:
        raise ProtocolError(f"a weight is a finite number > 0 whose inverse is finite, got {weight!r}")
    return inverse


class _ForModel(Generic[K]):
    """The clients of a level waiting for one model, and how many requests each has waiting."""

    __slots__ = ("heap", "waiting")

    def __init__(self, scores: dict[K, float]) -> None:
        self.heap: LazyMinHeap[K] = LazyMinHeap(scores)
        self.waiting: dict[K, int] = {}


class CounterLevel(Generic[K]):
    """Virtual counters of one level of clients, with VTC's counter lift and a bounded idle credit.

    A client is *active* while it has waiting requests. When it becomes active its
    counter is lifted to ``max(own, min over active clients)``, or, if no client is
    active, to ``max(own, counter of the client that left last)``: an idle client
    cannot bank credit. Counters grow by ``charge / weight``.

    A client its driver reported at :meth:`rest` (nothing waiting or running) is lifted,
    when it comes back, only to ``max(own, floor − credit / weight)``: an app that asked
    for less than its share while away keeps up to ``credit`` of its lag, so its next
    burst runs ahead of the backlogged ones that far. With ``credit = 0`` (the default)
    this is the lift above.
    """

    __slots__ = ("_active", "_last_left", "_models", "_rested", "_waiting", "counter", "credit", "floor",
                 "inverse_weight")

    def __init__(self) -> None:
        self.counter: dict[K, float] = {}
        #: Where the lift's floor comes from when clients are active elsewhere too (arbiters sharing
        #: counters): called with ``(lowest active counter here, counter of the last to leave here)``,
        #: either ``None`` when there is none; ``None``: from this level alone.
        self.floor: Callable[[float | None, float | None], float] | None = None
        self.inverse_weight: dict[K, float] = {}  # 1 / weight: charges multiply on the hot path
        #: Most service (in the cost's units) a client back from rest may reclaim of what it missed.
        self.credit = 0.0
        self._rested: set[K] = set()  # clients at rest: nothing waiting or running
        self._waiting: dict[K, int] = {}
        self._active: LazyMinHeap[K] = LazyMinHeap(self.counter)
        self._models: dict[str, _ForModel[K]] = {}
        self._last_left: K | None = None

    def enqueue(self, client: K, weight: float, model: str) -> None:
        self.inverse_weight[client] = _inverse(weight)
        waiting = self._waiting.get(client, 0)
        if waiting == 0:
            own, floor = self.counter.get(client, 0.0), self._floor()
            if client in self._rested:  # back from rest: it keeps up to the credit of its lag
                self._rested.discard(client)
                floor -= self.credit * self.inverse_weight[client]
            self.counter[client] = max(own, floor)
            self._active.add(client)
        self._waiting[client] = waiting + 1
        for_model = self._models.get(model)
        if for_model is None:
            for_model = self._models[model] = _ForModel(self.counter)
        n = for_model.waiting.get(client, 0)
        if n == 0:
            for_model.heap.add(client)
        for_model.waiting[client] = n + 1

    def dequeue(self, client: K, model: str) -> None:
        for_model = self._models[model]
        n = for_model.waiting[client] - 1
        if n:
            for_model.waiting[client] = n
        else:
            del for_model.waiting[client]
            for_model.heap.discard(client)
        waiting = self._waiting[client] - 1
        if waiting:
            self._waiting[client] = waiting
        else:
            del self._waiting[client]
            self._active.discard(client)
            self._last_left = client

    def rest(self, client: K) -> None:
        """``client`` has nothing waiting or running now: its idle time may earn it :attr:`credit`."""
        if client in self.counter:
            self._rested.add(client)

    def touch(self, client: K, weight: float) -> None:
        """Know ``client`` (its weight), starting it at the floor if it is new."""
        self.inverse_weight[client] = _inverse(weight)
        if client not in self.counter:
            self.counter[client] = self._floor()

    def charge(self, client: K, amount: float) -> None:
        self.counter[client] += amount * self.inverse_weight[client]

    def lowest(self, model: str) -> K | None:
        for_model = self._models.get(model)
        return for_model.heap.min() if for_model is not None else None

    def _floor(self) -> float:
        lowest = self._active.min()
        if self.floor is not None:
            return self.floor(None if lowest is None else self.counter[lowest],
                              None if self._last_left is None else self.counter[self._last_left])
        if lowest is not None:
            return self.counter[lowest]
        if self._last_left is not None:
            return self.counter[self._last_left]
        return 0.0

    def set(self, client: K, value: float) -> None:
        """Set a known client's counter; one that falls is re-keyed in every heap it is in.

        Counters only grow in a policy's own run; an outside correction (shared counters
        rebased after an outage) may lower one, and the heaps' lazy keys would then no
        longer be lower bounds: re-adding the client gives it a fresh entry (its old one
        is dropped when it surfaces).
        """
        old = self.counter.get(client)
        if old is None or value == old:
            return
        if not math.isfinite(value):
            raise ProtocolError(f"a counter is a finite number, got {value!r} for {client!r}")
        self.counter[client] = value
        if value < old:
            if client in self._active:
                self._active.add(client)
            for for_model in self._models.values():
                if client in for_model.heap:
                    for_model.heap.add(client)

    def waiting_for(self, model: str) -> dict[K, int]:
        """The clients waiting for ``model``, with how many requests each has waiting (a view)."""
        for_model = self._models.get(model)
        return for_model.waiting if for_model is not None else {}

    def waiting_models(self) -> list[str]:
        """The models some client of this level waits for."""
        return [m for m, f in self._models.items() if f.waiting]
