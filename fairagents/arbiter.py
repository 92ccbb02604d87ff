"""The arbiter: fair access to a pool of models for the apps and agents that share it.

Every call carries an app and agent identity. The arbiter validates it, prepares the
prompt, and hands the request to its :class:`~fairagents.dispatcher.Dispatcher`,
which decides what runs: a model takes a request when it has a free slot and room in
its token budget (the engine's KV capacity), so everything handed to an engine fits
in its batch at once and the order of service stays the policy's. The arbiter is the
async adapter around that decision: it resolves the futures of dispatched requests,
streams their engines' output, reports progress and ends, and keeps the ledger.

Examples:
    >>> import asyncio
    >>> import fairagents as fa
    >>> from fairagents.testing import FakeEngine
    >>> async def main():
    ...     arbiter = fa.Arbiter(policy="hmfs")
    ...     arbiter.add_model("chat", FakeEngine(tokens_per_reply=3))
    ...     planner = arbiter.app("driving", weight=2.0).agent("planner")
    ...     async with arbiter:
    ...         reply = await planner.chat("chat", [{"role": "user", "content": "hi"}], max_tokens=8)
    ...     return reply.usage.completion_tokens, arbiter.stats().apps["driving"].done
    >>> asyncio.run(main())
    (3, 1)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from fairagents._logging import get_logger
from fairagents.admission import Statera, make_admission
from fairagents.calls import Call, ModelCalls
from fairagents.dispatcher import Changes, Dispatcher, Ticket
from fairagents.engines.base import Engine, GenerationParams, Prompt
from fairagents.errors import EngineError, InvalidParameterError, OverloadedError, ProtocolError, ShutdownError
from fairagents.handles import AgentHandle, AppHandle
from fairagents.identity import SLO, Agent, App
from fairagents.limits import DEFAULT_LIMITS, RequestLimits
from fairagents.metrics import RequestRecord
from fairagents.policies import Policy, priced_policy
from fairagents.pool import DEFAULT_IN_FLIGHT, Pool, PoolModel, Restart, TokenBudget, check_limit, schedules_fairly
from fairagents.preprocessing import Preprocessor
from fairagents.request import Outcome, Request
from fairagents.shared import SharedCounters, SharedView
from fairagents.stats import Ledger, Stats
from fairagents.tenants import Tenants, check_max_tokens, check_share

__all__ = ["DEFAULT_IN_FLIGHT", "AgentHandle", "AppHandle", "Arbiter", "Restart"]

log = get_logger("fairagents.arbiter")

# Request ids are unique across every arbiter in the process: arbiters may share an engine,
# and vLLM merges requests of the same id (an abort meant for one would end the other).
_request_ids = itertools.count(1)


class Arbiter(ModelCalls):
    """Fair access to a pool of models for the apps and agents that share it.

    Args:
        policy: a policy name (``"hmfs"``, ``"vtc"``, ``"rr"``, ``"fcfs"``), a policy of
            your own as ``"module:Class"`` (:func:`~fairagents.policies.make_policy`), or an object. A
            policy object that prices in unified tokens (``HMFS()``, ``VTC(UnifiedTokenCost())``)
            lends the arbiter its cost model, so the policy's counters and the ledger price
            alike; ``d_base``/``w_input``/``w_output`` that contradict it are an error.
        in_flight: per-model limit on requests handed to the engine at once, for models
            added without their own. Unset, each model takes its engine's batch capacity
            (``max_num_seqs``) when the engine has one, else :data:`DEFAULT_IN_FLIGHT`.
        token_budget: per-model limit on KV tokens reserved at once, for models added
            without their own: ``"engine"`` (the default) takes the engine's reported KV
            capacity (``engine.token_capacity``; none if it reports none), an integer sets
            it, ``None`` admits by request count alone. Each request reserves
            ``prompt + max_tokens`` (see :mod:`fairagents.dispatcher`).
        pool_in_flight: limit on requests handed to engines at once across the whole
            pool, for models that share hardware. Set, a free slot goes to the policy's
            choice among every model with room
            (:meth:`~fairagents.policies.Policy.select_among`); unset, models are
            scheduled independently.
        d_base: ``d_base`` of unified tokens (default 4096).
        w_input: weight of a prompt token in service (default 1).
        w_output: weight of a generated token in service (default 2).
        max_in_flight_share: the largest share (0 < share ≤ 1) of a model's slots and
            token budget one app may hold at once, for apps declared without their own
            (``None``: no cap). A flood then cannot hold every slot; see
            :mod:`fairagents.dispatcher` for the rule and its cost.
        default_max_tokens: ``max_tokens`` of a call that sets none, for apps declared
            without their own; ``None`` (the default): the rest of the model's context.
            Either way it is clipped to what fits (:meth:`default_max_tokens`).
        admission: ``"statera"`` (or a :class:`~fairagents.admission.Statera`) reserves
            a conformal bound on each request's output instead of ``max_tokens`` and
            steers every model's in-flight limit and token budget from measured
            occupancy and TPOT (H-MAS Alg. 2); ``None`` (the default): worst-case
            reservations under fixed limits. Works with any policy; see
            :mod:`fairagents.admission` for what it buys and risks.
        counters: share the fairness counters with other arbiters (several front doors,
            one fair share): a ``redis://`` URL or a :class:`~fairagents.shared.SharedCounters`;
            ``None`` (the default) keeps them in this arbiter. Needs the ``hmfs`` policy; see
            :mod:`fairagents.shared` for the protocol, failure handling and the bound.
        restart: how a model whose engine died is brought back (:class:`Restart`);
            ``None`` leaves it down until :meth:`restart_model` is called.
        drain_timeout: seconds ``async with`` exit waits for accepted work before
            aborting the rest with :class:`~fairagents.ShutdownError`.
        preprocess_workers: threads of each preprocessing pool: one prepares requests
            carrying images, one parses and tokenizes text for :meth:`prepare_chat` and
            :meth:`prepare_text` (the server's path), off the event loop and fairly by app
            (:mod:`fairagents.preprocessing`).
        preprocess_queue: most requests in one pool at once; one more raises
            :class:`~fairagents.errors.OverloadedError`.
        preprocess_queue_per_app: most requests of one app in one pool at once (default:
            ``preprocess_queue``).
        preprocess_inline: prepare image requests on the event loop instead (only to
            measure what the pool saves: ``fairagents bench modality``).
        limits: bounds on a request's shape (stop strings, logit bias, tools, the size
            and makeup of an output constraint), refused before queueing; ``None``: the
            defaults (:class:`~fairagents.limits.RequestLimits`).
        clock: time source in seconds (injectable for tests).

    Examples:
        >>> import fairagents as fa
        >>> fa.Arbiter(policy="vtc").policy.name
        'vtc'
        >>> fa.Arbiter(policy=fa.policies.HMFS(fa.UnifiedTokenCost(d_base=1024)), d_base=4096)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: the policy prices with d_base=1024, not 4096
    """

    def __init__(
        self,
        policy: str | Policy = "hmfs",
        *,
        in_flight: int | None = None,
        token_budget: TokenBudget = "engine",
        pool_in_flight: int | None = None,
        max_in_flight_share: float | None = None,
        default_max_tokens: int | None = None,
        admission: str | Statera | None = None,
        counters: str | SharedCounters | None = None,
        restart: Restart | None = Restart(),  # noqa: B008 (frozen)
        d_base: int | None = None,
        w_input: float | None = None,
        w_output: float | None = None,
        drain_timeout: float = 30.0,
        preprocess_workers: int = 2,
        preprocess_queue: int = 256,
        preprocess_queue_per_app: int | None = None,
        preprocess_inline: bool = False,
        limits: RequestLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if pool_in_flight is not None:
            check_limit(pool_in_flight)
        check_share(max_in_flight_share)
        check_max_tokens(default_max_tokens)
        if restart is not None and not isinstance(restart, Restart):
            raise InvalidParameterError(f"restart must be a fairagents.Restart or None, got {restart!r}")
        self.max_in_flight_share = max_in_flight_share
        self._default_max_tokens = default_max_tokens
        self.admission = make_admission(admission)
        self.fair_counters: Any = None
        """The counters the pool's engines with ``scheduler="fair"`` share (created with the first)."""
        self.restart = restart
        self._restarts: dict[str, asyncio.Task[None]] = {}
        self.pool = Pool(in_flight=in_flight, token_budget=token_budget)
        policy, self.cost = priced_policy(policy, d_base=d_base, w_input=w_input, w_output=w_output)
        self.pool_in_flight = pool_in_flight
        self.drain_timeout = drain_timeout
        self.preprocessor = Preprocessor(preprocess_workers, preprocess_queue, max_pending_per_app=preprocess_queue_per_app,
                                         inline=preprocess_inline, name="fairagents-images")
        self.text_preprocessor = Preprocessor(preprocess_workers, preprocess_queue,
                                              max_pending_per_app=preprocess_queue_per_app, name="fairagents-text")
        self.limits = limits or DEFAULT_LIMITS
        self.clock = clock
        self.ledger = Ledger()
        self.tenants = Tenants()
        self.counters: SharedCounters | None = None
        """The counters shared with other arbiters, if any (``counters=``)."""
        self._shared: SharedView | None = None
        if counters is not None:
            self.counters = counters if isinstance(counters, SharedCounters) else SharedCounters(counters)
            self._shared = SharedView(self.counters.door, policy)
        self.dispatcher = self._new_dispatcher(policy)
        self._calls: dict[str, Call] = {}
        self._waiting: Counter[tuple[str, str]] = Counter()  # (app, model) -> requests queued
        self._listeners: list[Callable[[RequestRecord], None]] = []
        self._started = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Future[None] | None = None  # done when a start under way ends
        self._start_failure: BaseException | None = None  # why the last start failed
        self._portal_lock = threading.Lock()  # portals on any thread: one of them starts a loop thread
        self._send_lock = threading.Lock()  # portals send calls to a loop that keeps running until they run
        self._closing = False
        self._idle = asyncio.Event()

    # -- declaring the pool and the tenants ------------------------------------

    def add_model(
        self, name: str, engine: Engine, *, in_flight: int | None = None, token_budget: TokenBudget | bool = False
    ) -> None:
        """Add a model to the pool, served by ``engine`` (started with the arbiter).

        ``in_flight`` and ``token_budget`` override the arbiter's for this model
        (``token_budget=False``: the arbiter's). A running arbiter refuses: ``await``
        :meth:`start_model` instead.
        """
        if self._started:
            raise InvalidParameterError(
                f"the arbiter is running: add model {name!r} with 'await arbiter.start_model(...)'", model=name
            )
        self._share_fair_counters(name, engine)
        self.pool.add(name, engine, in_flight=in_flight, token_budget=token_budget)

    async def start_model(
        self, name: str, engine: Engine, *, in_flight: int | None = None, token_budget: TokenBudget | bool = False
    ) -> None:
        """Add a model to a running arbiter: start its engine, then open it for requests."""
        self._share_fair_counters(name, engine)
        self._register(await self.pool.add_started(name, engine, in_flight=in_flight, token_budget=token_budget))
        if self._shared is not None:
            self._shared.bind(self.dispatcher, self._shared_models())

    def app(
        self, name: str, weight: float = 1.0, slo: SLO | None = None, *, max_queued: int | None = None,
        max_in_flight_share: float | None = None, default_max_tokens: int | None = None,
    ) -> AppHandle:
        """Declare (or get) an app; re-declaring with other settings is an error.

        ``max_queued`` bounds the app's requests waiting for one model: a call past it
        raises :class:`~fairagents.errors.OverloadedError` at once instead of queueing
        (``None``: unbounded). ``max_in_flight_share`` caps the share of a model's slots
        and token budget the app may hold (``None``: the arbiter's setting).
        ``default_max_tokens`` is the ``max_tokens`` of the app's calls that set none
        (``None``: the arbiter's setting; see :meth:`default_max_tokens`).
        """
        return AppHandle(self, self.tenants.declare_app(name, weight, slo, max_queued, max_in_flight_share,
                                                        default_max_tokens))

    def _declare_agent(self, app: App, name: str, weight: float, slo: SLO | None) -> AgentHandle:
        return AgentHandle(self, self.tenants.declare_agent(app, name, weight, slo))

    def forget_agent(self, app: str, agent: str) -> bool:
        """Undeclare an agent that never had a request queued, running or accounted; whether it was forgotten.

        An agent with any history (a request waiting or running, service charged, a
        request ended) is kept: the fair-share counters and the ledger read it.
        """
        key = (app, agent)
        if self.ledger.knows(app, agent) or any(c.request.agent_key == key for c in self._calls.values()):
            return False
        if any(t.request.agent_key == key for t in self.dispatcher.tickets()):
            return False
        return self.tenants.forget_agent(key)

    def forget_app(self, name: str) -> bool:
        """Undeclare an app none of whose agents is declared (see :meth:`forget_agent`); whether it was forgotten."""
        return self.tenants.forget_app(name)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the arbiter last started on (``None`` before it started); its engines belong to it.

        Code on other loops or threads calls the arbiter through a :class:`~fairagents.portal.Portal`.
        """
        return self._loop

    @property
    def models(self) -> list[str]:
        """Names of the models in the pool."""
        return list(self.pool.models)

    def engine(self, model: str) -> Engine:
        """The engine serving ``model``."""
        return self.pool.get(model).engine

    def add_listener(self, listener: Callable[[RequestRecord], None]) -> None:
        """Call ``listener`` with the record of every request as it ends (metrics exporters).

        It runs synchronously in the event loop: keep it quick. An exception it raises
        is logged and does not reach any request.
        """
        self._listeners.append(listener)

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Start every engine (in parallel) and open for requests.

        If an engine fails to start, every engine of the pool is stopped again and the
        first failure is raised: nothing is left running; so is a start that is cancelled.
        A second call while a start is under way waits for it, and raises
        :class:`~fairagents.ShutdownError` if that start fails (from another event loop it
        raises :class:`~fairagents.errors.ProtocolError`: call through a portal).
        """
        if self._started:
            return
        if self._starting is not None:
            await self._until_started()
            return
        if self._calls:  # requests of the last run are still ending: they belong to its dispatcher
            raise ShutdownError(f"{len(self._calls)} requests of the arbiter's last run have not ended yet")
        loop = asyncio.get_running_loop()
        # The loop is known from the start on, so that a portal call made while the engines
        # start waits for them on this loop (see _until_started) instead of starting another.
        previous, self._loop = self._loop, loop
        self._starting = loop.create_future()
        self._start_failure = None
        try:
            await self._start()
        except BaseException as err:
            self._start_failure = err
            raise
        finally:
            if not self._started:
                self._loop = previous
            self._starting.set_result(None)
            self._starting = None

    async def _start(self) -> None:
        try:
            await self.pool.start(list(self.pool.models.values()))
        except asyncio.CancelledError:  # cancelled half-way (Ctrl-C in a sync caller): nothing is left running
            await self.pool.stop()
            raise
        if self.dispatcher.closed:  # started again after a close
            self.dispatcher = self._new_dispatcher(self.policy)
        for m in self.pool.models.values():
            if m.name not in self.dispatcher.models:
                self._register(m)
        if self.counters is not None and self._shared is not None:
            self._shared.bind(self.dispatcher, self._shared_models())
            self.counters.attach(self._shared, self._after_sync)
            try:
                await self.counters.start()
            except BaseException:  # nothing is left running
                await self.pool.stop()
                raise
        self._started = True
        self._closing = False
        log.info("fairagents.arbiter.started", models=self.models, policy=self.policy.name)

    @property
    def _closed(self) -> bool:
        """Neither running nor starting (never started, or closed since)."""
        return not self._started and self._starting is None

    async def _until_started(self) -> None:
        """Wait for a start under way to end (at once when none is); raise if it failed.

        Raises:
            ProtocolError: the start is under way on another event loop (call through a portal).
            ShutdownError: the start it waited for failed (that start raised why).
        """
        starting = self._starting
        if starting is None:
            return
        if starting.get_loop() is not asyncio.get_running_loop():
            raise ProtocolError("the arbiter is starting on another event loop: call it through a fairagents.Portal")
        await asyncio.shield(starting)
        if not self._started:
            raise ShutdownError(f"the arbiter failed to start: {self._start_failure!r}") from self._start_failure

    async def close(
        self, timeout: float | None = None, *, stop_engines: bool = True, abort_timeout: float = 5.0
    ) -> None:
        """Stop admitting, let accepted work finish for ``timeout`` s, abort the rest, stop engines.

        After aborting, it waits up to ``abort_timeout`` s for the aborted requests to end
        (their callers get :class:`~fairagents.ShutdownError`) before it stops the engines;
        so, besides the engines' own abort and stop calls, it takes at most
        ``timeout + abort_timeout`` s.
        With ``stop_engines=False`` the engines keep running, for another arbiter to use.
        """
        if not self._started:
            return
        self._closing = True
        restarts, self._restarts = list(self._restarts.values()), {}
        for task in restarts:
            task.cancel()
        await asyncio.gather(*restarts, return_exceptions=True)
        await self._wait_idle(self.drain_timeout if timeout is None else timeout)
        if self._calls:
            log.warning("fairagents.arbiter.drain_timeout", aborted=len(self._calls))
            self._apply(self.dispatcher.close(self.clock()))  # the waiting fail with ShutdownError
            for call in list(self._calls.values()):
                call.shutdown = True
                await self._engine_of(call).abort(call.request.id)
            await self._wait_idle(abort_timeout)
        self.dispatcher.close(self.clock())
        if self.counters is not None:
            await self.counters.close()
        self.preprocessor.close()
        self.text_preprocessor.close()
        if stop_engines:
            await self.pool.stop()
        self._started = False
        log.info("fairagents.arbiter.closed")

    async def restart_model(self, model: str, *, attempts: int | None = None, backoff: float | None = None) -> None:
        """Restart ``model``'s engine now and open it for requests again (after it died, or by choice).

        The model stops taking requests (its queued ones fail with
        :class:`~fairagents.EngineError`, as when it dies), its engine is stopped and
        started again — up to ``attempts`` times, ``backoff`` seconds apart and doubling
        (defaults: the arbiter's :class:`Restart`) — and the model then takes requests
        again. An automatic restart that is pending or under way is cancelled first. If
        every attempt fails, the model stays down and the last error is raised.
        """
        self._check_open()
        m = self.pool.get(model)
        pending = self._restarts.pop(model, None)
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        base = self.restart or Restart()
        plan = Restart(base.attempts if attempts is None else attempts, base.backoff if backoff is None else backoff,
                       base.max_backoff)
        if self.dispatcher.model(model).down is None:
            self._apply(self.dispatcher.model_down(model, EngineError(f"model {model!r} is restarting", model=model),
                                                   self.clock()))
        await self.pool.restart(m, plan)
        self._apply(self.dispatcher.model_up(model, self.clock()))
        log.info("fairagents.arbiter.model_restarted", model=model)

    def restarting(self, model: str) -> bool:
        """Whether an automatic restart of ``model`` is pending or under way."""
        task = self._restarts.get(model)
        return task is not None and not task.done()

    def restart_eta(self, model: str) -> float | None:
        """Seconds until a restarting ``model`` is likely back: the backoff plus its engine's last start time."""
        if not self.restarting(model) or self.restart is None:
            return None
        return self.restart.backoff + (self.pool.get(model).start_time or 0.0)

    async def _auto_restart(self, model: str, plan: Restart) -> None:
        """Bring a dead model back by :attr:`restart`; on giving up it stays down (logged)."""
        try:
            await asyncio.sleep(plan.backoff)
            await self.pool.restart(self.pool.models[model], plan)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.error("fairagents.arbiter.restart_failed", model=model, attempts=plan.attempts, error=repr(err))
        else:
            if self._started and not self._closing:
                self._apply(self.dispatcher.model_up(model, self.clock()))
                log.info("fairagents.arbiter.model_restarted", model=model, automatic=True)
        finally:
            if self._restarts.get(model) is asyncio.current_task():
                del self._restarts[model]

    async def __aenter__(self) -> Arbiter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- state -------------------------------------------------------------------

    @property
    def in_flight(self) -> int | None:
        """The in-flight limit of models added without their own (``None``: each engine's batch capacity)."""
        return self.pool.in_flight

    @property
    def token_budget(self) -> TokenBudget:
        """The token budget setting of models added without their own."""
        return self.pool.token_budget

    @property
    def policy(self) -> Policy:
        """The policy that orders waiting requests (fixed at construction)."""
        return self.dispatcher.policy

    def stats(self) -> Stats:
        """Per app and per agent: service, share vs weight, requests, wait and TTFT percentiles."""
        queued: dict[tuple[str, str], int] = defaultdict(int)
        running: dict[tuple[str, str], int] = defaultdict(int)
        for t in self.dispatcher.tickets():
            (running if t.dispatched is not None else queued)[t.request.agent_key] += 1
        return self.ledger.snapshot(
            {n: a.weight for n, a in self.tenants.apps.items()},
            {k: a.weight for k, a in self.tenants.agents.items()},
            queued,
            running,
        )

    def bound(self, max_request_tokens: int) -> float:
        """``U`` of the fairness guarantee under the current limits (:meth:`Dispatcher.bound`).

        ``max_request_tokens`` is the longest ``prompt + max_tokens`` a request takes; a
        model holds at most ``in_flight`` such requests, and at most its token budget.
        """
        return self.dispatcher.bound(max_request_tokens)

    @property
    def pool_running(self) -> int:
        """Requests handed to engines and not yet ended, across the pool (bounded by ``pool_in_flight`` if set)."""
        return self.dispatcher.pool_running

    def serving(self, model: str) -> bool:
        """Whether ``model`` takes requests now: its engine is healthy and it is not down or restarting."""
        state = self.dispatcher.models.get(model)
        return bool(self.engine(model).healthy) and (state is None or state.down is None)

    def queued(self, model: str | None = None) -> int:
        """Requests waiting for ``model`` (or any model), those held back by an app's share included."""
        return self.dispatcher.queued(model)

    def in_flight_limit(self, model: str) -> int:
        """The in-flight limit ``model`` runs under."""
        return self.pool.limit(self.pool.get(model))

    def token_budget_of(self, model: str) -> int | None:
        """The KV tokens ``model``'s running requests may reserve at once (``None``: no token budget).

        An ``"engine"`` budget is known once the engine has started.
        """
        return self.pool.budget(self.pool.get(model))

    # -- submitting ----------------------------------------------------------------

    def check_admission(self, model: str, agent: AgentHandle | Agent | str | None) -> None:
        """Raise what submitting a request of ``agent`` to ``model`` would raise now, before any work on it.

        The cheap checks, in the order a submission makes them: the arbiter runs, the
        model and the agent are known, the model is up, and the app's queue for the
        model has room. A caller that prepares a prompt first (the server) asks this
        before tokenizing, so a refused request costs nothing.

        Raises:
            ShutdownError, UnknownModelError, UnknownAppError, UnknownAgentError,
            EngineError (the model is down or starting), OverloadedError (the app's
            queue for the model is full).
        """
        self._admit(model, agent)

    def _admit(self, model: str, who: AgentHandle | Agent | str | None) -> tuple[PoolModel, Agent]:
        self._check_open()
        m = self.pool.get(model)
        agent = self.tenants.resolve(who)
        state = self.dispatcher.models.get(model)
        if state is None:
            raise EngineError(f"model {model!r} is starting", model=model, app=agent.app.name)
        if state.down is None and not m.engine.healthy:  # it died with nothing running: noticed now
            self._engine_died(model, EngineError(f"model {model!r}'s engine is dead", model=model))
        if state.down is not None:
            raise EngineError(f"model {model!r} is down: {state.down}", model=model, app=agent.app.name)
        bound = self.tenants.max_queued.get(agent.app.name)
        if bound is not None and self._waiting[(agent.app.name, model)] >= bound:
            raise OverloadedError(
                f"app {agent.app.name!r} has {bound} requests queued for model {model!r}, its bound; retry later",
                retry_after=min(max(m.run_time or 1.0, 0.05), 60.0), model=model, app=agent.app.name,
            )
        return m, agent

    def _submit(
        self,
        model: str,
        who: AgentHandle | Agent | str | None,
        params: GenerationParams,
        prepare: Callable[[Engine], Prompt],
        *,
        arrival: float | None = None,
    ) -> Call:
        m, agent = self._admit(model, who)
        waiting = (agent.app.name, model)
        prompt = prepare(m.engine)
        now = self.clock()
        request = Request(f"fa-{next(_request_ids)}", agent, model, prompt.n_tokens, params.max_tokens,
                          now if arrival is None else arrival)
        call = Call(request, prompt, dataclasses.replace(params, agent=agent), asyncio.get_running_loop().create_future())
        self._calls[request.id] = call
        self._waiting[waiting] += 1
        try:
            changes = self.dispatcher.arrive(request, now)  # typed errors (context, KV budget) change nothing
        except BaseException:
            del self._calls[request.id]  # if it was queued all the same, it is withdrawn at its turn
            if self.dispatcher.ticket(request.id) is None:
                self._waiting[waiting] -= 1
            raise
        call.ticket = self.dispatcher.ticket(request.id)
        self._apply(changes)
        return call

    def _check_open(self) -> None:
        if self._closing or not self._started:
            raise ShutdownError("the arbiter is not running: use 'async with arbiter:' or await arbiter.start()")

    def _engine_for_images(self, model: str) -> Engine:
        engine = self.pool.get(model).engine
        self._check_open()
        return engine

    # -- the dispatcher's events -------------------------------------------------------

    def _share_fair_counters(self, name: str, engine: Engine) -> None:
        """An engine that schedules fairly itself charges the pool's one set of in-engine counters."""
        if not schedules_fairly(engine) or name in self.pool.models:
            return
        theirs = getattr(engine, "fair_counters", None)
        if theirs is not None:  # started (or bound) elsewhere already: its counters are the pool's
            if self.fair_counters is None:
                self.fair_counters = theirs
            elif theirs is not self.fair_counters:
                raise InvalidParameterError(
                    f"model {name!r}'s engine already charges another arbiter's counters; the fair engines of "
                    "one arbiter must share one set", model=name)
            return
        if self.fair_counters is None:
            from fairagents.engines.fair_scheduler import FairCounters

            cost = self.cost
            self.fair_counters = FairCounters(d_base=getattr(cost, "d_base", None), w_input=cost.w_input,
                                              w_output=cost.w_output)
        engine.share_counters(self.fair_counters, name)  # type: ignore[attr-defined]

    def _new_dispatcher(self, policy: Policy) -> Dispatcher:
        return Dispatcher(policy, self.cost, pool_slots=self.pool_in_flight, charge=self._charge,
                          is_live=self._is_live, app_share=self._share_of, admission=self.admission,
                          gate=None if self._shared is None else self._shared.gate)

    def _shared_models(self) -> set[str]:
        """Models whose capacity other arbiters may draw on too (remote replicas)."""
        return {m.name for m in self.pool.models.values() if getattr(m.engine, "shared_capacity", False)}

    def _after_sync(self) -> None:
        """The pool's view changed (a sync, or the store lost): a held-back dispatch may go now."""
        if self._started and not self._closing:
            self._apply(self.dispatcher.refill(self.clock()))

    def _share_of(self, app: str) -> float | None:
        return self.tenants.share.get(app, self.max_in_flight_share)

    def _register(self, m: PoolModel) -> None:
        """Open a started model for requests, with its limits."""
        self.dispatcher.add_model(m.name, m.engine.profile, slots=self.pool.limit(m), token_budget=self.pool.budget(m),
                                  max_model_len=m.engine.max_model_len, block=self.pool.block(m))

    def _is_live(self, request_id: str) -> bool:
        call = self._calls.get(request_id)
        return call is not None and not call.dispatched.done()

    def _charge(self, now: float, request: Request, amount: float) -> None:
        self.ledger.charge(now, request.app, request.agent.name, amount)
        if self._shared is not None:
            self._shared.charge(request, amount)

    def _engine_of(self, call: Call) -> Engine:
        return self.pool.models[call.request.model].engine

    def _progress(self, call: Call, new_tokens: int) -> None:
        self.dispatcher.progress(call.request.id, new_tokens, self.clock())

    def _end(self, call: Call, outcome: Outcome) -> None:
        self._apply(self.dispatcher.end(call.request.id, outcome, self.clock()))

    def _fail_model(self, model: str, err: EngineError) -> None:
        """A request's stream failed: the model goes down only if its engine reports itself dead."""
        if self.pool.models[model].engine.healthy:
            log.warning("fairagents.arbiter.request_failed", model=model, error=str(err))
        else:
            self._engine_died(model, err)

    def _engine_died(self, model: str, err: EngineError) -> None:
        """Take ``model`` down (its waiting requests fail) and schedule its automatic restart."""
        if self.dispatcher.model(model).down is not None:
            return
        log.error("fairagents.arbiter.engine_failed", model=model, error=str(err), restart=self.restart)
        if self.restart is not None and not self._closing and model not in self._restarts:
            self._restarts[model] = asyncio.get_running_loop().create_task(self._auto_restart(model, self.restart))
        self._apply(self.dispatcher.model_down(model, err, self.clock()))

    def _apply(self, changes: Changes) -> None:
        """Carry out what a dispatcher event caused. Raises nothing: it runs on other requests' paths."""
        for t in changes.started:
            self._waiting[(t.request.app, t.request.model)] -= 1
            call = self._calls.get(t.request.id)
            if call is not None and not call.dispatched.done():
                call.dispatched.set_result(None)
        for t in changes.ended:
            self._ended(t)
        if not self._calls:
            self._idle.set()

    def _ended(self, t: Ticket) -> None:
        r = t.request
        if t.dispatched is None:
            self._waiting[(r.app, r.model)] -= 1
        call = self._calls.pop(r.id, None)
        if call is not None and not call.dispatched.done():
            call.dispatched.set_exception(t.error or ShutdownError("the request ended before it ran", request_id=r.id))
        m = self.pool.models[r.model]
        if t.outcome is Outcome.FINISHED and t.dispatched is not None and t.ended is not None:
            run = t.ended - t.dispatched
            m.run_time = run if m.run_time is None else 0.8 * m.run_time + 0.2 * run
        record = t.record()
        self.ledger.record(record)
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:  # a listener's bug must not leak into the request that ended
                log.exception("fairagents.arbiter.listener_failed", listener=repr(listener))

    async def _wait_idle(self, timeout: float) -> None:
        if self._calls:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)
