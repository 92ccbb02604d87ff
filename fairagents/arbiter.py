"""The arbiter: holds the backlog, and hands each model only what it can batch now.

Every call carries an app and agent identity. The arbiter validates it, prepares the
prompt, queues the request with the policy, and dispatches whenever a model has
room under its in-flight limit: the engine's own (FCFS) queue stays short, so the
order stays with the policy. Input is charged at dispatch and output per streamed
chunk, in unified tokens.

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
import enum
import itertools
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from fairagents.constants import DEFAULT_D_BASE
from fairagents.cost import UnifiedTokenCost, service_bound
from fairagents.engines.base import Delta, Engine, GenerationParams, Prompt
from fairagents.errors import (
    ContextLengthError,
    EngineError,
    FairAgentsError,
    InvalidParameterError,
    ModalityError,
    OverloadedError,
    ShutdownError,
    UnknownAgentError,
    UnknownAppError,
    UnknownModelError,
)
from fairagents.identity import SLO, Agent, App, Modality, current_agent
from fairagents.images import has_images, to_png
from fairagents.metrics import RequestRecord
from fairagents.policies import Policy, make_policy
from fairagents.preprocessing import Preprocessor
from fairagents.reply import ImageReply, Reply, Timing, Usage
from fairagents.request import Outcome, Request
from fairagents.stats import Ledger, Stats

__all__ = ["DEFAULT_IN_FLIGHT", "AgentHandle", "AppHandle", "Arbiter"]

log = structlog.get_logger("fairagents.arbiter")

#: Requests a model runs at once when neither the call nor the engine says (``fairagents bench overhead``).
DEFAULT_IN_FLIGHT = 32

Messages = Sequence[dict[str, Any]]

# Request ids are unique across every arbiter in the process: arbiters may share an engine,
# and vLLM merges requests of the same id (an abort meant for one would end the other).
_request_ids = itertools.count(1)


class _State(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"


@dataclass(eq=False)
class _Ticket:
    request: Request
    prompt: Prompt
    params: GenerationParams
    dispatched: asyncio.Future[None]
    state: _State = _State.WAITING
    dispatch_time: float | None = None
    first_token: float | None = None
    produced: int = 0
    charged: float = 0.0
    shutdown: bool = False


@dataclass(eq=False)
class _Model:
    name: str
    engine: Engine
    limit: int | None
    running: int = 0
    failure: EngineError | None = None
    tickets: set[_Ticket] = field(default_factory=set)
    run_time: float | None = None
    """Moving average of dispatch-to-finish seconds: the retry hint of an overloaded app."""


class AgentHandle:
    """An agent declared on an arbiter; makes calls as itself.

    Examples:
        >>> import fairagents as fa
        >>> planner = fa.Arbiter().app("driving").agent("planner", weight=2.0)
        >>> planner.identity.key, planner.identity.weight
        (('driving', 'planner'), 2.0)
    """

    def __init__(self, arbiter: Arbiter, identity: Agent) -> None:
        self._arbiter = arbiter
        self.identity = identity

    def __repr__(self) -> str:
        return f"AgentHandle({self.identity.app.name}/{self.identity.name})"

    async def chat(self, model: str, messages: Messages, **params: Any) -> Reply:
        """:meth:`Arbiter.chat` as this agent."""
        return await self._arbiter.chat(model, messages, agent=self, **params)

    def stream_chat(self, model: str, messages: Messages, **params: Any) -> AsyncIterator[Delta]:
        """:meth:`Arbiter.stream_chat` as this agent."""
        return self._arbiter.stream_chat(model, messages, agent=self, **params)

    async def complete(self, model: str, prompt: str | Prompt, **params: Any) -> Reply:
        """:meth:`Arbiter.complete` as this agent."""
        return await self._arbiter.complete(model, prompt, agent=self, **params)

    def stream_complete(self, model: str, prompt: str | Prompt, **params: Any) -> AsyncIterator[Delta]:
        """:meth:`Arbiter.stream_complete` as this agent."""
        return self._arbiter.stream_complete(model, prompt, agent=self, **params)

    async def generate_image(self, model: str, prompt: str, **params: Any) -> ImageReply:
        """:meth:`Arbiter.generate_image` as this agent."""
        return await self._arbiter.generate_image(model, prompt, agent=self, **params)


class AppHandle:
    """An app declared on an arbiter; declares its agents.

    Examples:
        >>> import fairagents as fa
        >>> studio = fa.Arbiter().app("studio", weight=3.0)
        >>> studio.identity.weight, studio.agent("writer").identity.app is studio.identity
        (3.0, True)
    """

    def __init__(self, arbiter: Arbiter, identity: App) -> None:
        self._arbiter = arbiter
        self.identity = identity

    def __repr__(self) -> str:
        return f"AppHandle({self.identity.name})"

    def agent(self, name: str, weight: float = 1.0, slo: SLO | None = None) -> AgentHandle:
        """Declare (or get) an agent of this app."""
        return self._arbiter._declare_agent(self.identity, name, weight, slo)


class Arbiter:
    """Fair access to a pool of models for the apps and agents that share it.

    Args:
        policy: a policy name (``"hmfs"``, ``"vtc"``, ``"rr"``, ``"fcfs"``) or object.
        in_flight: per-model limit on requests handed to the engine at once, for models
            added without their own. Unset, each model takes its engine's batch capacity
            (``max_num_seqs``) when the engine has one, else :data:`DEFAULT_IN_FLIGHT`:
            lower wastes throughput, higher only moves the queue into the engine's FCFS
            order (``fairagents bench overhead`` measures both ends).
        pool_in_flight: limit on requests handed to engines at once across the whole
            pool, for models that share hardware (colocated on one GPU, or CPU cores).
            Set, apps compete for the pool's capacity rather than each model's: a free
            slot goes to the policy's choice among every model with room
            (:meth:`~fairagents.policies.Policy.select_among`), so under ``hmfs`` an app
            on an expensive model takes fewer slots than one on a cheap model, in
            proportion to unified tokens. Unset (the default), models are scheduled
            independently, each up to its own limit.
        d_base: ``d_base`` of unified tokens.
        w_input: weight of a prompt token in service.
        w_output: weight of a generated token in service.
        drain_timeout: seconds ``async with`` exit waits for accepted work before
            aborting the rest with :class:`~fairagents.ShutdownError`.
        preprocess_workers: threads that prepare requests carrying images (decode,
            resize, tokenize), off the event loop (:mod:`fairagents.preprocessing`).
        preprocess_queue: most such requests in preprocessing at once; one more raises
            :class:`~fairagents.errors.OverloadedError`.
        preprocess_inline: prepare image requests on the event loop instead (only to
            measure what the pool saves: ``fairagents bench modality``).
        clock: time source in seconds (injectable for tests).

    Examples:
        >>> import fairagents as fa
        >>> fa.Arbiter(policy="vtc").policy.name
        'vtc'
    """

    def __init__(
        self,
        policy: str | Policy = "hmfs",
        *,
        in_flight: int | None = None,
        pool_in_flight: int | None = None,
        d_base: int = DEFAULT_D_BASE,
        w_input: float = 1.0,
        w_output: float = 2.0,
        drain_timeout: float = 30.0,
        preprocess_workers: int = 2,
        preprocess_queue: int = 256,
        preprocess_inline: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for limit in (in_flight, pool_in_flight):
            if limit is not None:
                _check_limit(limit)
        self.cost = UnifiedTokenCost(d_base=d_base, w_input=w_input, w_output=w_output)
        self.policy = make_policy(policy, self.cost)
        self.in_flight = in_flight
        self.pool_in_flight = pool_in_flight
        self.drain_timeout = drain_timeout
        self.preprocessor = Preprocessor(preprocess_workers, preprocess_queue, inline=preprocess_inline)
        self.clock = clock
        self.ledger = Ledger()
        self._models: dict[str, _Model] = {}
        self._apps: dict[str, App] = {}
        self._agents: dict[tuple[str, str], Agent] = {}
        self._tickets: dict[str, _Ticket] = {}
        self._max_queued: dict[str, int] = {}
        self._waiting: dict[tuple[str, str], int] = defaultdict(int)  # (app, model) -> requests queued
        self._listeners: list[Callable[[RequestRecord], None]] = []
        self._pool_running = 0
        self._started = False
        self._closing = False
        self._idle = asyncio.Event()

    # -- declaring the pool and the tenants ------------------------------------

    def add_model(self, name: str, engine: Engine, *, in_flight: int | None = None) -> None:
        """Add a model to the pool, served by ``engine`` (started with the arbiter)."""
        if not isinstance(name, str) or not name:
            raise InvalidParameterError(f"model name must be a non-empty string, got {name!r}")
        if name in self._models:
            raise InvalidParameterError(f"model {name!r} is already in the pool")
        if in_flight is not None:
            _check_limit(in_flight)
        self._models[name] = _Model(name, engine, in_flight)
        if self._started:
            self.cost.register(name, engine.profile)

    def app(self, name: str, weight: float = 1.0, slo: SLO | None = None, *, max_queued: int | None = None) -> AppHandle:
        """Declare (or get) an app; re-declaring with other settings is an error.

        ``max_queued`` bounds the app's requests waiting for one model: a call past it
        raises :class:`~fairagents.errors.OverloadedError` at once instead of queueing
        (``None``: unbounded).
        """
        new = App(name, weight=weight, slo=slo)
        if max_queued is not None and (isinstance(max_queued, bool) or not isinstance(max_queued, int) or max_queued < 1):
            raise InvalidParameterError(f"max_queued must be an integer ≥ 1 or None, got {max_queued!r}")
        existing = self._apps.get(name)
        if existing is not None and (existing != new or self._max_queued.get(name) != max_queued):
            raise InvalidParameterError(
                f"app {name!r} is already declared as {existing} with max_queued={self._max_queued.get(name)}"
            )
        self._apps[name] = existing or new
        if max_queued is not None:
            self._max_queued[name] = max_queued
        return AppHandle(self, self._apps[name])

    def _declare_agent(self, app: App, name: str, weight: float, slo: SLO | None) -> AgentHandle:
        new = Agent(name, app, weight=weight, slo=slo)
        existing = self._agents.get(new.key)
        if existing is not None and existing != new:
            raise InvalidParameterError(f"agent {name!r} of app {app.name!r} is already declared as {existing}")
        self._agents[new.key] = existing or new
        return AgentHandle(self, self._agents[new.key])

    @property
    def models(self) -> list[str]:
        """Names of the models in the pool."""
        return list(self._models)

    def engine(self, model: str) -> Engine:
        """The engine serving ``model``."""
        return self._model(model).engine

    def add_listener(self, listener: Callable[[RequestRecord], None]) -> None:
        """Call ``listener`` with the record of every request as it ends (metrics exporters).

        It runs synchronously in the event loop: keep it quick. An exception it raises
        is logged and does not reach the request.
        """
        self._listeners.append(listener)

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Start every engine (in parallel) and open for requests."""
        if self._started:
            return
        await asyncio.gather(*(m.engine.start() for m in self._models.values()))
        for m in self._models.values():
            self.cost.register(m.name, m.engine.profile)
        self._started = True
        self._closing = False
        log.info("fairagents.arbiter.started", models=self.models, policy=self.policy.name)

    async def close(self, timeout: float | None = None, *, stop_engines: bool = True) -> None:
        """Stop admitting, let accepted work finish for ``timeout`` s, abort the rest, stop engines.

        With ``stop_engines=False`` the engines keep running, for another arbiter to use.
        """
        if not self._started:
            return
        self._closing = True
        timeout = self.drain_timeout if timeout is None else timeout
        if self._tickets:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)
        if self._tickets:
            log.warning("fairagents.arbiter.drain_timeout", aborted=len(self._tickets))
            for ticket in list(self._tickets.values()):
                ticket.shutdown = True
                if ticket.state is _State.WAITING and not ticket.dispatched.done():
                    ticket.dispatched.set_exception(ShutdownError("the arbiter shut down before the request ran"))
                elif ticket.state is _State.RUNNING:
                    await self._models[ticket.request.model].engine.abort(ticket.request.id)
            with contextlib.suppress(TimeoutError):
                self._idle.clear()
                await asyncio.wait_for(self._idle.wait(), 5.0) if self._tickets else None
        self.preprocessor.close()
        if stop_engines:
            await asyncio.gather(*(m.engine.stop() for m in self._models.values()), return_exceptions=True)
        self._started = False
        log.info("fairagents.arbiter.closed")

    async def __aenter__(self) -> Arbiter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- calls ---------------------------------------------------------------------

    async def chat(
        self,
        model: str,
        messages: Messages,
        *,
        agent: AgentHandle | Agent | None = None,
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
    ) -> Reply:
        """Send a chat request as ``agent`` (or the agent bound in context) and wait for the reply.

        A message's content may be a list of text and image parts for a vision model
        (:mod:`fairagents.images` lists the shapes: OpenAI ``image_url`` parts with data
        URLs, file paths, PIL images). Such a request is prepared in the preprocessing
        pool and queued with the time it arrived; its image tokens count in its prompt.

        Raises:
            BadInputError: bad input (an unknown model, app or agent; invalid messages or
                parameters; a prompt longer than the context; an unreadable, unsupported or
                too large image, or an image for a model that takes none): nothing was
                charged or queued.
            EngineError: the model's engine failed.
            OverloadedError: the app's queue, or the preprocessing queue, is full.
            ShutdownError: the arbiter closed before the request finished.
        """
        params = GenerationParams(max_tokens, temperature, top_p, seed, tuple(stop), ignore_eos)
        return await self._collect(await self._chat_ticket(model, agent, params, messages))

    async def stream_chat(
        self,
        model: str,
        messages: Messages,
        *,
        agent: AgentHandle | Agent | None = None,
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
    ) -> AsyncIterator[Delta]:
        """Like :meth:`chat`, yielding each :class:`~fairagents.engines.Delta` as it is generated.

        Bad input raises at the first ``__anext__``; stopping iteration early cancels
        the request (it is charged only for what it produced).
        """
        params = GenerationParams(max_tokens, temperature, top_p, seed, tuple(stop), ignore_eos)
        ticket = await self._chat_ticket(model, agent, params, messages)
        async with contextlib.aclosing(self._run(ticket)) as run:
            async for delta in run:
                yield delta

    async def complete(
        self,
        model: str,
        prompt: str | Prompt,
        *,
        agent: AgentHandle | Agent | None = None,
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        arrival: float | None = None,
    ) -> Reply:
        """Like :meth:`chat` for a plain prompt, which the model continues (no chat template).

        ``prompt`` is text, tokenized by the model's engine (``prepare_text``), or a
        ready :class:`~fairagents.engines.Prompt` (token ids, or :meth:`prepare_chat`'s
        when the caller needs the prompt's length before sending). ``arrival`` (on
        :attr:`clock`) keeps the time the call came in, before the caller prepared its
        prompt, as its place in the queue. Raises as :meth:`chat`.
        """
        params = GenerationParams(max_tokens, temperature, top_p, seed, tuple(stop), ignore_eos)
        return await self._collect(self._submit(model, agent, params, _text_input(prompt), arrival=arrival))

    async def stream_complete(
        self,
        model: str,
        prompt: str | Prompt,
        *,
        agent: AgentHandle | Agent | None = None,
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        arrival: float | None = None,
    ) -> AsyncIterator[Delta]:
        """:meth:`complete`, yielding each :class:`~fairagents.engines.Delta` as :meth:`stream_chat` does."""
        params = GenerationParams(max_tokens, temperature, top_p, seed, tuple(stop), ignore_eos)
        ticket = self._submit(model, agent, params, _text_input(prompt), arrival=arrival)
        async with contextlib.aclosing(self._run(ticket)) as run:
            async for delta in run:
                yield delta

    async def generate_image(
        self,
        model: str,
        prompt: str,
        *,
        agent: AgentHandle | Agent | None = None,
        size: tuple[int, int] | None = None,
        steps: int | None = None,
        n: int = 1,
        guidance: float | None = None,
        seed: int | None = None,
    ) -> ImageReply:
        """Make ``n`` images of ``size`` (width, height) from ``prompt`` on an image model, as ``agent``.

        ``size`` and ``steps`` default to the model's own. The request is charged in
        unified tokens of the denoiser's latent tokens (latent patches × steps × ``n``),
        step by step as the denoiser runs; ``reply.usage.completion_tokens`` counts them.

        Raises:
            BadInputError: as :meth:`chat`, and a size, ``steps`` or ``n`` the model cannot
                make (:class:`~fairagents.InvalidParameterError`), or a model that makes no
                images (:class:`~fairagents.errors.ModalityError`).
            EngineError: the model's engine failed.
            ShutdownError: the arbiter closed before the request finished.
        """
        engine = self._model(model).engine
        if not self._started or self._closing:
            raise ShutdownError("the arbiter is not running: use 'async with arbiter:' or await arbiter.start()")
        if engine.profile.modality is not Modality.IMAGE or not hasattr(engine, "prepare_image"):
            raise ModalityError(f"model {model!r} makes no images (it is a {engine.profile.modality.value} model)")
        size = engine.default_size if size is None else size  # type: ignore[attr-defined]
        steps = engine.default_steps if steps is None else steps  # type: ignore[attr-defined]
        params = GenerationParams(engine.latent_tokens(size, steps, n), seed=seed)  # type: ignore[attr-defined]

        def prepare(engine: Engine) -> Prompt:
            return engine.prepare_image(prompt, size=size, steps=steps, n=n, guidance=guidance)  # type: ignore[attr-defined]

        ticket = self._submit(model, agent, params, prepare)
        images: tuple[Any, ...] = ()
        finish = "stop"
        async with contextlib.aclosing(self._run(ticket)) as run:
            async for delta in run:
                images = delta.images or images
                finish = delta.finish_reason or finish
        reply = self._reply(ticket, "", finish)
        return ImageReply(
            images=list(images), png=[to_png(image) for image in images], finish_reason=finish, model=model,
            request_id=reply.request_id, usage=reply.usage, timing=reply.timing,
        )

    def stats(self) -> Stats:
        """Per app and per agent: service, share vs weight, requests, wait and TTFT percentiles."""
        queued: dict[tuple[str, str], int] = defaultdict(int)
        running: dict[tuple[str, str], int] = defaultdict(int)
        for t in self._tickets.values():
            (queued if t.state is _State.WAITING else running)[t.request.agent_key] += 1
        return self.ledger.snapshot(
            {n: a.weight for n, a in self._apps.items()},
            {k: a.weight for k, a in self._agents.items()},
            queued,
            running,
        )

    def bound(self, max_request_tokens: int) -> float:
        """``U`` of the fairness guarantee with the current in-flight limits.

        ``max_request_tokens`` is the longest ``prompt + max_tokens`` a request takes;
        a model holds at most ``limit × max_request_tokens`` tokens (and at most its
        context × limit) in flight. Under a pool limit ``N`` the pool holds at most
        ``N`` requests in all, so ``U`` is also at most ``N`` times the dearest one.
        """
        longest = {m.name: min(max_request_tokens, m.engine.max_model_len) for m in self._models.values()}
        held = {m.name: min(self._limit(m), self.pool_in_flight or self._limit(m)) * longest[m.name]
                for m in self._models.values()}
        return service_bound(self.cost, held, pool=self.pool_in_flight, longest=longest)

    # -- internals -----------------------------------------------------------------

    def _model(self, name: str) -> _Model:
        m = self._models.get(name)
        if m is None:
            known = ", ".join(sorted(self._models)) or "none"
            raise UnknownModelError(f"unknown model {name!r}; known models: {known}")
        return m

    def _limit(self, m: _Model) -> int:
        if m.limit is not None:
            return m.limit
        if self.in_flight is not None:
            return self.in_flight
        capacity = getattr(m.engine, "max_num_seqs", None)
        return capacity if isinstance(capacity, int) and capacity > 0 else DEFAULT_IN_FLIGHT

    @property
    def pool_running(self) -> int:
        """Requests handed to engines and not yet ended, across the pool (bounded by ``pool_in_flight`` if set)."""
        return self._pool_running

    def in_flight_limit(self, model: str) -> int:
        """The in-flight limit ``model`` runs under."""
        return self._limit(self._model(model))

    def _resolve(self, who: AgentHandle | Agent | None) -> Agent:
        if who is None:
            who = current_agent()
            if who is None:
                raise UnknownAgentError("no agent given and none bound: pass agent=... or use fa.acting_as(...)")
        identity = who.identity if isinstance(who, AgentHandle) else who
        if not isinstance(identity, Agent):
            raise InvalidParameterError(f"agent must be an AgentHandle or Agent, got {who!r}")
        if identity.app.name not in self._apps:
            raise UnknownAppError(f"unknown app {identity.app.name!r}; declare it with arbiter.app(...)")
        agent = self._agents.get(identity.key)
        if agent is None:
            raise UnknownAgentError(
                f"unknown agent {identity.name!r} of app {identity.app.name!r}; declare it with "
                f"arbiter.app({identity.app.name!r}).agent({identity.name!r})"
            )
        return agent

    async def _chat_ticket(
        self, model: str, who: AgentHandle | Agent | None, params: GenerationParams, messages: Messages
    ) -> _Ticket:
        """Queue a chat call: text at once; with images, after preparing them in the pool."""
        if not isinstance(messages, Sequence) or isinstance(messages, str | bytes) or not has_images(messages):
            return self._submit(model, who, params, _chat_input(messages))
        arrival = self.clock()  # the call's arrival, before its preprocessing (DuetInfer)
        if self._closing or not self._started:
            raise ShutdownError("the arbiter is not running: use 'async with arbiter:' or await arbiter.start()")
        self._model(model)
        self._resolve(who)  # typed errors before any image work
        prompt = await self.prepare_chat(model, messages)
        return self._submit(model, who, params, lambda _: prompt, arrival=arrival)

    async def prepare_chat(self, model: str, messages: Messages) -> Prompt:
        """``messages`` made ready for ``model``: chat template applied, tokenized, images decoded.

        Messages with images are prepared in the preprocessing pool, off the event loop.
        For callers that need the prompt before sending it (its length, for usage), then
        send it with :meth:`complete` or :meth:`stream_complete`, passing ``arrival``.

        Raises:
            BadInputError: an unknown model, invalid messages, an unreadable image, or an
                image for a model that takes none.
        """
        m = self._model(model)
        if isinstance(messages, Sequence) and not isinstance(messages, str | bytes) and has_images(messages):
            if m.engine.profile.modality is not Modality.VISION:
                raise ModalityError(f"model {model!r} takes no images (it is a {m.engine.profile.modality.value} model)")
            return await self.preprocessor.run(_chat_input(messages), m.engine)
        return _chat_input(messages)(m.engine)

    def _submit(
        self,
        model: str,
        who: AgentHandle | Agent | None,
        params: GenerationParams,
        prepare: Callable[[Engine], Prompt],
        *,
        arrival: float | None = None,
    ) -> _Ticket:
        if self._closing or not self._started:
            raise ShutdownError("the arbiter is not running: use 'async with arbiter:' or await arbiter.start()")
        m = self._model(model)
        agent = self._resolve(who)
        if m.failure is not None:
            raise EngineError(f"model {model!r} is down: {m.failure}")
        waiting = (agent.app.name, model)
        bound = self._max_queued.get(agent.app.name)
        if bound is not None and self._waiting[waiting] >= bound:
            raise OverloadedError(
                f"app {agent.app.name!r} has {bound} requests queued for model {model!r}, its bound; retry later",
                retry_after=min(max(m.run_time or 1.0, 0.05), 60.0),
            )
        prompt = prepare(m.engine)
        if prompt.n_tokens + params.max_tokens > m.engine.max_model_len:
            raise ContextLengthError(
                f"prompt ({prompt.n_tokens} tokens) + max_tokens ({params.max_tokens}) exceeds the context of "
                f"model {model!r} ({m.engine.max_model_len} tokens)"
            )
        now = self.clock()
        arrival = now if arrival is None else arrival
        request = Request(f"fa-{next(_request_ids)}", agent, model, prompt.n_tokens, params.max_tokens, arrival)
        ticket = _Ticket(request, prompt, params, asyncio.get_running_loop().create_future())
        self.policy.on_arrival(request, now)
        self._tickets[request.id] = ticket
        self._waiting[waiting] += 1
        m.tickets.add(ticket)
        self._pump(m)
        return ticket

    def _pump(self, m: _Model) -> None:
        """Dispatch into ``m`` while it has room and the policy has requests for it.

        Under a pool limit, a slot freed anywhere goes to the policy's choice among
        every model with room, not only ``m``.
        """
        if self.pool_in_flight is not None:
            self._pump_pool()
            return
        limit = self._limit(m)
        while m.running < limit and m.failure is None:
            now = self.clock()
            request = self.policy.select(m.name, now)
            if request is None:
                return
            self._dispatch(m, request, now)

    def _pump_pool(self) -> None:
        while self._pool_running < self.pool_in_flight:  # type: ignore[operator]
            room = [m.name for m in self._models.values() if m.running < self._limit(m) and m.failure is None]
            if not room:
                return
            now = self.clock()
            request = self.policy.select_among(room, now)
            if request is None:
                return
            self._dispatch(self._models[request.model], request, now)

    def _dispatch(self, m: _Model, request: Request, now: float) -> None:
        ticket = self._tickets[request.id]
        self.policy.on_dispatch(request, now)
        self._charge(ticket, self.cost.input_cost(m.name, request.prompt_tokens), now)
        ticket.state = _State.RUNNING
        ticket.dispatch_time = now
        self._waiting[(request.app, m.name)] -= 1
        m.running += 1
        self._pool_running += 1
        ticket.dispatched.set_result(None)

    async def _run(self, ticket: _Ticket) -> AsyncIterator[Delta]:
        m = self._models[ticket.request.model]
        outcome = Outcome.CANCELLED
        try:
            await ticket.dispatched
            stream = m.engine.generate(ticket.request.id, ticket.prompt, ticket.params)
            try:
                async for delta in stream:
                    if delta.new_tokens:
                        now = self.clock()
                        if ticket.first_token is None:
                            ticket.first_token = now
                        ticket.produced += delta.new_tokens
                        self.policy.on_progress(ticket.request, delta.new_tokens, now)
                        self._charge(ticket, self.cost.output_cost(m.name, delta.new_tokens), now)
                    if delta.finish_reason == "abort" and ticket.shutdown:
                        raise ShutdownError("the arbiter shut down and aborted the request after the drain timeout")
                    yield delta
            finally:
                await stream.aclose()  # type: ignore[attr-defined]
            outcome = Outcome.FINISHED
        except EngineError as err:
            outcome = Outcome.FAILED
            self._fail_model(m, err)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            outcome = Outcome.FAILED if ticket.shutdown else Outcome.CANCELLED
            raise
        except FairAgentsError:  # shut down, or rejected by the engine after dispatch
            outcome = Outcome.FAILED
            raise
        except Exception as err:  # an engine bug: surface it typed, keep the rest serving
            outcome = Outcome.FAILED
            failure = EngineError(f"model {m.name!r} failed: {err!r}")
            self._fail_model(m, failure)
            raise failure from err
        finally:
            self._end(ticket, outcome)

    def _end(self, ticket: _Ticket, outcome: Outcome) -> None:
        if ticket.state is _State.DONE:
            return
        m = self._models[ticket.request.model]
        was_running = ticket.state is _State.RUNNING
        ticket.state = _State.DONE
        now = self.clock()
        self.policy.on_finish(ticket.request, outcome, now)
        del self._tickets[ticket.request.id]
        m.tickets.discard(ticket)
        r = ticket.request
        if was_running:
            m.running -= 1
            self._pool_running -= 1
            if outcome is Outcome.FINISHED and ticket.dispatch_time is not None:
                run = now - ticket.dispatch_time
                m.run_time = run if m.run_time is None else 0.8 * m.run_time + 0.2 * run
        else:
            self._waiting[(r.app, m.name)] -= 1
        record = RequestRecord(
            r.id, r.app, r.agent.name, r.model, r.arrival, ticket.dispatch_time, ticket.first_token, now,
            r.prompt_tokens, ticket.produced, outcome, r.agent.effective_slo,
        )
        self.ledger.record(record)
        self._pump(m)
        if not self._tickets:
            self._idle.set()
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:  # a listener's bug must not leak into the request that ended
                log.exception("fairagents.arbiter.listener_failed", listener=repr(listener))

    def _charge(self, ticket: _Ticket, amount: float, now: float) -> None:
        ticket.charged += amount
        self.ledger.charge(now, ticket.request.app, ticket.request.agent.name, amount)

    def _fail_model(self, m: _Model, err: EngineError) -> None:
        if m.failure is not None:
            return
        m.failure = err
        log.error("fairagents.arbiter.engine_failed", model=m.name, error=str(err))
        for ticket in list(m.tickets):
            if ticket.state is _State.WAITING and not ticket.dispatched.done():
                ticket.dispatched.set_exception(EngineError(f"model {m.name!r} is down: {err}"))

    async def _collect(self, ticket: _Ticket) -> Reply:
        texts, finish = [], "stop"
        async with contextlib.aclosing(self._run(ticket)) as run:
            async for delta in run:
                texts.append(delta.text)
                finish = delta.finish_reason or finish
        return self._reply(ticket, "".join(texts), finish)

    def _reply(self, ticket: _Ticket, text: str, finish: str) -> Reply:
        r = ticket.request
        end = self.clock()
        return Reply(
            text=text,
            finish_reason=finish,
            model=r.model,
            request_id=r.id,
            usage=Usage(r.prompt_tokens, ticket.produced, ticket.charged),
            timing=Timing(
                queue_wait=(ticket.dispatch_time or end) - r.arrival,
                ttft=None if ticket.first_token is None else ticket.first_token - r.arrival,
                e2e=end - r.arrival,
            ),
        )


def _check_limit(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidParameterError(f"in-flight limit must be an integer ≥ 1, got {value!r}")


def _chat_input(messages: Messages) -> Callable[[Engine], Prompt]:
    def prepare(engine: Engine) -> Prompt:
        _check_messages(messages)
        return engine.prepare_chat(messages)

    return prepare


def _text_input(prompt: str | Prompt) -> Callable[[Engine], Prompt]:
    def prepare(engine: Engine) -> Prompt:
        if isinstance(prompt, Prompt):
            if not prompt.n_tokens:
                raise InvalidParameterError("the prompt has no tokens")
            return prompt
        if not isinstance(prompt, str) or not prompt:
            raise InvalidParameterError(f"the prompt must be a non-empty string or a Prompt, got {prompt!r}")
        return engine.prepare_text(prompt)

    return prepare


def _check_messages(messages: Messages) -> None:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise InvalidParameterError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or "content" not in message:
            raise InvalidParameterError(f"messages[{i}] must be a dict with 'role' and 'content', got {message!r}")
