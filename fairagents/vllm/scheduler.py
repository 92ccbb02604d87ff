"""HMFS inside vLLM's engine loop: a v1 scheduler that orders, charges and preempts by fair counters.

fairagents' arbiter schedules in front of an engine; this module schedules inside one.
:class:`FairScheduler` subclasses vLLM's ``AsyncScheduler`` (with async scheduling
off it updates requests as vLLM's plain ``Scheduler`` does), for
``EngineArgs(scheduler_cls=...)`` or ``vllm serve --scheduler-cls fairagents.vllm.FairScheduler``:

- **Identity**: ``fairagents_app`` and ``fairagents_agent`` in each request's
  ``SamplingParams.extra_args`` (``vllm_xargs`` over HTTP); app ``default`` without them.
  ``fairagents_run`` names the run a request belongs to (:func:`run_of`); it is read
  onto the request the policy sees, which does not order by it yet.
- **Weights**: from the file named by :data:`CONFIG_ENV` (:class:`Weights`) when set,
  the request's own weight arguments then ignored; else from ``fairagents_app_weight`` /
  ``fairagents_agent_weight`` (default 1), checked by
  :class:`~fairagents.vllm.args.FairArgsValidator`.
- **The waiting queue** (:class:`FairQueue`) is HMFS's: lowest app counter, then its
  lowest agent counter, then the earliest arrival.
- **Charges**, in unified tokens of this model: the whole prompt as the request enters
  the batch, output tokens as each step returns them; recomputation after a
  preemption is never charged again.
- **Preemption**: on a step that could run out of KV blocks the running requests are
  ordered so vLLM's victim (the last) has the highest counter.
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

import json
import os
import threading
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import RequestQueue, SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request as VllmRequest
from vllm.v1.request import RequestStatus

from fairagents._logging import get_logger
from fairagents.constants import METADATA_AGENT, METADATA_APP, XARG_AGENT_WEIGHT, XARG_APP_WEIGHT, XARG_RUN
from fairagents.cost import ModelProfile, UnifiedTokenCost
from fairagents.errors import InvalidParameterError
from fairagents.identity import Agent, App, Modality, check_run
from fairagents.policies.hmfs import HMFS
from fairagents.request import Outcome
from fairagents.request import Request as FairRequest
from fairagents.vllm.args import FairArgsValidator, check_weight
from fairagents.vllm.metrics import SchedulerMetrics

__all__ = ["CONFIG_ENV", "FairCounters", "FairQueue", "FairScheduler", "Weights", "identity", "run_of"]

log = get_logger(__name__)

#: Environment variable naming the weights file (TOML or JSON) of :class:`FairScheduler`.
CONFIG_ENV = "FAIRAGENTS_SCHEDULER_CONFIG"
DEFAULT = "default"


class Weights:
    """App and agent weights from a file: ``{"apps": {app: {"weight": w, "agents": {agent: w}}}}``.

    Examples:
        >>> from fairagents.vllm.scheduler import Weights
        >>> w = Weights({"apps": {"search": {"weight": 2, "agents": {"planner": 3}}}})
        >>> w.app("search"), w.agent("search", "planner"), w.agent("search", "other"), w.app("x")
        (2.0, 3.0, 1.0, 1.0)
        >>> Weights({"apps": {"a": {"weight": 0}}})
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: weight of app 'a' must be a finite number > 0, got 0
    """

    def __init__(self, data: Mapping[str, Any]) -> None:
        apps = data.get("apps", {})
        if not isinstance(apps, Mapping) or set(data) - {"apps"}:
            raise InvalidParameterError('a weights file holds one table, "apps": {app: {"weight": ..., "agents": {...}}}')
        self._apps: dict[str, float] = {}
        self._agents: dict[tuple[str, str], float] = {}
        for name, spec in apps.items():
            if not isinstance(spec, Mapping) or set(spec) - {"weight", "agents"}:
                raise InvalidParameterError(f'app {name!r} of a weights file takes "weight" and "agents", got {spec!r}')
            self._apps[name] = check_weight(spec.get("weight", 1.0), f"weight of app {name!r}")
            for agent, w in (spec.get("agents") or {}).items():
                self._agents[(name, agent)] = check_weight(w, f"weight of agent {agent!r} of app {name!r}")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Weights:
        """Read a TOML (``.toml``) or JSON file."""
        text = Path(path).read_text()
        return cls(tomllib.loads(text) if str(path).endswith(".toml") else json.loads(text))

    def app(self, name: str) -> float:
        return self._apps.get(name, 1.0)

    def agent(self, app: str, name: str) -> float:
        return self._agents.get((app, name), 1.0)


def identity(extra_args: Mapping[str, Any] | None, weights: Weights | None = None) -> Agent:
    """The agent a request's ``extra_args`` name (app and agent ``default`` when absent).

    With ``weights`` (a weights file), weights come from it alone; without, from the
    ``fairagents_app_weight`` / ``fairagents_agent_weight`` arguments. Served with
    :class:`~fairagents.vllm.args.FairArgsValidator`, a request with invalid
    ones never gets here; without it, an invalid weight counts as 1.
    """
    args = extra_args or {}
    app = str(args.get(METADATA_APP) or DEFAULT)
    name = str(args.get(METADATA_AGENT) or DEFAULT)
    if weights is not None:
        return Agent(name, App(app, weight=weights.app(app)), weight=weights.agent(app, name))
    return Agent(name, App(app, weight=_arg_weight(args, XARG_APP_WEIGHT)), weight=_arg_weight(args, XARG_AGENT_WEIGHT))


def run_of(extra_args: Mapping[str, Any] | None) -> str | None:
    """The run a request's ``extra_args`` name (``fairagents_run``), or ``None``: the request is a run of its own.

    Served with :class:`~fairagents.vllm.args.FairArgsValidator`, a request with an
    invalid run never gets here; without it, an invalid run counts as none.

    Examples:
        >>> from fairagents.vllm.scheduler import run_of
        >>> run_of({"fairagents_run": "digest-7"}), run_of(None)
        ('digest-7', None)
    """
    run = (extra_args or {}).get(XARG_RUN)
    if run is None:
        return None
    try:
        return check_run(run)
    except InvalidParameterError as err:
        log.warning("fairagents.vllm.bad_run", error=str(err))
        return None


def _arg_weight(args: Mapping[str, Any], key: str) -> float:
    if key not in args:
        return 1.0
    try:
        return check_weight(args[key], key)
    except InvalidParameterError as err:
        log.warning("fairagents.vllm.bad_weight", error=str(err))
        return 1.0


class FairCounters:
    """HMFS counters for one or more engines' fair schedulers: one set per pool, safe across engine threads.

    Each engine registers its model (its profile prices its tokens in unified
    tokens); apps and agents then have one counter across every model of the pool, as
    in HMFS's Algorithm 1, so an app's service on one model counts on the others.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.vllm.scheduler import FairCounters
        >>> counters = FairCounters()
        >>> counters.register("chat", fa.ModelProfile(d_model=4096, n_layers=1))
        >>> counters.charge(fa.Agent("t", fa.App("a")), "chat", prompt=10, output=5)
        >>> counters.charged
        {'a': 20.0}
    """

    def __init__(self, *, d_base: int | None = None, w_input: float = 1.0, w_output: float = 2.0) -> None:
        self.cost = UnifiedTokenCost(**({"d_base": d_base} if d_base else {}), w_input=w_input, w_output=w_output)
        self.policy = HMFS(self.cost)
        """The counters: ``policy.app_counters()``, ``policy.agent_counters(app)`` (unified tokens / weight)."""
        self.lock = threading.RLock()
        self.charged: dict[str, float] = {}
        """Service charged per app so far, in unified tokens (not divided by weight)."""
        self.service: dict[tuple[str, str, str], float] = {}
        """Service charged per ``(model, app, agent)`` so far, in unified tokens (not divided by weight)."""

    def register(self, model: str, profile: ModelProfile) -> None:
        """Price ``model``'s tokens by ``profile`` (an engine's model joins the pool)."""
        with self.lock:
            if model not in self.cost.profiles:
                self.cost.register(model, profile)

    def forget(self, model: str) -> None:
        """Withdraw, uncharged, every request still waiting for ``model`` (its engine stopped)."""
        with self.lock:
            for twin in [t for t in self.policy.waiting_requests() if t.model == model]:
                self.policy.on_finish(twin, Outcome.CANCELLED, 0.0)

    def charge(self, agent: Agent, model: str, *, prompt: int = 0, output: int = 0) -> None:
        """Charge ``prompt`` input and ``output`` output tokens of ``model`` to ``agent``."""
        amount = (self.cost.input_cost(model, prompt) if prompt else 0.0) + (
            self.cost.output_cost(model, output) if output else 0.0)
        if amount > 0:
            with self.lock:
                self._add(agent, amount, model)

    def charge_outputs(self, model: str, outputs: Iterable[tuple[Agent, int]]) -> None:
        """Charge a step's output tokens, ``(agent, tokens)`` each, under one hold of the lock."""
        with self.lock:
            for agent, tokens in outputs:
                self._add(agent, self.cost.output_cost(model, tokens), model)

    def _add(self, agent: Agent, amount: float, model: str) -> None:
        """Charge ``amount`` unified tokens of ``model`` to ``agent`` (the lock held)."""
        self.policy.charge_to(agent, amount)
        self.charged[agent.app.name] = self.charged.get(agent.app.name, 0.0) + amount
        key = (model, agent.app.name, agent.name)
        self.service[key] = self.service.get(key, 0.0) + amount


class FairQueue(RequestQueue):
    """vLLM's waiting queue, ordered by HMFS counters (see the module docs).

    The requests it holds are known to the policy as waiting ones. A request popped
    for scheduling leaves the policy (the scheduler charges it from then on); one put
    back (skipped, or preempted) arrives again, with the counter lift that brings.

    Args:
        counters: the HMFS counters (shared with the scheduler that charges them, and
            with other engines' schedulers of the same pool).
        model: this engine's name among the counters' models.
        agent_of: the agent of a vLLM request.
        on_pop: called with each request popped, under the counters' lock (the
            scheduler charges its prompt once it is in the batch, before the next pick).
        settle: called before every pick (the scheduler charges what was popped into the batch).
    """

    def __init__(self, counters: FairCounters, model: str, agent_of: Any,
                 on_pop: Any = None, settle: Any = None) -> None:
        self.counters = counters
        self.policy = counters.policy
        self.model = model
        self._agent_of = agent_of
        self._on_pop = on_pop
        self._settle = settle
        self._held: dict[str, tuple[VllmRequest, FairRequest]] = {}
        self._peeked: str | None = None
        counters.forget(model)  # an engine started again: its last queue's requests are gone with it

    def add_request(self, request: VllmRequest) -> None:
        # No prompt on the policy's copy: the scheduler charges input as prefill runs.
        params = request.sampling_params
        twin = FairRequest(request.request_id, self._agent_of(request), self.model, 0, max(request.max_tokens, 1),
                           request.arrival_time, run=run_of(params.extra_args if params is not None else None))
        with self.counters.lock:
            self.policy.on_arrival(twin, request.arrival_time)
        self._held[request.request_id] = (request, twin)

    def peek_request(self) -> VllmRequest:
        if self._settle is not None:
            self._settle()
        with self.counters.lock:
            while (twin := self.policy.select(self.model, 0.0)) is not None and twin.id not in self._held:
                self.policy.on_finish(twin, Outcome.CANCELLED, 0.0)  # not ours (cannot happen): never serve it
            if twin is None:
                self._peeked = None
                raise IndexError("peek from an empty queue")
            self._peeked = twin.id
        return self._held[twin.id][0]

    def pop_request(self) -> VllmRequest:
        """Take the request :meth:`peek_request` showed (vLLM allocates for it between the two)."""
        with self.counters.lock:
            if self._peeked is None or self._peeked not in self._held:
                self.peek_request()
            request, twin = self._held.pop(self._peeked)  # type: ignore[arg-type]
            self._peeked = None
            self.policy.on_dispatch(twin, 0.0)  # charges nothing: the twin has no prompt
            self.policy.on_finish(twin, Outcome.FINISHED, 0.0)  # the scheduler tracks it while it runs
            if self._on_pop is not None:
                self._on_pop(request)
        return request

    def prepend_request(self, request: VllmRequest) -> None:
        self.add_request(request)  # the order is the counters', not the position

    def prepend_requests(self, requests: Iterable[VllmRequest]) -> None:
        for request in requests:
            self.add_request(request)

    def remove_request(self, request: VllmRequest) -> None:
        if self._peeked == request.request_id:
            self._peeked = None
        held = self._held.pop(request.request_id, None)
        if held is not None:
            with self.counters.lock:
                self.policy.on_finish(held[1], Outcome.CANCELLED, 0.0)

    def remove_requests(self, requests: Iterable[VllmRequest]) -> None:
        for request in requests:
            self.remove_request(request)

    def __bool__(self) -> bool:
        return bool(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[VllmRequest]:
        with self.counters.lock:
            keyed = [(self.policy.counters_of(t.agent), t.arrival, r) for r, t in self._held.values()]
        keyed.sort(key=lambda k: (k[0], k[1]))
        return iter([r for _, _, r in keyed])


class FairScheduler(AsyncScheduler):
    """vLLM's async scheduler with HMFS order, charging and preemption (see the module docs).

    Constructed by vLLM (``EngineArgs(scheduler_cls=FairScheduler)``); it reads the
    model's hidden size and depth from its config for unified tokens. It keeps its own
    :class:`FairCounters`, unless built from :meth:`sharing`, which binds the counters
    of a pool (in-process engines, as ``VLLMEngine(scheduler="fair")`` in an arbiter).

    Examples:
        >>> from vllm.engine.arg_utils import EngineArgs
        >>> from fairagents.vllm import FairScheduler
        >>> EngineArgs(model="some/model", scheduler_cls=FairScheduler).scheduler_cls is FairScheduler
        True
    """

    shared: ClassVar[FairCounters | None] = None
    """Counters bound by :meth:`sharing` (``None``: this scheduler makes its own)."""
    model: ClassVar[str] = "engine"
    """This engine's name among the counters' models."""
    metrics: SchedulerMetrics | None = None
    """This engine's series in vLLM's ``/metrics`` (``None`` from :meth:`sharing`: the pool's server reports)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        path = os.environ.get(CONFIG_ENV)
        self.weights = Weights.load(path) if path else None
        self.counters = self.shared if self.shared is not None else FairCounters()
        self.counters.register(self.model, _profile(self.vllm_config))
        if self.shared is None:  # served on its own, as by `vllm serve`
            self.metrics = SchedulerMetrics.for_engine(self.vllm_config)
            if not FairArgsValidator.configured(self.vllm_config):
                log.warning("fairagents.vllm.args_unchecked", fix="--logits-processors fairagents.vllm:FairArgsValidator",
                            reason="requests with invalid fairagents_* arguments are served, not refused")
        self._agents: dict[str, Agent] = {}  # request id -> its agent, while the engine holds it
        self._prefilled: dict[str, int] = {}  # request id -> prompt tokens charged so far
        self._outputs: dict[tuple[str, str], tuple[Agent, int]] = {}  # (app, agent) -> this step's output tokens
        self.policy = SchedulingPolicy.FCFS  # preemption takes the last of `running`, which we order
        # Without async scheduling the engine steps synchronously and vLLM itself picks its plain
        # Scheduler: AsyncScheduler's output placeholders and its extra prefix caching per decode
        # step then only cost time (5 % of the tiny model's throughput, measured), so skip them.
        self._overlap = bool(self.scheduler_config.async_scheduling)
        self._popped: list[VllmRequest] = []  # popped since the last settle: in the batch, or only skipped
        self.waiting = FairQueue(self.counters, self.model, self._agent_of, self._popped.append, self._settle_pops)
        if self.scheduler_config.policy != "fcfs":
            log.warning("fairagents.vllm.policy_ignored", policy=self.scheduler_config.policy,
                        reason="FairScheduler orders by fair counters")

    @classmethod
    def sharing(cls, counters: FairCounters, model: str) -> type[FairScheduler]:
        """This class bound to ``counters`` under the name ``model`` (for in-process engines of one pool).

        Examples:
            >>> from fairagents.vllm.scheduler import FairCounters, FairScheduler
            >>> bound = FairScheduler.sharing(FairCounters(), "chat")
            >>> issubclass(bound, FairScheduler), bound.model
            (True, 'chat')
        """
        return type(cls.__name__, (cls,), {"shared": counters, "model": model, "__module__": cls.__module__})

    # -- identity and charging ---------------------------------------------------------

    def _agent_of(self, request: VllmRequest) -> Agent:
        agent = self._agents.get(request.request_id)
        if agent is None:
            params = request.sampling_params
            agent = identity(params.extra_args if params is not None else None, self.weights)
            self._agents[request.request_id] = agent
            if self.metrics is not None:
                self.metrics.observe(agent)
        return agent

    def _settle_pops(self) -> None:
        """Charge the prompts of the popped requests that joined the batch (vLLM pops skipped ones too)."""
        popped, self._popped[:] = list(self._popped), []
        for request in popped:
            if request.status == RequestStatus.RUNNING:
                self._charge_prompt(request)

    def _charge_prompt(self, request: VllmRequest, upto: int | None = None) -> None:
        """Charge ``request``'s prompt up to token ``upto`` (all of it by default), never a token twice."""
        rid = request.request_id
        upto = request.num_prompt_tokens if upto is None else min(upto, request.num_prompt_tokens)
        done = self._prefilled.get(rid, 0)
        if upto > done:
            self._prefilled[rid] = upto
            self.counters.charge(self._agent_of(request), self.model, prompt=upto - done)

    def _key(self, request: VllmRequest) -> tuple[float, float, float]:
        return (*self.counters.policy.counters_of(self._agent_of(request)), request.arrival_time)

    def _may_preempt(self) -> bool:
        """Whether this step could run out of KV blocks: one per running request, and a full step of prefill."""
        need = len(self.running) + -(-self.max_num_scheduled_tokens // self.block_size)
        return self.kv_cache_manager.block_pool.get_num_free_blocks() < need

    def _running_key(self, request: VllmRequest) -> tuple[bool, float, float, float]:
        # Decodes first, so a chunked prefill cannot take a step's whole token budget from them
        # (vLLM serves `running` in order); within each, by counters, so the last — the one
        # vLLM preempts — is the highest counter (a prefill, when there is one: the cheapest to redo).
        return (request.num_computed_tokens < request.num_prompt_tokens, *self._key(request))

    # -- the engine loop -----------------------------------------------------------------

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        """Order the running requests (the victim of a preemption is the last), schedule, charge prefill."""
        if len(self.running) > 1 and self._may_preempt():
            with self.counters.lock:
                self.running.sort(key=self._running_key)
        output = super().schedule(*args, **kwargs)
        self._settle_pops()
        # Requests that reached the batch without this queue (vLLM's queue of requests
        # holding KV blocks): their prompt as computed so far (num_computed_tokens already
        # counts this step's tokens).
        for rid in output.num_scheduled_tokens:
            request = self.requests.get(rid)
            if request is not None and self._prefilled.get(rid, 0) < request.num_prompt_tokens:
                self._charge_prompt(request, request.num_computed_tokens)
        return output

    def _update_after_schedule(self, scheduler_output: Any) -> None:
        if self._overlap:
            super()._update_after_schedule(scheduler_output)
        else:
            Scheduler._update_after_schedule(self, scheduler_output)

    def _update_request_with_output(self, request: VllmRequest, new_token_ids: list[int],
                                    is_stale: bool = False) -> tuple[list[int], bool]:
        if self._overlap:
            new_token_ids, stopped = super()._update_request_with_output(request, new_token_ids, is_stale)
        else:
            new_token_ids, stopped = Scheduler._update_request_with_output(self, request, new_token_ids, is_stale)
        if new_token_ids:  # charged per agent, together, at the end of the step's outputs (update_from_output)
            agent = self._agent_of(request)
            key = (agent.app.name, agent.name)
            held = self._outputs.get(key)
            self._outputs[key] = (agent, len(new_token_ids) + (held[1] if held is not None else 0))
        return new_token_ids, stopped

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's, then the step's output charged in one go."""
        try:
            return super().update_from_output(*args, **kwargs)
        finally:
            if self._outputs:
                outputs, self._outputs = self._outputs, {}
                self.counters.charge_outputs(self.model, outputs.values())
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
        with self.counters.lock:
            service = [(app, agent, total) for (model, app, agent), total in self.counters.service.items()
                       if model == self.model]
        metrics.publish(service, [(self._agent_of(r), r.status == RequestStatus.RUNNING)
                                  for r in self.requests.values() if not r.is_finished()])

    def _free_request(self, request: VllmRequest, *args: Any, **kwargs: Any) -> Any:
        self._agents.pop(request.request_id, None)
        self._prefilled.pop(request.request_id, None)
        return super()._free_request(request, *args, **kwargs)


def _profile(vllm_config: Any) -> ModelProfile:
    """This model's profile for unified tokens: hidden size and layers of its (text) config."""
    model_config = vllm_config.model_config
    modality = Modality.VISION if getattr(model_config, "is_multimodal_model", False) else Modality.TEXT
    return ModelProfile.of_text_config(model_config.hf_text_config, modality)
