"""The fair scheduler's waiting queue, in the pool's policy's order, and what binds it to a pool.

:class:`FairQueue` replaces vLLM's waiting queue in :class:`~fairagents.vllm.scheduler.FairScheduler`;
:class:`Binding` says which pool's policy (its :class:`~fairagents.policies.pooled.PoolPolicy`)
and which model name there the queue and its scheduler follow. Importing this module checks
the vLLM release first (:func:`check_vllm_version`): both override vLLM's scheduler internals.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping

import vllm

from fairagents._logging import get_logger
from fairagents.policies.pooled import PoolPolicy
from fairagents.request import Outcome
from fairagents.request import Request as FairRequest

#: The vLLM releases (major.minor) whose scheduler internals this module overrides and reads, as
#: the guide "Fair vLLM without the SDK" lists them; another release may differ in any of them.
SUPPORTED_VLLM = ("0.32",)


def check_vllm_version(version: str) -> None:
    """Raise an ``ImportError`` naming the supported range if ``version`` of vLLM is not in it.

    Examples:
        >>> from fairagents.vllm.queue import check_vllm_version
        >>> check_vllm_version("0.32.1")
        >>> check_vllm_version("0.11.0")
        Traceback (most recent call last):
        ...
        ImportError: fairagents.vllm.FairScheduler needs vLLM 0.32.x (it overrides vLLM's scheduler internals); found 0.11.0: install vllm>=0.32,<0.33, or serve with scheduler="vllm"
    """
    if ".".join(version.split(".")[:2]) not in SUPPORTED_VLLM:
        supported = ", ".join(f"{v}.x" for v in SUPPORTED_VLLM)
        raise ImportError(f"fairagents.vllm.FairScheduler needs vLLM {supported} (it overrides vLLM's scheduler "
                          f'internals); found {version}: install vllm>=0.32,<0.33, or serve with scheduler="vllm"')


check_vllm_version(vllm.__version__)

from vllm.v1.core.sched.request_queue import RequestQueue  # noqa: E402
from vllm.v1.request import Request as VllmRequest  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

__all__ = ["SUPPORTED_VLLM", "Binding", "BoundToPool", "FairQueue", "check_vllm_version", "outcome_of"]

log = get_logger("fairagents.vllm.scheduler")


class Binding:
    """Which pool's policy an engine's scheduler follows, and its model's name there.

    An in-process engine keeps one across restarts and hands it to each scheduler it
    builds; an idle engine added to another arbiter is re-bound to that arbiter's policy.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.policies.pooled import PoolPolicy
        >>> from fairagents.vllm.queue import Binding
        >>> Binding(PoolPolicy(fa.policies.make_policy("fcfs")), "chat").seat.policy.name
        'fcfs'
    """

    def __init__(self, seat: PoolPolicy, model: str, max_running: int | None = None) -> None:
        self._state = (seat, model, max_running)

    def rebind(self, seat: PoolPolicy, model: str, max_running: int | None = None) -> None:
        """Follow another pool's policy, as ``model``: one assignment, so a reader never sees half of it."""
        self._state = (seat, model, max_running)

    @property
    def seat(self) -> PoolPolicy:
        """The pool's policy."""
        return self._state[0]

    @property
    def model(self) -> str:
        """This engine's model name in the pool."""
        return self._state[1]

    @property
    def max_running(self) -> int | None:
        """Most requests the engine runs at once, below ``max_num_seqs`` (an arbiter's in-flight limit); ``None``: no cap."""
        return self._state[2]


class BoundToPool:
    """Reads the pool's policy and the model's name from its :class:`Binding` at each use (a re-bind takes effect at once)."""

    binding: Binding

    @property
    def seat(self) -> PoolPolicy:
        """The pool's policy."""
        return self.binding.seat

    @property
    def model(self) -> str:
        """This engine's model name in the pool."""
        return self.binding.model


class FairQueue(BoundToPool, RequestQueue):
    """vLLM's waiting queue, in the order of the pool's policy (see the module docs).

    The requests it holds wait in the policy too. The one popped for the batch leaves
    the policy's queue, uncharged; its prompt is charged once the step runs it
    (:meth:`admit_scheduled`). One vLLM puts back unscheduled (a grammar still
    compiling, no LoRA slot) keeps its turn, ahead of the policy's next choice, still
    uncharged; one preempted starts over as a new arrival, its prompt not charged again.

    Args:
        binding: the pool's policy (shared with the arbiter and the pool's other
            engines) and this engine's model name there.
        twin_of: the policy's request for a vLLM request.
    """

    def __init__(self, binding: Binding, twin_of: Callable[[VllmRequest], FairRequest]) -> None:
        self.binding = binding
        self._twin_of = twin_of
        self._held: dict[str, VllmRequest] = {}
        self._chosen: deque[VllmRequest] = deque()  # dispatched by the policy, put back by vLLM
        self._popped: set[str] = set()  # popped during this step: put back, they were skipped, not preempted
        self._peeked: str | None = None
        self.held_by_device = False
        """Set for a step whose head waits for its device (:meth:`~fairagents.policies.pooled.PoolPolicy.holds`):
        the queue then shows vLLM nothing to admit."""
        binding.seat.forget(binding.model)  # an engine started again: its last queue's requests are gone with it

    def new_step(self) -> None:
        """A scheduling step begins: what vLLM puts back from now on was popped in it (skipped) or before (preempted)."""
        self._popped.clear()

    def add_request(self, request: VllmRequest) -> None:
        rid = request.request_id
        preempted = self.seat.engine_running(self.model, rid)  # it ran: put back, it was preempted or skipped
        if preempted and rid in self._popped:
            self._chosen.append(request)  # popped this step and not scheduled: it keeps its turn
            return
        try:
            self.seat.engine_arrive(self._twin_of(request), requeued=preempted)
        except Exception as err:  # a policy's bug must not take the engine down: serve it, uncharged
            log.error("fairagents.vllm.policy_refused", request_id=rid, error=repr(err))
            self._chosen.append(request)
            return
        self._held[rid] = request

    def peek_request(self) -> VllmRequest:
        if self._chosen:
            self._peeked = self._chosen[0].request_id
            return self._chosen[0]
        seat = self.seat
        with seat.lock:
            while (twin := seat.engine_select(self.model)) is not None and twin.id not in self._held:
                seat.discard(twin)  # not this queue's (cannot happen): never serve it
            if twin is None and self._held:  # held, yet unknown to the policy: the engine was re-bound to another
                self._adopt()
                twin = seat.engine_select(self.model)
        if twin is None or twin.id not in self._held:
            if not self._held:
                self._peeked = None
                raise IndexError("peek from an empty queue")
            twin_id = min(self._held.values(), key=lambda r: r.arrival_time).request_id  # the policy refused them all
            self._peeked = twin_id
            return self._held[twin_id]
        self._peeked = twin.id
        return self._held[twin.id]

    def _adopt(self) -> None:
        """Tell the policy (a new one, after a re-bind) about the requests this queue holds."""
        for request in self._held.values():
            try:
                self.seat.engine_arrive(self._twin_of(request))
            except Exception as err:  # served in arrival order, uncharged, rather than lost
                log.error("fairagents.vllm.policy_refused", request_id=request.request_id, error=repr(err))

    def pop_request(self) -> VllmRequest:
        """Take the request :meth:`peek_request` showed (vLLM allocates for it between the two)."""
        if self._peeked is None:
            self.peek_request()
        rid, self._peeked = self._peeked, None
        self._popped.add(rid)  # type: ignore[arg-type]
        if self._chosen and self._chosen[0].request_id == rid:
            return self._chosen.popleft()
        request = self._held.pop(rid)  # type: ignore[arg-type]
        self.seat.engine_take(self.model, rid)  # type: ignore[arg-type]
        return request

    def admit_scheduled(self, scheduled: Callable[[str], bool], cached: Mapping[str, int] | None = None) -> set[str]:
        """The step is scheduled: charge the prompts of the requests popped in it that it ran.

        vLLM pops a request both to run it and to skip it (then puts it back, here
        uncharged, keeping its turn); only one that ``scheduled`` says the step took
        into its batch is charged, once. ``cached``: the prompt tokens each new request
        found in the prefix cache, charged at the cost model's ``w_cached``. Returns the
        ids popped in the step.
        """
        put_back = {r.request_id for r in self._chosen}
        hits = cached or {}
        for rid in self._popped:
            if rid not in put_back and scheduled(rid):
                self.seat.engine_admit(self.model, rid, hits.get(rid, 0))
        return set(self._popped)

    def prepend_request(self, request: VllmRequest) -> None:
        self.add_request(request)  # the order is the policy's, not the position

    def prepend_requests(self, requests: Iterable[VllmRequest]) -> None:
        for request in requests:
            self.add_request(request)

    def remove_request(self, request: VllmRequest) -> None:
        rid = request.request_id
        if self._peeked == rid:
            self._peeked = None
        self._popped.discard(rid)
        if self._held.pop(rid, None) is None:
            with contextlib.suppress(ValueError):
                self._chosen.remove(request)
        self.seat.engine_end(self.model, rid, outcome_of(request))

    def remove_requests(self, requests: Iterable[VllmRequest]) -> None:
        for request in requests:
            self.remove_request(request)

    def __bool__(self) -> bool:
        return not self.held_by_device and (bool(self._held) or bool(self._chosen))

    def __len__(self) -> int:
        return len(self._held) + len(self._chosen)

    def __iter__(self) -> Iterator[VllmRequest]:
        return iter([*self._chosen, *sorted(self._held.values(), key=lambda r: r.arrival_time)])


def outcome_of(request: VllmRequest) -> Outcome:
    """How a vLLM request ended, for the policy (an unfinished one removed from the queue: cancelled)."""
    status = request.status
    if status == RequestStatus.FINISHED_ABORTED or not request.is_finished():
        return Outcome.CANCELLED
    if status == RequestStatus.FINISHED_ERROR:
        return Outcome.FAILED
    return Outcome.FINISHED
