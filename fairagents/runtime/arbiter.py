"""The arbiter: fair access to a pool of models for the apps and agents that share it.

:class:`Arbiter` is composed of parts: :class:`~fairagents.runtime.inputs.Inputs` checks
a call and prepares its prompt, :class:`~fairagents.runtime.runner.Runner` hands it to the
:class:`~fairagents.dispatcher.Dispatcher` (which decides what runs) and streams the
engine's output, :class:`~fairagents.runtime.lifecycle.Lifecycle` starts, closes and
restarts engines. A call reads straight through: ``AgentHandle.chat`` →
:meth:`Arbiter.chat` → ``Inputs.chat`` → ``Runner.submit`` → ``Runner.collect`` → the engine.

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
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Unpack

from fairagents.admission import Statera, make_admission
from fairagents.dispatcher import Dispatcher
from fairagents.engines.base import Delta, Engine, Prompt, capabilities
from fairagents.engines.prompts import Messages
from fairagents.errors import InvalidParameterError
from fairagents.identity import SLO, check_run, current_run, run_scope
from fairagents.limits import DEFAULT_LIMITS, RequestLimits
from fairagents.policies import DEFAULT_POLICY, Policy, priced_policy
from fairagents.policies.pooled import PoolPolicy
from fairagents.records import RequestRecord
from fairagents.reply import ImageReply, Reply
from fairagents.runtime.handles import AgentHandle, AppHandle, Who
from fairagents.runtime.inputs import Inputs
from fairagents.runtime.lifecycle import Lifecycle
from fairagents.policies.devices import LOCAL, policy_factory
from fairagents.runtime.pool import DEFAULT_IN_FLIGHT, Pool, Restart, TokenBudget, check_limit, default_device
from fairagents.runtime.preprocessing import Preprocessor
from fairagents.runtime.runner import Runner
from fairagents.runtime.sampling import ChatArgs, SamplingArgs
from fairagents.runtime.tenants import Tenants, check_max_tokens, check_share
from fairagents.shared import SharedCounters, SharedView
from fairagents.stats import Ledger, Stats
from fairagents.tools import OutputSpec, check_output

__all__ = ["DEFAULT_IN_FLIGHT", "AgentHandle", "AppHandle", "Arbiter", "Restart"]


class Arbiter:
    """Fair access to a pool of models for the apps and agents that share it.

    Args:
        policy: a name (``"hmfs_credit"``, the default; ``"hmfs"``, ``"vtc"``, ...), ``"module:Class"`` for your own
            (:func:`~fairagents.policies.make_policy`), or an object; one that prices in unified
            tokens lends the arbiter its cost model.
        in_flight: per-model limit on requests handed to the engine at once (unset: the
            engine's ``max_num_seqs``, else :data:`DEFAULT_IN_FLIGHT`).
        token_budget: per-model limit on KV tokens reserved at once (``prompt + max_tokens``
            each): ``"engine"`` (its KV capacity), a number, or ``None`` (count requests only).
        pool_in_flight: limit on requests handed to engines at once across the pool, for models
            that share hardware (a free slot goes to the policy's choice among them).
        max_in_flight_share: the largest share (0, 1] of a model's slots and token budget one
            app may hold at once, for apps declared without their own.
        default_max_tokens: ``max_tokens`` of a call that sets none (:meth:`default_max_tokens`).
        admission: ``"statera"`` reserves a conformal bound on each request's output and steers
            the limits from measured occupancy (H-MAS Alg. 2; :mod:`fairagents.admission`).
        counters: share the fairness counters with other arbiters: a ``redis://`` URL or a
            :class:`~fairagents.shared.SharedCounters` (``hmfs`` only).
        restart: how a model whose engine died is brought back (``None``: left down).
        drain_timeout: seconds ``async with`` exit waits for accepted work before aborting it.
        d_base, w_input, w_output, w_cached: the unified-token cost (defaults 4096, 1, 2, 0.1;
            ``w_cached`` prices prompt tokens an in-process vLLM engine reads from its prefix cache).
        preprocess_workers, preprocess_queue, preprocess_queue_per_app, preprocess_inline: the
            preprocessing pools of images and text (:mod:`fairagents.runtime.preprocessing`).
        limits: bounds on a request's shape (:class:`~fairagents.limits.RequestLimits`).
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
        policy: str | Policy = DEFAULT_POLICY,
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
        w_cached: float | None = None,
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
        given = policy
        policy, self.cost = priced_policy(policy, d_base=d_base, w_input=w_input, w_output=w_output,
                                         w_cached=w_cached)
        self.max_in_flight_share = max_in_flight_share
        self.pool_in_flight = pool_in_flight
        self.admission = make_admission(admission)
        self.limits = limits or DEFAULT_LIMITS
        self.pool = Pool(in_flight=in_flight, token_budget=token_budget,
                         policy=PoolPolicy(policy, self.cost, clock=clock),
                         make_policy=policy_factory(given, policy, self.cost))
        self.tenants = Tenants()
        self.counters: SharedCounters | None = None
        """The counters shared with other arbiters, if any (``counters=``)."""
        shared = None
        if counters is not None:
            self.counters = counters if isinstance(counters, SharedCounters) else SharedCounters(counters)
            shared = SharedView(self.counters.door, policy)
        self.preprocessor = Preprocessor(preprocess_workers, preprocess_queue, inline=preprocess_inline,
                                         max_pending_per_app=preprocess_queue_per_app, name="fairagents-images")
        self.text_preprocessor = Preprocessor(preprocess_workers, preprocess_queue,
                                              max_pending_per_app=preprocess_queue_per_app, name="fairagents-text")
        if shared is not None:
            shared.lock = self.pool.policy.lock  # type: ignore[union-attr]
        assert self.pool.devices is not None  # an arbiter's pool always has a policy
        self.runner = Runner(self.pool.devices, self.cost, pool=self.pool, tenants=self.tenants, ledger=Ledger(clock=clock),
                             clock=clock, pool_slots=pool_in_flight, app_share=self._share_of,
                             admission=self.admission, shared=shared)
        """Hands requests to the dispatcher and streams their engines' output."""
        self.inputs = Inputs(self.runner, images=self.preprocessor, text=self.text_preprocessor, limits=self.limits,
                             default_max_tokens=default_max_tokens)
        """Checks calls and prepares their prompts."""
        self.lifecycle = Lifecycle(self.pool, self.runner, restart=restart, drain_timeout=drain_timeout,
                                   preprocessors=(self.preprocessor, self.text_preprocessor), counters=self.counters,
                                   shared=shared)
        """Starts, closes and restarts the engines; what a :class:`~fairagents.Portal` waits on."""

    # -- declaring the pool and the tenants ------------------------------------

    def add_model(
        self, name: str, engine: Engine, *, in_flight: int | None = None, token_budget: TokenBudget | bool = False,
        device: str | None = None,
    ) -> None:
        """Add a model to the pool, served by ``engine`` (started with the arbiter).

        ``in_flight`` and ``token_budget`` override the arbiter's for this model
        (``token_budget=False``: the arbiter's). ``device`` names the capacity its engine
        shares with other models' (:mod:`fairagents.policies.devices`): models of one device
        are served in one order, with one set of counters, and separate devices keep
        separate shares. Unset: in-process models share ``"local"``, a remote model is a
        device of its own (with ``counters=``, every model is on ``"local"``). A running
        arbiter refuses: ``await`` :meth:`start_model` instead.
        """
        if self.lifecycle.started:
            raise InvalidParameterError(
                f"the arbiter is running: add model {name!r} with 'await arbiter.start_model(...)'", model=name
            )
        device = self._device(name, engine, device)
        self.pool.share_policy(name, engine, in_flight, device)
        self.pool.add(name, engine, in_flight=in_flight, token_budget=token_budget, device=device)

    async def start_model(
        self, name: str, engine: Engine, *, in_flight: int | None = None, token_budget: TokenBudget | bool = False,
        device: str | None = None,
    ) -> None:
        """Add a model to a running arbiter: start its engine, then open it for requests (arguments as :meth:`add_model`)."""
        device = self._device(name, engine, device)
        self.pool.share_policy(name, engine, in_flight, device)
        self.lifecycle.register(await self.pool.add_started(name, engine, in_flight=in_flight,
                                                            token_budget=token_budget, device=device))
        if self.runner.shared is not None:
            self.runner.shared.bind(self.dispatcher, self.lifecycle.shared_models())

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

    def forget_agent(self, app: str, agent: str) -> bool:
        """Undeclare an agent that never had a request queued, running or accounted; whether it was forgotten.

        An agent with any history (a request waiting or running, service charged, a
        request ended) is kept: the fair-share counters and the ledger read it.
        """
        return not self.runner.knows(app, agent) and self.tenants.forget_agent((app, agent))

    def forget_app(self, name: str) -> bool:
        """Undeclare an app none of whose agents is declared (see :meth:`forget_agent`); whether it was forgotten."""
        return self.tenants.forget_app(name)

    @contextlib.contextmanager
    def run(self, name: str | None = None) -> Iterator[str]:
        """Make the calls inside one run of a workflow (:func:`~fairagents.run_scope`); yields its id.

        The run ends with the scope (a scope nested in another run joins it and ends
        nothing), so :meth:`stats` counts its duration, calls and service.

        Examples:
            >>> import fairagents as fa
            >>> arbiter = fa.Arbiter()
            >>> with arbiter.run("digest-1") as run:
            ...     run, fa.current_run()
            ('digest-1', 'digest-1')
        """
        outer = current_run()
        with run_scope(name) as bound:
            try:
                yield bound
            finally:
                if bound != outer:  # on the arbiter's loop: the scope may close on a portal's thread
                    self.lifecycle.on_loop(self.ledger.end_run, bound, self.clock())

    def add_listener(self, listener: Callable[[RequestRecord], None]) -> None:
        """Call ``listener`` with the record of every request as it ends (metrics exporters).

        It runs synchronously in the event loop: keep it quick. An exception it raises
        is logged and does not reach any request.
        """
        self.runner.listeners.append(listener)

    # -- calls ----------------------------------------------------------------------

    async def chat(self, model: str, messages: Messages | Prompt, *, agent: Who = None, arrival: float | None = None,
                   run: str | None = None, **sampling: Unpack[ChatArgs]) -> Reply:
        """Send a chat request as ``agent`` (or the agent bound in context) and wait for the reply.

        ``agent`` is a handle (``arbiter.app("a").agent("x")``), an :class:`~fairagents.Agent`,
        or a declared agent's name (``"a/x"``, or ``"x"`` when one app declares an ``x``); ``run``
        the run the call belongs to (default: the one bound by :meth:`run`, else its own).
        ``sampling`` are OpenAI's (:class:`~fairagents.runtime.sampling.ChatArgs`); tool calls
        come back in :attr:`Reply.tool_calls`. ``max_tokens`` left unset is reserved to the
        end of the context (:meth:`default_max_tokens`), so give a bound when you know one.
        Image parts (:mod:`fairagents.images`) are prepared in the preprocessing pool;
        ``messages`` may also be a :class:`~fairagents.engines.Prompt` from
        :meth:`prepare_chat`, with the ``arrival`` time of the call (default: now).

        Raises:
            BadInputError: an unknown model, app or agent; invalid messages or parameters; a
                prompt longer than the context; a bad image, or an image for a model that
                takes none: nothing was charged or queued.
            EngineError: the model's engine failed.
            OverloadedError: the app's queue, or the preprocessing queue, is full.
            ShutdownError: the arbiter closed before the request finished.
        """
        call = await self.inputs.chat(model, agent, messages, arrival, sampling, _run(run))
        return await self.runner.collect(call)

    async def stream_chat(self, model: str, messages: Messages | Prompt, *, agent: Who = None,
                          arrival: float | None = None, run: str | None = None,
                          **sampling: Unpack[ChatArgs]) -> AsyncIterator[Delta]:
        """Like :meth:`chat`, yielding each :class:`~fairagents.engines.Delta` as it is generated.

        With tools, a delta's ``tool_calls`` are pieces of the model's calls. Bad input raises
        at the first ``__anext__``; stopping early cancels the request (charged for what it produced).
        """
        call = await self.inputs.chat(model, agent, messages, arrival, sampling, _run(run))
        async with contextlib.aclosing(self.runner.stream(call)) as deltas:
            async for delta in deltas:
                yield delta

    async def complete(self, model: str, prompt: str | Prompt, *, agent: Who = None, arrival: float | None = None,
                       run: str | None = None, **sampling: Unpack[SamplingArgs]) -> Reply:
        """Like :meth:`chat` for a plain prompt (text or a ready :class:`~fairagents.engines.Prompt`), no template."""
        call = await self.inputs.complete(model, agent, prompt, arrival, sampling, _run(run))
        return await self.runner.collect(call)

    async def stream_complete(self, model: str, prompt: str | Prompt, *, agent: Who = None,
                              arrival: float | None = None, run: str | None = None,
                              **sampling: Unpack[SamplingArgs]) -> AsyncIterator[Delta]:
        """:meth:`complete`, yielding each :class:`~fairagents.engines.Delta` as :meth:`stream_chat` does."""
        call = await self.inputs.complete(model, agent, prompt, arrival, sampling, _run(run))
        async with contextlib.aclosing(self.runner.stream(call)) as deltas:
            async for delta in deltas:
                yield delta

    async def generate_image(self, model: str, prompt: str, *, agent: Who = None, size: tuple[int, int] | None = None,
                             steps: int | None = None, n: int = 1, guidance: float | None = None,
                             seed: int | None = None, run: str | None = None) -> ImageReply:
        """Make ``n`` images of ``size`` (width, height) from ``prompt`` on an image model, as ``agent``.

        ``size`` and ``steps`` default to the model's own. The request is charged the
        denoiser's latent tokens (patches × steps × ``n``) step by step. Raises as
        :meth:`chat`, and :class:`~fairagents.errors.ModalityError` for a model that makes no images.
        """
        return await self.runner.collect_images(
            self.inputs.image(model, agent, prompt, size=size, steps=steps, n=n, guidance=guidance, seed=seed,
                              run=_run(run)))

    async def prepare_chat(self, model: str, messages: Messages, *, agent: Who = None,
                           tools: Sequence[dict[str, Any]] | None = None) -> Prompt:
        """``messages`` made ready for ``model`` off the event loop: templated, tokenized, images decoded.

        For callers that need the prompt before sending it (its length): call
        :meth:`check_admission` first, so a refused request costs no preparation, then send
        the prompt with :meth:`chat` or :meth:`complete`, passing ``arrival``. The work runs
        in the preprocessing pools (text never waits behind images), fairly by ``agent``'s app.
        """
        return await self.inputs.prepare_chat(model, messages, agent, tools)

    async def prepare_text(self, model: str, prompt: str | Prompt, *, agent: Who = None) -> Prompt:
        """A plain prompt tokenized for ``model`` (a ready :class:`Prompt` checked), as :meth:`prepare_chat`."""
        return await self.inputs.prepare_text(model, prompt, agent)

    def default_max_tokens(self, model: str, prompt_tokens: int, *, app: str | None = None) -> int:
        """``max_tokens`` of a call that sets none: the default of its ``app``, else the arbiter's, else the context.

        The one rule of every call and of the server. Either way it is clipped to what fits
        the context and the model's token budget (in whole KV blocks); a prompt that leaves
        no room gets 1, which the context check then refuses.

        Examples:
            >>> import fairagents as fa
            >>> from fairagents.testing import FakeEngine
            >>> arbiter = fa.Arbiter(token_budget=600, default_max_tokens=256)
            >>> arbiter.add_model("chat", FakeEngine(max_model_len=1024))
            >>> _ = arbiter.app("essays", default_max_tokens=2000)
            >>> arbiter.default_max_tokens("chat", 100), arbiter.default_max_tokens("chat", 100, app="essays")
            (256, 500)
        """
        return self.inputs.default_max_tokens(model, prompt_tokens, app)

    def check_admission(self, model: str, agent: Who, *, output: OutputSpec | None = None) -> None:
        """Raise what submitting a request of ``agent`` to ``model`` would raise now, before any work on it.

        That is: the arbiter is not running, the model, app or agent is unknown, the model
        is down or starting (:class:`~fairagents.EngineError`), the app's queue for it is
        full (:class:`~fairagents.OverloadedError`), or the model cannot serve the call's
        ``output`` (tools, a format: :func:`~fairagents.tools.check_output`). A prompt
        prepared after it is queued without a second check.
        """
        m, _ = self.runner.admit(model, agent)
        if output is not None:
            check_output(capabilities(m.engine), output, model)

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Start every engine (in parallel) and open for requests.

        If an engine fails to start, or the start is cancelled, every engine is stopped again
        and the failure raised. A second call while a start is under way waits for it (from
        another event loop it raises :class:`~fairagents.errors.ProtocolError`: use a portal).
        """
        await self.lifecycle.start()

    async def close(self, timeout: float | None = None, *, stop_engines: bool = True,
                    abort_timeout: float = 5.0) -> None:
        """Stop admitting, let accepted work finish for ``timeout`` s, abort the rest, stop engines.

        Aborted requests end with :class:`~fairagents.ShutdownError` within ``abort_timeout``
        s. With ``stop_engines=False`` the engines keep running, for another arbiter to use.
        """
        await self.lifecycle.close(timeout, stop_engines=stop_engines, abort_timeout=abort_timeout)

    async def __aenter__(self) -> Arbiter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def restart_model(self, model: str, *, attempts: int | None = None, backoff: float | None = None) -> None:
        """Restart ``model``'s engine now and open it for requests again (after it died, or by choice).

        Its queued requests fail with :class:`~fairagents.EngineError`; the engine is stopped
        and started up to ``attempts`` times, ``backoff`` seconds apart and doubling (defaults:
        :attr:`restart`). If every attempt fails, the model stays down and the error is raised.
        """
        await self.lifecycle.restart_model(model, attempts, backoff)

    def restarting(self, model: str) -> bool:
        """Whether an automatic restart of ``model`` is pending or under way."""
        return self.lifecycle.restarting(model)

    def restart_eta(self, model: str) -> float | None:
        """Seconds until a restarting ``model`` is likely back: the backoff plus its engine's last start time."""
        return self.lifecycle.restart_eta(model)

    # -- state -------------------------------------------------------------------

    @property
    def clock(self) -> Callable[[], float]:
        """The time source, in seconds: arrivals, waits and run durations are read from it."""
        return self.runner.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.runner.clock = self.runner.ledger.runs.clock = clock
        for seat in self.pool.devices or ():
            seat.clock = clock

    @property
    def ledger(self) -> Ledger:
        """The accounts: every request's record and every charge (:meth:`stats` reads it)."""
        return self.runner.ledger

    @property
    def pool_policy(self) -> PoolPolicy:
        """The policy's seat in the pool, which engines that schedule by it share (``scheduler="fair"``).

        Its :attr:`~fairagents.policies.pooled.PoolPolicy.tallies` hold each such
        engine's preemptions and recompute tax.
        """
        assert self.pool.policy is not None  # an arbiter's pool always has one
        return self.pool.policy

    @property
    def restart(self) -> Restart | None:
        """How a model whose engine died is brought back (``None``: left down)."""
        return self.lifecycle.restart

    @restart.setter
    def restart(self, plan: Restart | None) -> None:
        self.lifecycle.restart = plan

    @property
    def drain_timeout(self) -> float:
        """Seconds ``async with`` exit waits for accepted work before aborting the rest."""
        return self.lifecycle.drain_timeout

    @drain_timeout.setter
    def drain_timeout(self, seconds: float) -> None:
        self.lifecycle.drain_timeout = seconds

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the arbiter last started on (``None`` before); other loops call through a Portal."""
        return self.lifecycle.loop

    @property
    def dispatcher(self) -> Dispatcher:
        """The dispatcher of the current run (a new one after each close)."""
        return self.runner.dispatcher

    @property
    def policy(self) -> Policy:
        """The policy that orders waiting requests (fixed at construction), on the pool's first device.

        Each further device has a policy of its own, made alike (:meth:`policy_of`).
        """
        return self.pool_policy.policy

    def policy_of(self, model: str) -> Policy:
        """The policy of ``model``'s device: its counters are that device's."""
        return self.pool_policy_of(model).policy

    def pool_policy_of(self, model: str) -> PoolPolicy:
        """The policy's seat on ``model``'s device (:attr:`pool_policy` for the first device)."""
        self.pool.get(model)  # an unknown model: UnknownModelError
        seat = self.pool.seat(model)
        assert seat is not None  # an arbiter's pool always has a policy
        return seat

    @property
    def devices(self) -> dict[str, list[str]]:
        """The pool's devices, each with its models (:mod:`fairagents.policies.devices`)."""
        layout: dict[str, list[str]] = {}
        for m in self.pool.models.values():
            layout.setdefault(m.device, []).append(m.name)
        return layout

    @property
    def models(self) -> list[str]:
        """Names of the models in the pool."""
        return list(self.pool.models)

    def engine(self, model: str) -> Engine:
        """The engine serving ``model``."""
        return self.pool.get(model).engine

    @property
    def in_flight(self) -> int | None:
        """The in-flight limit of models added without their own (``None``: each engine's batch capacity)."""
        return self.pool.in_flight

    @property
    def token_budget(self) -> TokenBudget:
        """The token budget setting of models added without their own."""
        return self.pool.token_budget

    def stats(self) -> Stats:
        """Per app and per agent: service, share vs weight, requests, wait and TTFT percentiles."""
        return self.runner.stats()

    def bound(self, max_request_tokens: int) -> float:
        """``U`` of the fairness guarantee under the current limits, for requests of at most
        ``max_request_tokens`` (``prompt + max_tokens``; :meth:`Dispatcher.bound`)."""
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
        """The KV tokens ``model``'s running requests may reserve at once (``None``: no budget)."""
        return self.pool.budget(self.pool.get(model))

    # -- internals ------------------------------------------------------------------

    def _device(self, name: str, engine: Engine, device: str | None) -> str:
        """``device`` if given, else the model's default; with shared counters, the pool's one device."""
        if self.counters is None:
            return default_device(name, engine) if device is None else device
        if device not in (None, LOCAL):
            raise InvalidParameterError(
                f"model {name!r}: counters shared with other arbiters are one device's ('local'), not {device!r}",
                model=name)
        return LOCAL

    def _share_of(self, app: str) -> float | None:
        return self.tenants.share.get(app, self.max_in_flight_share)


def _run(run: str | None) -> str | None:
    """A call's run: ``run`` (checked), else the one bound in context, else none (a run of its own)."""
    return current_run() if run is None else check_run(run)
