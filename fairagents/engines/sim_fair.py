"""The simulated engine's in-engine fair scheduler (``SimEngine(scheduler="fair")``). It is a simulator.

It models :class:`~fairagents.vllm.scheduler.FairScheduler`, the default serving path's
scheduler, step by step: at each step boundary the engine holds its head back while a
client owed more waits on another engine of its device
(:meth:`~fairagents.policies.pooled.PoolPolicy.holds`), preempts at most one running
request for a waiting client the policy owes (by the rules of
:meth:`~fairagents.vllm.scheduler.FairScheduler.fair_victim`), fills the batch in the
policy's order, and, with paged KV, preempts the most served client's request when the
cache overflows (vLLM's priority path, ranked by the policy's counters).
:class:`~fairagents.engines.SimEngine` mixes it in; its state lives there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from fairagents.errors import ProtocolError
from fairagents.request import Request

if TYPE_CHECKING:
    from fairagents.policies.pooled import PoolPolicy

__all__ = ["MAX_FAIR_PREEMPTIONS", "FairSteps"]

#: With ``scheduler="fair"``: the most times one request is preempted for fairness (as the real engine's).
MAX_FAIR_PREEMPTIONS = 2


class _State(Protocol):
    """What the scheduler reads of a request in the engine (:class:`fairagents.engines.sim.SimState`)."""

    request: Request
    generated: int


class FairSteps:
    """The step boundary of a ``scheduler="fair"`` :class:`~fairagents.engines.SimEngine` (see the module docs)."""

    # SimEngine's state, read and written here
    _seat: PoolPolicy | None
    _model: str
    _held: dict[str, _State]
    _running: dict[str, _State]
    _joined: dict[str, _State]
    _resumed: set[str]
    _fair_preempted: dict[str, int]
    _kv_used: int
    _paged: bool
    max_running: int
    kv_capacity: int
    preempt: bool
    preemptions: int
    fair_preemptions: int
    held_by_device: bool
    _holds: Callable[[_State], int]  # KV tokens a running request holds
    _room: Callable[[int], bool]  # paged: whether a request holding that many tokens can join now

    def _schedule_fairly(self) -> None:
        """A step boundary: hold for the device, preempt at most one for fairness, fill in the policy's order."""
        seat, model = self._seat, self._model
        assert seat is not None
        self.held_by_device = False
        head = self._head()
        if head is not None and len(seat.models) > 1:
            self.held_by_device = seat.holds(model, head.request.agent)
        if head is not None and not self.held_by_device:
            if self.preempt and self._running and seat.orders_by_service:
                victim = self._fair_victim(head)
                if victim is not None:
                    self._fair_preempted[victim.request.id] = self._fair_preempted.get(victim.request.id, 0) + 1
                    self.fair_preemptions += 1
                    seat.tally(model).fair_preemptions += 1
                    self._requeue(victim)
            while (head := self._head()) is not None and self._fits(head):
                del self._held[head.request.id]
                self._join(head)
                seat.engine_take(model, head.request.id)
                seat.engine_admit(model, head.request.id)
        while self._paged and len(self._running) > 1 and self._kv_used + len(self._running) > self.kv_capacity:
            # vLLM's victim: the most served client's; among equals, the last to join
            self._requeue(max(enumerate(self._running.values()), key=self._rank)[1])

    def _head(self) -> _State | None:
        """The policy's choice among this engine's waiting requests."""
        if not self._held:
            return None
        twin = self._seat.engine_select(self._model)  # type: ignore[union-attr]
        if twin is None or twin.id not in self._held:
            raise ProtocolError(
                f"the policy chose {twin and twin.id!r}, not a request waiting in model {self._model!r}")
        return self._held[twin.id]

    def _need(self, state: _State) -> int:
        """KV tokens ``state`` takes on joining: its prompt and output so far (paged), or its whole reservation."""
        req = state.request
        return req.prompt_tokens + (state.generated if self._paged else req.max_tokens)

    def _fits(self, state: _State) -> bool:
        if self._paged:
            return self._room(self._need(state))
        return len(self._running) < self.max_running and self._kv_used + self._need(state) <= self.kv_capacity

    def _lacking(self, state: _State) -> int:
        """KV tokens the batch lacks for ``state``."""
        growth = len(self._running) + 1 if self._paged else 0  # each running request's next token, and its first
        return max(self._kv_used + growth + self._need(state) - self.kv_capacity, 0)

    def _join(self, state: _State) -> None:
        self._running[state.request.id] = self._joined[state.request.id] = state
        self._kv_used += self._need(state)

    def _rank(self, entry: tuple[int, _State]) -> tuple[float, ...]:
        """vLLM's preemption rank of the ``(join order, state)`` of a running request: the highest goes first.

        The most served client's (the policy's counters); then one not prefilled yet; then the latest.
        """
        order, state = entry
        req = state.request
        return (*self._seat.served(req.agent), req.id in self._joined, req.arrival, order)  # type: ignore[union-attr]

    def _requeue(self, state: _State) -> None:
        """Preempt ``state``: it gives back its KV and waits again in the policy, its prompt not charged again."""
        rid = state.request.id
        del self._running[rid]
        self._joined.pop(rid, None)
        self._kv_used -= self._holds(state)
        tally = self._seat.tally(self._model)  # type: ignore[union-attr]
        tally.preemptions += 1
        tally.recomputed += state.request.prompt_tokens + state.generated
        self._seat.engine_arrive(state.request, requeued=True)  # type: ignore[union-attr]
        self._held[rid] = state
        self._resumed.add(rid)
        self.preemptions += 1

    def _fair_victim(self, head: _State) -> _State | None:
        """The running request to preempt for ``head``, by the rules of the real engine's ``fair_victim``."""
        full, lacking = len(self._running) >= self.max_running, self._lacking(head)
        if not full and not lacking:
            return None
        seat, model, req = self._seat, self._model, head.request
        assert seat is not None
        charge = seat.input_price(model, req.prompt_tokens)
        resuming = req.id in self._resumed
        running = list(self._running.values())
        best: tuple[tuple[float, int], _State] | None = None
        for state, lead in zip(running, seat.leads(req.agent, [s.request.agent for s in running]), strict=True):
            if lead is None or lead <= charge:
                continue
            computed = state.request.prompt_tokens + state.generated
            key = (lead, -computed)
            if best is not None and key <= best[0]:
                continue
            if self._fair_preempted.get(state.request.id, 0) >= MAX_FAIR_PREEMPTIONS:
                continue
            if resuming and lead <= seat.input_price(model, computed):
                continue
            if lacking and self._holds(state) < lacking:
                continue
            best = (key, state)
        return None if best is None else best[1]
