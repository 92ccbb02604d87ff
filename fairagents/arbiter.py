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
    ShutdownError,
    UnknownAgentError,
    UnknownAppError,
    UnknownModelError,
)
from fairagents.identity import SLO, Agent, App, current_agent
from fairagents.metrics import RequestRecord
from fairagents.policies import Policy, make_policy
from fairagents.reply import Reply, Timing, Usage
from fairagents.request import Outcome, Request
from fairagents.stats import Ledger, Stats

__all__ = ["DEFAULT_IN_FLIGHT", "AgentHandle", "AppHandle", "Arbiter"]

log = structlog.get_logger("fairagents.arbiter")

#: Requests a model runs at once when neither the call nor the engine says (``fairagents bench overhead``).
DEFAULT_IN_FLIGHT = 32

Messages = Sequence[dict[str, Any]]


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
        d_base: ``d_base`` of unified tokens.
        w_input: weight of a prompt token in service.
        w_output: weight of a generated token in service.
        drain_timeout: seconds ``async with`` exit waits for accepted work before
            aborting the rest with :class:`~fairagents.ShutdownError`.
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
        d_base: int = DEFAULT_D_BASE,
        w_input: float = 1.0,
        w_output: float = 2.0,
        drain_timeout: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if in_flight is not None:
            _check_limit(in_flight)
        self.cost = UnifiedTokenCost(d_base=d_base, w_input=w_input, w_output=w_output)
        self.policy = make_policy(policy, self.cost)
        self.in_flight = in_flight
        self.drain_timeout = drain_timeout
        self.clock = clock
        self.ledger = Ledger()
        self._models: dict[str, _Model] = {}
        self._apps: dict[str, App] = {}
        self._agents: dict[tuple[str, str], Agent] = {}
        self._tickets: dict[str, _Ticket] = {}
        self._ids = itertools.count(1)
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

    def app(self, name: str, weight: float = 1.0, slo: SLO | None = None) -> AppHandle:
        """Declare (or get) an app; re-declaring with other settings is an error."""
        new = App(name, weight=weight, slo=slo)
        existing = self._apps.get(name)
        if existing is not None and existing != new:
            raise InvalidParameterError(f"app {name!r} is already declared as {existing}")
        self._apps[name] = existing or new
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

        Raises:
            BadInputError: bad input (an unknown model, app or agent; invalid messages or
                parameters; a prompt longer than the context): nothing was charged or queued.
            EngineError: the model's engine failed.
            ShutdownError: the arbiter closed before the request finished.
        """
        params = GenerationParams(max_tokens, temperature, top_p, seed, tuple(stop), ignore_eos)
        ticket = self._submit(model, messages, agent, params)
        texts, finish = [], "stop"
        async with contextlib.aclosing(self._run(ticket)) as run:
            async for delta in run:
                texts.append(delta.text)
                finish = delta.finish_reason or finish
        return self._reply(ticket, "".join(texts), finish)

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
        ticket = self._submit(model, messages, agent, params)
        async with contextlib.aclosing(self._run(ticket)) as run:
            async for delta in run:
                yield delta

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
        context × limit) in flight.
        """
        held = {m.name: self._limit(m) * min(max_request_tokens, m.engine.max_model_len) for m in self._models.values()}
        return service_bound(self.cost, held)

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

    def _submit(self, model: str, messages: Messages, who: AgentHandle | Agent | None, params: GenerationParams) -> _Ticket:
        if self._closing or not self._started:
            raise ShutdownError("the arbiter is not running: use 'async with arbiter:' or await arbiter.start()")
        m = self._model(model)
        agent = self._resolve(who)
        if m.failure is not None:
            raise EngineError(f"model {model!r} is down: {m.failure}")
        _check_messages(messages)
        prompt = m.engine.prepare_chat(messages)
        if prompt.n_tokens + params.max_tokens > m.engine.max_model_len:
            raise ContextLengthError(
                f"prompt ({prompt.n_tokens} tokens) + max_tokens ({params.max_tokens}) exceeds the context of "
                f"model {model!r} ({m.engine.max_model_len} tokens)"
            )
        now = self.clock()
        request = Request(f"fa-{next(self._ids)}", agent, model, prompt.n_tokens, params.max_tokens, now)
        ticket = _Ticket(request, prompt, params, asyncio.get_running_loop().create_future())
        self.policy.on_arrival(request, now)
        self._tickets[request.id] = ticket
        m.tickets.add(ticket)
        self._pump(m)
        return ticket

    def _pump(self, m: _Model) -> None:
        """Dispatch into ``m`` while it has room and the policy has requests for it."""
        limit = self._limit(m)
        while m.running < limit and m.failure is None:
            now = self.clock()
            request = self.policy.select(m.name, now)
            if request is None:
                return
            ticket = self._tickets[request.id]
            self.policy.on_dispatch(request, now)
            self._charge(ticket, self.cost.input_cost(m.name, request.prompt_tokens), now)
            ticket.state = _State.RUNNING
            ticket.dispatch_time = now
            m.running += 1
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
        except (FairAgentsError, asyncio.CancelledError, GeneratorExit):
            outcome = Outcome.FAILED if ticket.shutdown else Outcome.CANCELLED
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
        if was_running:
            m.running -= 1
        r = ticket.request
        self.ledger.record(
            RequestRecord(
                r.id, r.app, r.agent.name, r.model, r.arrival, ticket.dispatch_time, ticket.first_token, now,
                r.prompt_tokens, ticket.produced, outcome, r.agent.effective_slo,
            )
        )
        self._pump(m)
        if not self._tickets:
            self._idle.set()

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


def _check_messages(messages: Messages) -> None:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise InvalidParameterError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or "content" not in message:
            raise InvalidParameterError(f"messages[{i}] must be a dict with 'role' and 'content', got {message!r}")
