"""A fairagents policy inside vLLM's engine loop: a v1 scheduler that orders, charges and preempts by it.

fairagents' arbiter schedules in front of the models it dispatches; this module
schedules inside a vLLM engine, by the same policy object (:class:`~fairagents.policies.pooled.PoolPolicy`).
:class:`FairScheduler` subclasses vLLM's ``AsyncScheduler`` (with async scheduling
off it updates requests as vLLM's plain ``Scheduler`` does), for
``EngineArgs(scheduler_cls=...)`` or ``vllm serve --scheduler-cls fairagents.vllm.FairScheduler``:

- **The policy**: in-process engines take their arbiter's (any name of
  :func:`~fairagents.policies.make_policy`, or your own); served on its own the
  scheduler makes the one :data:`POLICY_ENV` names (``hmfs_credit`` by default).
- **Identity**: the arbiter's own request when it handed it over; else
  ``fairagents_app``, ``fairagents_agent`` and ``fairagents_run`` in the request's
  ``SamplingParams.extra_args`` (``vllm_xargs`` over HTTP); app ``default`` without them.
- **Weights**: from the file named by :data:`~fairagents.vllm.args.CONFIG_ENV` (:class:`~fairagents.vllm.args.Weights`) when set,
  the request's own weight arguments then ignored; else from ``fairagents_app_weight`` /
  ``fairagents_agent_weight`` (default 1), checked by
  :class:`~fairagents.vllm.args.FairArgsValidator`.
- **The waiting queue** (:class:`~fairagents.vllm.queue.FairQueue`) is the policy's: ``select`` picks, a
  request taken into the batch leaves it (its prompt charged once a step runs it), output
  is charged as each step returns it, and a preempted request is never charged its prompt again.
- **Preemption**: when the batch is full, a waiting client the policy has served less
  than a running one, by more than its own prompt's charge (a request resuming after a
  preemption: also more than what preempting would throw away), preempts that client's request (:meth:`FairScheduler.fair_victim`), at
  most one per step and at most :attr:`~FairScheduler.max_fair_preemptions` times per
  request; a tool call or structured output whose grammar has compiled counts as
  ready. On a step that could run out of KV blocks, vLLM's own victim is the most
  served client's request (vLLM's priority path, ``running`` left in its order). Both
  follow how the policy ranks clients by service
  (:attr:`~fairagents.policies.BasePolicy.orders_by_service`: ``hmfs``, ``hmfs_runs``,
  ``vtc``, ``wfq``); under the others vLLM preempts in its own order.
- **Charging at admission**: a request's prompt is charged when a step runs it, not
  when vLLM pops it (it may put it back unscheduled: a grammar compiling), so a request
  aborted or failed before it ran costs its client nothing; the prompt tokens it found in
  the prefix cache are charged at the cost model's ``w_cached``, not as computed.
- **Metrics** join vLLM's ``/metrics`` (:mod:`fairagents.vllm.metrics`).

The guide "Fair vLLM without the SDK" explains each, and what it costs.

Examples:
    >>> from fairagents.vllm.scheduler import identity
    >>> identity({"fairagents_app": "search", "fairagents_agent": "planner"}).app.name
    'search'
    >>> identity(None).name, identity(None).app.name
    ('default', 'default')
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, ClassVar

from fairagents._logging import get_logger
from fairagents.cost import ModelProfile, UnifiedTokenCost, service_bound
from fairagents.identity import Agent, Modality
from fairagents.policies import DEFAULT_POLICY, make_policy
from fairagents.policies.pooled import PoolPolicy
from fairagents.request import Outcome
from fairagents.request import Request as FairRequest
from fairagents.vllm.args import CONFIG_ENV, FairArgsValidator, Weights, identity, run_of
from fairagents.vllm.queue import Binding, BoundToPool, FairQueue, outcome_of

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402  (after queue's check of the release)
from vllm.v1.core.sched.request_queue import SchedulingPolicy  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.request import Request as VllmRequest  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from fairagents.vllm.metrics import SchedulerMetrics  # noqa: E402

__all__ = ["POLICY_ENV", "FairScheduler", "own_policy"]

log = get_logger(__name__)

#: Environment variable naming the policy of a :class:`FairScheduler` served on its own (default ``hmfs_credit``).
POLICY_ENV = "FAIRAGENTS_SCHEDULER_POLICY"


class FairScheduler(BoundToPool, AsyncScheduler):
    """vLLM's async scheduler, ordering, charging and preempting by a fairagents policy (see the module docs).

    Constructed by vLLM (``EngineArgs(scheduler_cls=...)``); it reads the model's
    hidden size and depth from its config for unified tokens. Served on its own it
    makes its own policy (:data:`POLICY_ENV`, ``hmfs_credit`` by default); built from
    :meth:`sharing` it takes a pool's (in-process engines of an arbiter).

    Examples:
        >>> from vllm.engine.arg_utils import EngineArgs
        >>> from fairagents.vllm import FairScheduler
        >>> EngineArgs(model="some/model", scheduler_cls=FairScheduler).scheduler_cls is FairScheduler
        True
    """

    shared: ClassVar[Binding | None] = None
    """The pool's policy and model name bound by :meth:`sharing` (``None``: this scheduler makes its own)."""
    preempt: ClassVar[bool] = True
    """Whether a waiting client owed service may preempt a more-served client's request (:meth:`fair_victim`)."""
    max_fair_preemptions: ClassVar[int] = 2
    """Most times one request is preempted for fairness (vLLM's own preemptions for KV space not counted)."""
    metrics: SchedulerMetrics | None = None
    """This engine's series in vLLM's ``/metrics`` (``None`` from :meth:`sharing`: the pool's server reports)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        path = os.environ.get(CONFIG_ENV)
        self.weights = Weights.load(path) if path else None
        self.binding = self.shared if self.shared is not None else Binding(own_policy(), "engine")
        self.seat.register(self.model, _profile(self.vllm_config))
        if self.shared is None:  # served on its own, as by `vllm serve`
            set_bound = getattr(self.seat.policy, "set_bound", None)
            if set_bound is not None:  # U of this engine alone (the idle credit's): its KV cache's tokens
                held = (self.kv_cache_config.num_blocks - 1) * self.block_size  # vLLM's null block holds none
                set_bound(service_bound(self.seat.cost, {self.model: held}))
            self.metrics = SchedulerMetrics.for_engine(self.vllm_config)
            if not FairArgsValidator.configured(self.vllm_config):
                log.warning("fairagents.vllm.args_unchecked", fix="--logits-processors fairagents.vllm:FairArgsValidator",
                            reason="requests with invalid fairagents_* arguments are served, not refused")
        self._twins: dict[str, FairRequest] = {}  # request id -> the policy's request, while the engine holds it
        self._outputs: dict[str, int] = {}  # request id -> this step's output tokens, charged at its end
        self._fair_preempted: dict[str, int] = {}  # request id -> times preempted for fairness
        self.idle = False
        """Whether the last step scheduled nothing (its waiting requests held, or none): the engine may wait."""
        # vLLM's priority path: when it must preempt for KV space it takes the running request of highest
        # `priority`, which _rank_victims sets from the policy's counters, and leaves `running` in its order.
        self.policy = SchedulingPolicy.PRIORITY
        # Without async scheduling the engine steps synchronously and vLLM itself picks its plain
        # Scheduler: AsyncScheduler's output placeholders and its extra prefix caching per decode
        # step then only cost time (5 % of the tiny model's throughput, measured), so skip them.
        self._overlap = bool(self.scheduler_config.async_scheduling)
        self._update_output = (AsyncScheduler if self._overlap else Scheduler)._update_request_with_output
        self.waiting = FairQueue(self.binding, self._twin_of)
        self._engine_max_active = int(getattr(self, "max_num_active_reqs", self.max_num_running_reqs))
        self._max_active = self._engine_max_active
        if self.scheduler_config.policy != "fcfs":
            log.warning("fairagents.vllm.policy_ignored", policy=self.scheduler_config.policy,
                        reason=f"FairScheduler orders by the fairagents policy {self.seat.policy.name!r}")

    @classmethod
    def sharing(cls, binding: Binding, *, preempt: bool = True) -> type[FairScheduler]:
        """This class bound to a pool's policy and model name (for in-process engines of one pool).

        Examples:
            >>> import fairagents as fa
            >>> from fairagents.policies.pooled import PoolPolicy
            >>> from fairagents.vllm.scheduler import Binding, FairScheduler
            >>> bound = FairScheduler.sharing(Binding(PoolPolicy(fa.policies.make_policy("vtc")), "chat"))
            >>> issubclass(bound, FairScheduler), bound.shared.model, bound.shared.seat.policy.name
            (True, 'chat', 'vtc')
        """
        return type(cls.__name__, (cls,), {"shared": binding, "preempt": preempt, "__module__": cls.__module__})

    # -- identity and charging ---------------------------------------------------------

    def _twin_of(self, request: VllmRequest) -> FairRequest:
        """The policy's request for ``request``: the arbiter's own if it handed it over, else built from its arguments."""
        rid = request.request_id
        twin = self._twins.get(rid)
        if twin is None:
            # vLLM makes ids unique with a suffix ("<id>-<8 characters>"); the arbiter knows the id it gave
            given = rid[:-9] if len(rid) > 9 and rid[-9] == "-" else rid
            twin = self.seat.expected(self.model, given) or self.seat.expected(self.model, rid)
            if twin is not None and twin.id != rid:
                twin = dataclasses.replace(twin, id=rid)
            elif twin is None:
                params = request.sampling_params
                extra = params.extra_args if params is not None else None
                prompt = 0 if self._sibling_charged(rid) else request.num_prompt_tokens
                twin = FairRequest(rid, identity(extra, self.weights), self.model, prompt,
                                   max(request.max_tokens, 1), self.seat.clock(), run=run_of(extra))
            self._twins[rid] = twin
            if self.metrics is not None:
                self.metrics.observe(twin.agent)
        return twin

    def _sibling_charged(self, request_id: str) -> bool:
        """Whether ``request_id`` is a later choice of a request with ``n > 1``, whose first choice pays the prompt.

        vLLM splits such a request into children ``"<i>_<parent id>"`` that share one
        prompt (the later ones read it from the prefix cache); child 0 is charged it.
        """
        index, sep, parent = request_id.partition("_")
        return bool(sep) and index.isdigit() and index != "0" and f"0_{parent}" in self._twins

    def _agent_of(self, request: VllmRequest) -> Agent:
        return self._twin_of(request).agent

    # -- preemption --------------------------------------------------------------------

    def _may_preempt(self) -> bool:
        """Whether this step could run out of KV blocks: one per running request, and a full step of prefill."""
        need = len(self.running) + -(-self.max_num_scheduled_tokens // self.block_size)
        return self.kv_cache_manager.block_pool.get_num_free_blocks() < need

    def _running_key(self, request: VllmRequest) -> tuple[Any, ...]:
        # By the policy's counters, so the last is the most served client's; among one client's, decodes
        # before a prefill, which is the cheapest to redo.
        return (*self.seat.served(self._agent_of(request)), request.num_computed_tokens < request.num_prompt_tokens,
                request.arrival_time)

    def _rank_victims(self) -> None:
        """Set each running request's ``priority`` to its rank by :meth:`_running_key`: vLLM preempts the highest.

        ``running`` keeps vLLM's order, which is the order it hands out the step's token
        budget in: decodes already running go first, a long prefill does not jump them.
        """
        for rank, request in enumerate(sorted(self.running, key=self._running_key)):
            request.priority = rank

    def _prefix_hit(self, head: VllmRequest) -> tuple[int, int]:
        """``head``'s prefix-cache hit as vLLM will find it when it schedules it: tokens, and cached blocks sitting free.

        Asked of vLLM's KV cache manager (the lookup changes nothing); none for a request
        that already holds blocks, which vLLM does not look up.
        """
        if head.num_computed_tokens:
            return 0, 0
        blocks, hit, _ = self.kv_cache_manager.get_computed_blocks(head)
        return hit, sum(1 for group in blocks.blocks for b in group if b.ref_cnt == 0)

    def _shortfall(self, head: VllmRequest, hit: tuple[int, int] = (0, 0)) -> tuple[bool, int]:
        """Whether the batch is out of sequences for ``head``, and the KV blocks it lacks for ``head``'s next chunk.

        As vLLM's allocation will see it: ``head``'s prefix-cache ``hit``
        (:meth:`_prefix_hit`: those blocks need no allocation; the ones sitting in the
        free queue leave it), the chunk after it plus the speculative lookahead, in each
        KV cache group; plus a block for each running decode that opens one. An upper
        estimate (a sliding-window group needs fewer), so a victim is never too small.
        """
        block, manager = self.block_size, self.kv_cache_manager
        computed, evictable = head.num_computed_tokens or hit[0], hit[1]
        chunk = min(head.num_tokens - computed, self.max_num_scheduled_tokens) + self.num_lookahead_tokens
        groups = len(self.kv_cache_config.kv_cache_groups)
        growing = sum(1 for r in self.running if r.num_computed_tokens % block == 0)  # decodes opening a block
        new_blocks = -(-(computed + chunk) // block) - -(-computed // block)
        lacking = (new_blocks + growing) * groups + evictable - manager.block_pool.get_num_free_blocks()
        return len(self.running) >= self._max_active, max(lacking, 0)

    def _frees(self, request: VllmRequest) -> int:
        """KV blocks preempting ``request`` would give back now: those it alone holds (none while a free is deferred)."""
        if not self._request_blocks_can_be_freed(request):
            return 0
        blocks = self.kv_cache_manager.get_blocks(request.request_id).blocks
        return sum(1 for group in blocks for b in group if b.ref_cnt == 1 and not b.is_null)

    @staticmethod
    def schedulable(head: VllmRequest) -> bool:
        """Whether vLLM would take ``head`` into its batch if there were room.

        A request with an output constraint waits for its grammar; vLLM promotes it
        only when it peeks at it, and with the batch full it never peeks. So a compiled
        grammar counts as ready here (a failed one does not: vLLM ends that request).
        Output of an earlier run still in flight (async scheduling) makes it wait too.
        """
        if head.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
            constraint = head.structured_output_request
            grammar = constraint.grammar if constraint is not None else None  # None while it compiles
            return grammar is not None and not isinstance(grammar, Exception)
        if Scheduler._is_blocked_waiting_status(head.status):
            return False
        return not (head.num_stale_output_tokens and not head.drop_stale_output)

    def fair_victim(self, head: VllmRequest) -> VllmRequest | None:
        """The running request to preempt so that ``head`` (the policy's next choice) can run, if any.

        Only when the batch cannot take ``head`` (no sequence slot, or too few free KV
        blocks) and vLLM could run ``head`` given room (:meth:`schedulable`: a tool call
        whose grammar has compiled can). A candidate belongs to another client — another
        app, or another agent of ``head``'s app — that the policy has served more than
        ``head``'s by more than ``head``'s prompt charge (what it will pay, its prefix-cache hit at
        ``w_cached``) — for a head resuming after a
        preemption, which pays no prompt again, the larger of that and the candidate's
        recompute (its computed tokens priced as prompt) — at that level over the weight;
        it has been preempted for fairness fewer than :attr:`max_fair_preemptions` times;
        and freeing it lets ``head`` in. Among candidates: the client furthest ahead
        (the policy's :meth:`~fairagents.policies.BasePolicy.lead`: ``hmfs``, ``vtc``,
        ``wfq`` each say how they compare two clients), then the request with the least
        progress (the cheapest to recompute).

        The threshold is the hysteresis: once a new ``head`` runs, its client is charged
        its prompt and is still no further served than the victim's, so the victim's
        client is not owed a preemption back; and a preempted request, which resumes
        uncharged, must be owed more than the work it would throw away, so two clients
        cannot take turns preempting each other's requests for nothing. No request is
        thrown away more often than the bound.
        """
        if not self.schedulable(head):
            return None
        hit = self._prefix_hit(head)
        full, lacking = self._shortfall(head, hit)
        if not full and not lacking:
            return None
        twin = self._twin_of(head)
        who, seat = twin.agent, self.seat
        charge = seat.input_price(self.model, twin.prompt_tokens, min(hit[0], twin.prompt_tokens))
        best: tuple[tuple[float, int], VllmRequest] | None = None
        resuming = head.num_preemptions > 0  # it pays no prompt again: the work it throws away is its threshold
        running = self.running
        preempted, most = self._fair_preempted, self.max_fair_preemptions
        for request, lead in zip(running, seat.leads(who, [self._agent_of(r) for r in running]), strict=True):
            if lead is None or lead <= charge:
                continue
            key = (lead, -request.num_computed_tokens)
            if best is not None and key <= best[0]:  # the cheap test first: most candidates are not the best
                continue
            if preempted.get(request.request_id, 0) >= most:
                continue
            if resuming and lead <= seat.input_price(self.model, request.num_computed_tokens):
                continue
            if lacking and self._frees(request) < lacking:
                continue
            best = (key, request)
        return None if best is None else best[1]

    def _preempt_for_waiting(self) -> None:
        """At most one preemption per step, for the request vLLM takes next when the batch cannot take it.

        That is the policy's next choice, unless vLLM holds a request with KV blocks in
        ``kv_holding_waiting`` that it could run: it drains those first (one it cannot run
        yet, a streaming session waiting for input, it skips), so that one is the head to
        make room for.
        """
        head = next((r for r in self.kv_holding_waiting if self.schedulable(r)), None)
        if head is None:
            if self.waiting.held_by_device:
                return  # its client is ahead of one waiting elsewhere on the device: no room to make
            try:
                head = self.waiting.peek_request()
            except IndexError:
                return
        victim = self.fair_victim(head)
        if victim is not None:
            self.running.remove(victim)
            rid = victim.request_id
            self._fair_preempted[rid] = self._fair_preempted.get(rid, 0) + 1
            self.seat.tally(self.model).fair_preemptions += 1
            self._preempt_request(victim, time.monotonic(), drop_stale_output=self.requires_kv_delivery)

    def _preempt_request(self, request: VllmRequest, timestamp: float, *args: Any, **kwargs: Any) -> None:
        tally = self.seat.tally(self.model)
        tally.preemptions += 1
        tally.recomputed += request.num_computed_tokens
        super()._preempt_request(request, timestamp, *args, **kwargs)

    # -- the engine loop -----------------------------------------------------------------

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        """Preempt for a client owed service if the batch is full, rank vLLM's victims, schedule, charge what ran."""
        cap = self.binding.max_running
        self._max_active = self._engine_max_active if cap is None else min(cap, self._engine_max_active)
        self.max_num_active_reqs = self._max_active  # what vLLM admits into its batch, up to its max_num_seqs
        self.waiting.held_by_device = False
        if len(self.seat.models) > 1 and self.waiting:
            self.waiting.held_by_device = self._held_by_device()
        if self.running and self.seat.orders_by_service:
            with self.seat.lock:
                if self.preempt and (self.waiting or self.kv_holding_waiting):
                    self._preempt_for_waiting()
                if len(self.running) > 1 and self._may_preempt():
                    self._rank_victims()
        try:
            output = super().schedule(*args, **kwargs)
            self._admit(output)
            self.idle = not output.total_num_scheduled_tokens
            return output
        finally:
            self.waiting.new_step()  # only a step pops: what comes back between steps was not popped in one

    def _held_by_device(self) -> bool:
        """Whether the policy's next choice waits for the device: a client owed more waits on another of its engines."""
        seat = self.seat
        with seat.lock:
            try:
                head = self.waiting.peek_request()
            except IndexError:
                return False
            return seat.holds(self.model, self._agent_of(head))

    def _admit(self, output: Any) -> None:
        """Charge the input of the requests this step took into its batch (``output``: vLLM's ``SchedulerOutput``).

        A new request's computed tokens as the step took it are what it found in the
        prefix cache. Those the fair queue handed out are charged by it; the others come
        from vLLM's ``kv_holding_waiting``, which vLLM drains before the fair queue (a
        request whose KV was loaded from outside the engine, a streaming-input session's
        next chunk): :meth:`~fairagents.policies.pooled.PoolPolicy.engine_input`.
        """
        computed = {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs}
        popped = self.waiting.admit_scheduled(self._scheduled, computed)
        for rid, done in computed.items():
            request = self.requests.get(rid)
            if rid not in popped and request is not None:
                self.seat.engine_input(self.model, rid, request.num_prompt_tokens, done)

    def _scheduled(self, request_id: str) -> bool:
        request = self.requests.get(request_id)
        return request is not None and request.status == RequestStatus.RUNNING

    def _update_after_schedule(self, scheduler_output: Any) -> None:
        if self._overlap:
            super()._update_after_schedule(scheduler_output)
        else:
            Scheduler._update_after_schedule(self, scheduler_output)

    def _update_request_with_output(self, request: VllmRequest, new_token_ids: list[int],
                                    is_stale: bool = False) -> tuple[list[int], bool]:
        new_token_ids, stopped = self._update_output(self, request, new_token_ids, is_stale)
        if new_token_ids:  # charged together at the end of the step's outputs (update_from_output)
            outputs, rid = self._outputs, request.request_id
            outputs[rid] = outputs.get(rid, 0) + len(new_token_ids)
        return new_token_ids, stopped

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's, then the step's output charged in one go."""
        try:
            return super().update_from_output(*args, **kwargs)
        finally:
            if self._outputs:
                outputs, self._outputs = self._outputs, {}
                self.seat.engine_progress(self.model, outputs.items())
            self._publish()

    def finish_requests(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's (aborts, from outside the engine loop), then the metrics if the engine has emptied."""
        finished = super().finish_requests(*args, **kwargs)
        self._publish()
        return finished

    def _publish(self) -> None:
        """Publish the metrics when due, and whenever the engine has run out of requests (its gauges then read 0)."""
        metrics = self.metrics
        if metrics is None or not (metrics.due() or not self.has_unfinished_requests()):
            return
        with self.seat.lock:
            service = [(app, agent, total) for (model, app, agent), total in self.seat.service.items()
                       if model == self.model]
        metrics.publish(service, [(self._agent_of(r), r.status == RequestStatus.RUNNING)
                                  for r in self.requests.values() if not r.is_finished()])

    def _free_request(self, request: VllmRequest, *args: Any, **kwargs: Any) -> Any:
        rid = request.request_id
        produced = self._outputs.pop(rid, 0)
        if produced:  # its last tokens, before it ends
            self.seat.engine_progress(self.model, [(rid, produced)])
        self.seat.engine_end(self.model, rid, outcome_of(request))
        self._twins.pop(rid, None)
        self._fair_preempted.pop(rid, None)
        return super()._free_request(request, *args, **kwargs)


def own_policy() -> PoolPolicy:
    """The policy of a scheduler served on its own: :data:`POLICY_ENV` names it (``hmfs_credit`` by default).

    Examples:
        >>> import os
        >>> from fairagents.vllm.scheduler import POLICY_ENV, own_policy
        >>> own_policy().policy.name if POLICY_ENV not in os.environ else "hmfs_credit"
        'hmfs_credit'
    """
    cost = UnifiedTokenCost()
    return PoolPolicy(make_policy(os.environ.get(POLICY_ENV) or DEFAULT_POLICY, cost), cost)


def _profile(vllm_config: Any) -> ModelProfile:
    """This model's profile for unified tokens: hidden size and layers of its (text) config."""
    model_config = vllm_config.model_config
    modality = Modality.VISION if getattr(model_config, "is_multimodal_model", False) else Modality.TEXT
    return ModelProfile.of_text_config(model_config.hf_text_config, modality)
