"""The HTTP API: an OpenAI-compatible front door to an arbiter, with app identity from API keys.

:func:`create_app` builds the FastAPI application. Each request is charged to an agent
of an app: the bearer key decides the app (a missing or unknown key is a 401 and
nothing runs), the ``X-Fairagents-Agent`` header the agent (``default`` otherwise).
With keys off (``server.auth = false``, local use), ``X-Fairagents-App`` names the app.
``X-Fairagents-Run`` names the run (one invocation of an agent workflow) the request
belongs to; without it the request is a run of its own.

What a request goes through, cheap checks first: the key (401), the run id (400), the bounded body
(413), validation (400, nothing charged; large bodies are parsed in the text
preprocessing pool), the model (404 if unknown), then
:meth:`~fairagents.Arbiter.check_admission` (503 while the model is down, 429 with
``Retry-After`` when the app's queue is full) — all before any tokenizing. The prompt
is then rendered once, off the event loop in the preprocessing pools (fair by app),
so its length is known for ``usage`` and for the default ``max_tokens``, and
:meth:`~fairagents.Arbiter.stream_chat` (or ``chat``, ``complete``,
``stream_complete``) queues it with the arrival time of the request, once per choice
(``n``). The server waits for the first token of every choice before it answers, so
an error while queued still gets its status (503 for an engine failure or shutdown);
a client that leaves meanwhile is noticed and its request cancelled (it leaves the
queue, or is aborted in the engine, charged only for tokens produced).

Examples:
    >>> import fairagents as fa
    >>> from fairagents.server import Config, create_app
    >>> from fairagents.testing import FakeEngine
    >>> arbiter = fa.Arbiter()
    >>> arbiter.add_model("chat", FakeEngine())
    >>> app = create_app(arbiter, Config.model_validate({"apps": {"driving": {"api_key": "sk-1"}}}))
    >>> sorted(route.path for route in app.routes if route.path.startswith("/v1"))
    ['/v1/chat/completions', '/v1/completions', '/v1/fairness', '/v1/images/generations', '/v1/models', '/v1/models/{model}']
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import hmac
import time
from collections import defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import HTTPException, RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

import fairagents.server.wire as wire
from fairagents._logging import get_logger
from fairagents.runtime.arbiter import AgentHandle, AppHandle, Arbiter
from fairagents.constants import DEFAULT_AGENT, HEADER_AGENT, HEADER_AGENT_SLO, HEADER_AGENT_WEIGHT, HEADER_APP
from fairagents.cost import prompt_cost
from fairagents.engines.base import Delta, Engine, Prompt
from fairagents.errors import (
    EngineError,
    FairAgentsError,
    InvalidParameterError,
    OverloadedError,
    ShutdownError,
    UnknownAgentError,
    UnknownAppError,
    UnknownModelError,
)
from fairagents.http_errors import http_error
from fairagents.openai_request import all_choices
from fairagents.identity import Agent, Modality, agent_from_headers, run_from_headers
from fairagents.server.config import DEFAULT_MAX_AGENTS, Config, check_name
from fairagents.server.dashboard import page
from fairagents.server.fairness import FairnessView
from fairagents.server.fetch import ImageFetcher
from fairagents.server.metrics import CONTENT_TYPE, Metrics
from fairagents.server.schema import install_openapi

__all__ = ["DEFAULT_APP", "Gateway", "create_app"]

log = get_logger("fairagents.server")

#: App of a request that names none when keys are off.
DEFAULT_APP = "default"
#: Largest request body read, in bytes.
MAX_BODY_BYTES = 32 * 2**20
#: Bodies up to this size are parsed on the event loop (microseconds); larger ones in the text pool.
INLINE_PARSE_BYTES = 64 * 2**10

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

# The header that states each of an agent's settings a request may state.
_SETTING_HEADERS = {"weight": HEADER_AGENT_WEIGHT, "slo": HEADER_AGENT_SLO}


class _ClientGone(Exception):
    """The client disconnected before its response; its request was cancelled."""


def _digest(key: str) -> bytes:
    # Looking keys up by digest keeps the lookup's timing independent of the key's bytes.
    return hashlib.sha256(key.encode()).digest()


def _presented_key(request: Request) -> str | None:
    """The key of ``Authorization: Bearer <key>``, or the password of ``Authorization: Basic``."""
    scheme, _, value = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() or None
    if scheme.lower() == "basic":
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            return base64.b64decode(value.strip(), validate=True).decode().partition(":")[2] or None
    return None


class Gateway:
    """The server's state: the arbiter, which key is which app, the counters, whether it drains.

    Args:
        arbiter: the arbiter to serve (its models are the pool); the caller starts and closes it.
        config: apps, agents and server settings (``config.models`` is what
            :func:`~fairagents.server.build_arbiter` builds; it is not read here).

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.server import Config, Gateway
        >>> gateway = Gateway(fa.Arbiter(), Config.model_validate({"apps": {"a": {"api_key": "k", "agents": {"x": {}}}}}))
        >>> gateway.app_for_key("k"), gateway.app_for_key("nope")
        ('a', None)
    """

    def __init__(self, arbiter: Arbiter, config: Config) -> None:
        self.arbiter = arbiter
        self.config = config
        self.draining = False
        self._keys: dict[bytes, str] = {}
        self._apps: dict[str, AppHandle] = {}
        self._agents: dict[tuple[str, str], AgentHandle] = {}
        self._observer = None if config.server.observer_key is None else _digest(config.server.observer_key.get_secret_value())
        for name, app in config.apps.items():
            own_max_tokens = app.default_max_tokens if isinstance(app.default_max_tokens, int) else None
            handle = arbiter.app(name, app.weight, app.slo.build() if app.slo else None, max_queued=app.max_queued,
                                 max_in_flight_share=app.max_in_flight_share, default_max_tokens=own_max_tokens)
            self._apps[name] = handle
            for agent, settings in app.agents.items():
                self._agents[(name, agent)] = handle.agent(agent, settings.weight, settings.slo.build() if settings.slo else None)
            key = app.key()
            if key is not None:
                if _digest(key) in self._keys:
                    raise InvalidParameterError(f"apps {self._keys[_digest(key)]!r} and {name!r} have the same API key")
                self._keys[_digest(key)] = name
        self.active: dict[str, int] = defaultdict(int)
        self.rejected: dict[tuple[str, str], int] = defaultdict(int)
        server = config.server
        self.view = FairnessView(
            arbiter,
            keep=server.history_seconds,
            max_age=server.views_cache_seconds,
            clients=lambda: list(self._agents),
            extra=lambda: {k: {"rejected": v} for k, v in self.rejected.items()},
            models=self.models,
        )
        self.metrics = Metrics(arbiter, self.view, draining=lambda: self.draining, models=self.models,
                               max_apps=server.metrics_max_apps, max_agents=server.metrics_max_agents_per_app)
        self.clock: Callable[[], float] = time.monotonic
        """Seconds, for identities' idle time."""
        self._seen: dict[tuple[str, str], float] = {}  # agents declared by requests: when last seen
        self._agent_count: dict[str, int] = defaultdict(int)
        self._holds: dict[tuple[str, str], int] = {}  # agent -> requests holding it (see release)
        # Agents (and, keys off, apps) declared by requests, none of which queued yet: the samples taken before.
        self._fresh: dict[tuple[str, str], int] = {}
        self._fresh_apps: dict[str, int] = {}
        for app_name, _ in self._agents:
            self._agent_count[app_name] += 1
        fetch = config.server.image_fetch
        self.fetcher = None if fetch is None else ImageFetcher(fetch.allow_hosts, max_bytes=fetch.max_bytes,
                                                                timeout=fetch.timeout, schemes=fetch.schemes,
                                                                max_images=fetch.max_images)
        """Fetches image URLs from allowed hosts when ``server.image_fetch`` is set."""

    # -- identity ------------------------------------------------------------------

    def app_for_key(self, key: str) -> str | None:
        """The app whose API key ``key`` is, or ``None``."""
        return self._keys.get(_digest(key))

    async def authenticate(self, request: Request) -> str:
        """The calling app's name (a FastAPI dependency); 401 for a missing or unknown key, 503 while draining."""
        if self.draining:
            raise ShutdownError("the server is shutting down and admits no new requests")
        if not self.config.server.auth:
            return check_name(request.headers.get(HEADER_APP) or DEFAULT_APP, "app", param=HEADER_APP)
        scheme, _, key = (request.headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise HTTPException(401, "missing API key: send 'Authorization: Bearer <key>'", {"WWW-Authenticate": "Bearer"})
        app = self.app_for_key(key.strip())
        if app is None:
            raise HTTPException(401, "invalid API key", {"WWW-Authenticate": "Bearer"})
        return app

    async def identify(self, request: Request) -> AgentHandle:
        """The calling agent (a FastAPI dependency): app from :meth:`authenticate`, agent from its header.

        An agent new to its app is declared with the weight and SLO its request states
        (``X-Fairagents-Agent-Weight``, ``X-Fairagents-Agent-Slo``; else weight 1 and the
        app's SLO), as ``app.agent(name, weight, slo)`` declares one in process. Later
        requests may state the same settings, or none; other ones are a 400 naming the
        header, as declaring an agent again with other settings is an error in process.

        The request holds its agent until :meth:`release`: an agent (and, keys off, an
        app) that requests declared is undeclared again when the last request holding it
        ends without ever having queued a request, so a refused request leaves no state.

        The run that ``X-Fairagents-Run`` names is checked here, before anything is
        declared (a bad one is a 400), and kept as ``request.state.run`` (``None``: none).
        """
        app = await self.authenticate(request)
        request.state.run = run_from_headers(request.headers)
        agent = check_name(request.headers.get(HEADER_AGENT) or DEFAULT_AGENT, "agent", param=HEADER_AGENT)
        stated = agent_from_headers(app, agent, request.headers)
        key = (app, agent)
        handle = self._agents.get(key)
        if handle is None:
            handle = self._declare(app, agent, stated)
        else:
            conflicts = stated.conflicts(handle.identity)
            if conflicts:
                what, given, declared = conflicts[0]
                raise InvalidParameterError(f"agent {agent!r} of app {app!r} is declared with {what}={declared}; a "
                                            f"request cannot change it (it states {what}={given})", app=app,
                                            agent=agent, param=_SETTING_HEADERS[what])
            if key in self._seen or key in self.view.hidden:
                self._seen[key] = self.clock()
                self.view.recall(app, agent)
        self._holds[key] = self._holds.get(key, 0) + 1
        request.state.holds = key
        return handle

    def release(self, request: Request) -> None:
        """The request's handler ended: undeclare what requests declared if none of them queued a request.

        The last request holding an agent declared by requests undeclares it (everywhere
        it was put) unless the arbiter accounts for it: a request of it waiting, running
        or ended, service charged. Keys off, an app that requests declared goes with its
        last such agent.
        """
        key = getattr(request.state, "holds", None)
        if key is None:
            return
        request.state.holds = None
        left = self._holds[key] - 1
        if left:
            self._holds[key] = left
            return
        del self._holds[key]
        since = self._fresh.pop(key, None)
        if since is not None:
            if self.arbiter.forget_agent(*key):
                del self._agents[key]
                self._agent_count[key[0]] -= 1
                self._seen.pop(key, None)
                self.rejected.pop(key, None)
                self.metrics.forget(*key)
                self.view.recall(*key)
                self.view.drop(*key, since)
        app = key[0]
        if app in self._fresh_apps:
            if key in self._agents:  # it queued a request: the app stays
                del self._fresh_apps[app]
            elif self._agent_count[app] == 0 and self.arbiter.forget_app(app):
                self.view.drop(app, None, self._fresh_apps.pop(app))
                del self._apps[app], self._agent_count[app]

    def _declare(self, app: str, agent: str, stated: Agent) -> AgentHandle:
        self._check_within_app(stated)
        limit = self.config.apps[app].max_agents if app in self.config.apps else DEFAULT_MAX_AGENTS
        if self._agent_count.get(app, 0) >= limit:
            self.metrics.refuse("max_agents")
            raise UnknownAgentError(f"unknown agent {agent!r}: app {app!r} already has {limit} agents, its max_agents",
                                    app=app, agent=agent)
        handle = self._apps.get(app)
        if handle is None:  # keys off: apps are declared on first use
            if len(self._apps) >= self.config.server.max_apps:
                self.metrics.refuse("max_apps")  # counted without the name: refused names leave no state
                raise UnknownAppError(f"unknown app {app!r}: the server already has {len(self._apps)} apps, its max_apps",
                                      app=app)
            declared = app in self.arbiter.tenants.apps  # by the code that built the arbiter: not the request's
            handle = self._apps[app] = self.arbiter.app(app, max_queued=self.config.server.max_queued)
            if not declared:
                self._fresh_apps[app] = self.view.taken
        declared = (app, agent) in self.arbiter.tenants.agents
        self._agents[(app, agent)] = handle.agent(agent, stated.weight, stated.slo)
        self._agent_count[app] += 1
        if not declared:  # only what a request declared is undone when it ends refused
            self._fresh[(app, agent)] = self.view.taken
        if agent not in (self.config.apps[app].agents if app in self.config.apps else {}):
            self._seen[(app, agent)] = self.clock()
        return self._agents[(app, agent)]

    def forget_idle(self) -> list[tuple[str, str]]:
        """Forget the agents declared by requests (not configured) idle for ``server.identity_idle_seconds``.

        Their series leave ``/metrics``, their samples and ``rejected`` counts
        ``/v1/fairness``; one that comes back is shown again. The arbiter keeps their
        declaration and service (bounded by ``max_apps`` × ``max_agents``), so the
        fair-share counters lose nothing. Returns the agents forgotten.
        """
        idle = self.config.server.identity_idle_seconds
        if idle is None:
            return []
        now = self.clock()
        busy = {t.request.agent_key for t in self.arbiter.dispatcher.tickets()}
        gone = [key for key, seen in self._seen.items() if now - seen >= idle and key not in busy]
        for key in gone:
            del self._seen[key]
            self.rejected.pop(key, None)
            self.metrics.forget(*key)
            self.view.forget(*key)
        return gone

    async def sweep(self) -> None:
        """Forget idle identities every so often (a quarter of the idle time, at most a minute) until cancelled."""
        idle = self.config.server.identity_idle_seconds
        if idle is None:
            return
        while True:
            await asyncio.sleep(min(60.0, idle / 4))
            self.forget_idle()

    def _check_within_app(self, stated: Agent) -> None:
        """Refuse the settings a request states for a new agent where they would weigh against other apps.

        An agent's weight is its share of its app (HMFS charges the app's counter by the app's
        weight alone), unless the policy makes every agent a client of the pool (VTC or WFQ
        with ``client="agent"``). An SLO is a time, not a share: where the order of service
        reads SLOs (``reads_slos`` policies, Statera admission), a tighter one goes ahead of
        other apps' requests. Those settings are then the configuration's to give.
        """
        policy, app, agent = self.arbiter.policy, *stated.key
        if "weight" in stated.declared and getattr(policy, "client", "app") != "app":
            raise InvalidParameterError(
                f"policy {policy.name!r} shares the pool between agents, not apps: an agent's weight is set in the "
                f"server's configuration (apps.{app}.agents.{agent}.weight), not by a request",
                app=app, agent=agent, param=HEADER_AGENT_WEIGHT)
        if "slo" in stated.declared and (getattr(policy, "reads_slos", True) or self.arbiter.admission is not None):
            reader = f"policy {policy.name!r}" if getattr(policy, "reads_slos", True) else "Statera admission"
            raise InvalidParameterError(
                f"{reader} weighs the requests of all apps by their agents' SLOs: an agent's SLO is set in the "
                f"server's configuration (apps.{app}.agents.{agent}.slo), not by a request",
                app=app, agent=agent, param=HEADER_AGENT_SLO)

    async def observe(self, request: Request) -> str | None:
        """Who reads a view (a FastAPI dependency of ``/metrics``, ``/v1/fairness``, ``/dashboard``).

        ``None``: all of it (keys off, ``server.public_views``, or the observer key). An
        app's name: that app's key, which reads its own app's ``/v1/fairness`` (and the
        page that draws it) only. Anyone else is a 401. The key comes as a bearer key, or
        as the password of HTTP Basic (the browser's prompt on ``/dashboard``).
        """
        server = self.config.server
        if not server.auth or server.public_views:
            return None
        key = _presented_key(request)
        if key and self._observer is not None and hmac.compare_digest(_digest(key), self._observer):
            return None
        app = self.app_for_key(key) if key else None
        if app is not None and request.url.path in ("/v1/fairness", "/dashboard"):
            return app
        challenge = 'Basic realm="fairagents", charset="UTF-8"' if request.url.path == "/dashboard" else "Bearer"
        raise HTTPException(401, "this view needs the observer key", {"WWW-Authenticate": challenge})

    # -- the pool ------------------------------------------------------------------

    def models(self) -> dict[str, dict[str, Any]]:
        """Per model: healthy, in flight (handed to the engine), its limit, queued, and its device."""
        out = {}
        for name in self.arbiter.models:
            queued = self.arbiter.queued(name)
            out[name] = {
                "healthy": self.arbiter.serving(name),
                "restarting": self.arbiter.restarting(name),
                "in_flight": max(0, self.active[name] - queued),
                "in_flight_limit": self.arbiter.in_flight_limit(name),
                "queued": queued,
                "device": self.arbiter.pool.get(name).device,
            }
        return out

    def default_max_tokens(self, model: str, prompt: Prompt, app: str) -> int:
        """Output tokens of a request of ``app`` that sets no ``max_tokens``.

        The app's ``default_max_tokens`` if its configuration sets one, else
        ``server.default_max_tokens``; ``"context"`` is the rest of the context after the
        prompt. Either is clipped to what fits the context and the model's token budget
        (:meth:`~fairagents.Arbiter.default_max_tokens`, the rule of every call, in process
        too): the request reserves ``prompt + max_tokens`` of the budget while it runs.
        """
        most = self.arbiter.default_max_tokens(model, prompt.n_tokens, app=app)
        configured = self.config.apps.get(app)
        if configured is not None and configured.default_max_tokens is not None:
            return most  # the app's own, declared on the arbiter
        cap = self.config.server.default_max_tokens
        return most if cap == "context" else min(most, cap)

    def engine(self, model: str) -> Engine:
        """The engine of text-generating ``model``: 404 if it is not in the pool, 400 for an image model."""
        engine = self.arbiter.engine(model)
        if engine.profile.modality is Modality.IMAGE:
            raise InvalidParameterError(f"model {model!r} generates images; it takes no chat or completion requests",
                                        model=model, param="model")
        return engine

    # -- one request ---------------------------------------------------------------

    async def parse(self, request: Request, who: AgentHandle, model: type[M], raw: bytes) -> M:
        """Validate a request body: a small one at once, a large one in the text preprocessing pool.

        Parsing megabytes of JSON takes milliseconds to tenths of a second; in the pool
        it queues fairly behind the app's own work, under the app's bound, and the
        event loop keeps serving everyone else meanwhile.
        """
        app = who.identity.app
        request.state.labels = (app.name, who.identity.name, None)
        if len(raw) <= INLINE_PARSE_BYTES:
            return wire.parse(model, raw, self.arbiter.limits)
        pool = self.arbiter.text_preprocessor
        work = pool.run(wire.parse, model, raw, self.arbiter.limits, app=app.name, weight=app.weight)
        return await _until_disconnected(request, work)

    async def respond(
        self, request: Request, who: AgentHandle, body: wire.ChatCompletionRequest | wire.CompletionRequest,
        prompt: Prompt, max_tokens: int, arrival: float | None = None,
    ) -> Response:
        """Queue the request's choices (at ``arrival``, if it was prepared first), wait for their first tokens, answer.

        An error before then is the answer (its status). Each of ``n`` choices is a request of its own, charged to the caller and
        scheduled like any other; a choice that fails before the answer starts fails the
        whole request (the others are cancelled, charged only for what they produced).
        """
        chat = isinstance(body, wire.ChatCompletionRequest)
        model = body.model
        run = _run(request)
        request.state.labels = (who.identity.app.name, who.identity.name, model)
        kwargs = body.arbiter_kwargs(max_tokens) if chat else body.sampling(max_tokens)  # type: ignore[union-attr]
        rid = wire.new_id("chatcmpl" if chat else "cmpl")
        if not body.stream:
            call: Any = self.arbiter.chat if chat else self.arbiter.complete
            replies = await _until_disconnected(request, all_choices([
                self._counted(model, call(model, prompt, agent=who, arrival=arrival, run=run, **kwargs))
                for _ in range(body.choices)]))
            usage = wire.Usage(prompt_tokens=prompt.n_tokens,
                               completion_tokens=sum(r.usage.completion_tokens for r in replies),
                               unified_tokens=sum(r.usage.unified_tokens for r in replies),
                               cached_tokens=max(r.usage.cached_tokens for r in replies))
            if chat:
                choices = [wire.chat_choice(i, None if r.tool_calls and not r.text else r.text, r.finish_reason,
                                            tool_calls=r.tool_calls, logprobs=r.logprobs)
                           for i, r in enumerate(replies)]
                return JSONResponse(wire.chat_completion(rid, model, choices, usage))
            choices = [wire.completion_choice(i, r.text, r.finish_reason, logprobs=r.logprobs)
                       for i, r in enumerate(replies)]
            return JSONResponse(wire.completion(rid, model, choices, usage))
        stream: Any = self.arbiter.stream_chat if chat else self.arbiter.stream_complete
        streams = _Choices([
            self._tracked(model, stream(model, prompt, agent=who, arrival=arrival, run=run, **kwargs))
            for _ in range(body.choices)])
        try:
            head = await _until_disconnected(request, streams.head())
        except BaseException:
            await streams.aclose()
            raise
        events = self._events(rid, model, prompt, streams, head, chat=chat, include_usage=body.include_usage,
                              logprobs=bool(kwargs["logprobs"]))
        return _EventStream(events, streams, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                            stall_timeout=self.config.server.stream_stall_timeout)

    async def _counted(self, model: str, work: Awaitable[T]) -> T:
        self.active[model] += 1
        try:
            return await work
        finally:
            self.active[model] -= 1

    async def _tracked(self, model: str, stream: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
        self.active[model] += 1
        try:
            async for delta in stream:
                yield delta
        finally:
            self.active[model] -= 1
            await stream.aclose()  # type: ignore[attr-defined]

    def _usage(self, model: str, prompt: Prompt, produced: list[int], cached: list[int]) -> wire.Usage:
        """The usage of a streamed request's choices: the prompt once, as OpenAI counts it; each choice charged it
        (the tokens its engine read from the prefix cache at ``w_cached``)."""
        cost, n = self.arbiter.cost, prompt.n_tokens
        charged = cached if self.arbiter.dispatcher.model(model).in_engine else [0] * len(cached)  # as the ledger
        unified = sum(prompt_cost(cost, model, n, min(hit, n)) + cost.output_cost(model, p)
                      for p, hit in zip(produced, charged, strict=True))
        return wire.Usage(prompt_tokens=n, completion_tokens=sum(produced), unified_tokens=unified,
                          cached_tokens=min(max(cached), n))

    async def _events(
        self, rid: str, model: str, prompt: Prompt, streams: _Choices, head: list[tuple[int, Delta | None]], *,
        chat: bool, include_usage: bool, logprobs: bool,
    ) -> AsyncGenerator[str, None]:
        created = int(time.time())
        n = streams.n
        produced, finished, sent, cached = [0] * n, [False] * n, [0] * n, [0] * n
        pending = list(head)
        try:
            if chat:
                for i in range(n):
                    yield wire.sse(wire.chat_chunk(rid, model, created, index=i, content="", role=True,
                                                   include_usage=include_usage))
            while True:
                event = pending.pop(0) if pending else await streams.next()
                if event is None:
                    break
                i, delta = event
                if delta is None:
                    continue
                produced[i] += delta.new_tokens
                if delta.cached_tokens:
                    cached[i] = delta.cached_tokens
                finished[i] = finished[i] or delta.finish_reason is not None
                if not (delta.text or delta.finish_reason or delta.tool_calls or delta.logprobs):
                    continue
                tokens = delta.logprobs if logprobs else None
                if chat:
                    content = None if delta.tool_calls and not delta.text else delta.text
                    # Calls, then the finish reason in a chunk of its own, as OpenAI sends them (openai's
                    # stream helper closes a call's arguments only on a later chunk).
                    last_call = delta.tool_calls and delta.finish_reason is not None
                    chunk = wire.chat_chunk(rid, model, created, index=i, content=content, tool_calls=delta.tool_calls,
                                            logprobs=tokens, finish_reason=None if last_call else delta.finish_reason,
                                            include_usage=include_usage)
                    if last_call:
                        yield wire.sse(chunk)
                        chunk = wire.chat_chunk(rid, model, created, index=i, finish_reason=delta.finish_reason,
                                                include_usage=include_usage)
                else:
                    chunk = wire.completion_chunk(rid, model, created, index=i, text=delta.text, offset=sent[i],
                                                  logprobs=tokens, finish_reason=delta.finish_reason,
                                                  include_usage=include_usage)
                    sent[i] += len(delta.text)
                yield wire.sse(chunk)
        except FairAgentsError as err:  # the engine failed, or the drain timed out, mid-stream
            yield wire.sse(_error(err)[1])
            return
        finally:
            await streams.aclose()
        build = wire.chat_chunk if chat else wire.completion_chunk
        for i in range(n):
            if not finished[i]:
                yield wire.sse(build(rid, model, created, index=i, finish_reason="stop", include_usage=include_usage))
        if include_usage:
            yield wire.sse(build(rid, model, created, usage=self._usage(model, prompt, produced, cached)))
        yield wire.sse("[DONE]")


class _Choices:
    """The streams of a request's choices.

    One is read as the response goes (a client that reads slowly holds its request
    back). Several are read at once, each by a task of its own, their events in the
    order they come: a choice waiting for dispatch behind another of the same request
    must not wait for the client to read that one.
    """

    def __init__(self, streams: list[AsyncIterator[Delta]]) -> None:
        self.n = len(streams)
        self._streams = streams
        self._open = set(range(self.n))
        self._events: asyncio.Queue[tuple[int, Delta | Exception | None]] | None = None
        self._pumps: list[asyncio.Future[None]] = []
        if self.n > 1:
            self._events = asyncio.Queue()
            self._pumps = [asyncio.ensure_future(self._pump(i, s)) for i, s in enumerate(streams)]

    async def _pump(self, index: int, stream: AsyncIterator[Delta]) -> None:
        assert self._events is not None
        try:
            async for delta in stream:
                self._events.put_nowait((index, delta))
        except Exception as err:  # the choice failed: its reader raises it
            self._events.put_nowait((index, err))
        else:
            self._events.put_nowait((index, None))

    async def next(self) -> tuple[int, Delta | None] | None:
        """The next event: ``(choice, delta)``, ``(choice, None)`` when that choice ended, ``None`` when all did.

        A choice's failure raises here.
        """
        if not self._open:
            return None
        if self._events is None:
            index, event = 0, await anext(self._streams[0], None)
        else:
            index, event = await self._events.get()
            if isinstance(event, Exception):
                raise event
        if event is None:
            self._open.discard(index)
        return index, event  # type: ignore[return-value]

    async def head(self) -> list[tuple[int, Delta | None]]:
        """The events up to the first of every choice: the answer starts once each has a token (or ended)."""
        seen: set[int] = set()
        events: list[tuple[int, Delta | None]] = []
        while len(seen) < self.n:
            event = await self.next()
            if event is None:
                break
            seen.add(event[0])
            events.append(event)
        return events

    async def aclose(self) -> None:
        """Stop reading: the choices still running are cancelled (charged only for what they produced)."""
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        for stream in self._streams:
            await stream.aclose()  # type: ignore[attr-defined]


def _run(request: Request) -> str | None:
    """The run of a request, as :meth:`Gateway.identify` read it from ``X-Fairagents-Run``."""
    return getattr(request.state, "run", None)


async def _caller(request: Request) -> AgentHandle:
    return await request.app.state.gateway.identify(request)  # type: ignore[no-any-return]


async def _calling_app(request: Request) -> str:
    return await request.app.state.gateway.authenticate(request)  # type: ignore[no-any-return]


async def _observer(request: Request) -> str | None:
    return await request.app.state.gateway.observe(request)  # type: ignore[no-any-return]


# FastAPI dependencies: the gateway's checks, run in the event loop before the endpoint.
Caller = Annotated[AgentHandle, Depends(_caller)]
CallingApp = Annotated[str, Depends(_calling_app)]
Observer = Annotated[str | None, Depends(_observer)]


class _EventStream(StreamingResponse):
    """An SSE response that always closes its event generator and its choices, however the response ends.

    A response can end before its first event, and then the generator's own cleanup never runs.

    A client that stops reading is cut after ``stall_timeout`` seconds on one send: its
    request ends cancelled, as if it had disconnected (charged only for what it produced,
    its slot and budget freed), and the connection is dropped.
    """

    media_type = "text/event-stream"

    def __init__(self, events: AsyncGenerator[str, None], choices: _Choices, headers: dict[str, str],
                 stall_timeout: float) -> None:
        super().__init__(events, headers=headers)
        self._events = events
        self._choices = choices
        self._stall_timeout = stall_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, _within(send, scope, self._stall_timeout))
        except _Stalled:
            log.info("fairagents.server.stream_stalled", path=scope.get("path"), timeout=self._stall_timeout)
        finally:
            await self._events.aclose()
            await self._choices.aclose()


class _Stalled(Exception):
    """The client read nothing of its response for the stall timeout."""


#: The ASGI scope extension under which the server (:mod:`fairagents.server.serve`) hands the
#: app a callable that drops the request's connection at once, unsent bytes and all.
ABORT_EXTENSION = "fairagents.abort"


def _within(send: Send, scope: Scope, timeout: float) -> Send:
    """``send``, raising :class:`_Stalled` past ``timeout`` seconds, after dropping the connection.

    Dropping it frees what the server buffered for a client that does not read (uvicorn
    would otherwise wait for it to flush before closing).
    """
    async def bounded(message: Any) -> None:
        try:
            async with asyncio.timeout(timeout):
                await send(message)
        except TimeoutError:
            abort = scope.get("extensions", {}).get(ABORT_EXTENSION)
            if abort is not None:
                abort()
            raise _Stalled() from None

    return bounded


async def _body(request: Request) -> bytes:
    """The request body, refused (413) past :data:`MAX_BODY_BYTES` without reading it all.

    It must arrive within ``server.body_timeout`` seconds, else 408 (and the connection is
    closed: the rest of the body is not read).
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise HTTPException(413, f"the request body is over {MAX_BODY_BYTES} bytes")
    timeout = request.app.state.gateway.config.server.body_timeout
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise HTTPException(413, f"the request body is over {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
    except ClientDisconnect:  # it left before sending its whole request: nothing to answer
        raise _ClientGone() from None
    except TimeoutError:
        raise HTTPException(408, f"the request body did not arrive within {timeout:g} s (server.body_timeout)",
                            {"Connection": "close"}) from None
    return b"".join(chunks)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``await work``, cancelling it (and raising ``_ClientGone``) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server is cancelling this handler
        task.cancel()
        gone.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
        raise
    gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise _ClientGone()


def _error(err: FairAgentsError, arbiter: Arbiter | None = None, path: str | None = None,
           ) -> tuple[int, dict[str, Any], dict[str, str]]:
    told = http_error(err, arbiter, path=path)
    return told.status, wire.error_body(str(err), told.type, told.code, told.param), told.headers  # paths hidden


def create_app(arbiter: Arbiter, config: Config | None = None, *, title: str = "fairagents") -> FastAPI:
    """The FastAPI application serving ``arbiter``'s models to ``config``'s apps.

    The caller starts and closes the arbiter (:func:`~fairagents.server.serve` does
    both); the app declares the configured apps and agents on it. The :class:`Gateway`
    is at ``app.state.gateway``.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.server import Config, create_app
        >>> app = create_app(fa.Arbiter(), Config.default())
        >>> app.state.gateway.draining
        False
    """
    config = config or Config.default()
    gateway = Gateway(arbiter, config)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sampler = asyncio.create_task(gateway.view.run())
        sweeper = asyncio.create_task(gateway.sweep())
        try:
            yield
        finally:
            sampler.cancel()
            sweeper.cancel()
            await asyncio.gather(sampler, sweeper, return_exceptions=True)
            if gateway.fetcher is not None:
                await gateway.fetcher.aclose()

    app = FastAPI(title=f"{title} server", lifespan=lifespan, docs_url=None, redoc_url=None)
    install_openapi(app)
    app.state.gateway = gateway

    def holding(endpoint: Callable[[Request, AgentHandle], Awaitable[Response]],
                ) -> Callable[[Request, AgentHandle], Awaitable[Response]]:
        """``endpoint``, releasing the caller's agent when it ends (:meth:`Gateway.release`)."""
        @functools.wraps(endpoint)
        async def run(request: Request, who: Caller) -> Response:
            try:
                return await endpoint(request, who)
            finally:
                gateway.release(request)

        return run

    @app.exception_handler(FairAgentsError)
    async def _fairagents_error(request: Request, err: FairAgentsError) -> JSONResponse:
        status, body, headers = _error(err, arbiter, request.url.path)
        labels = getattr(request.state, "labels", None)
        if isinstance(err, OverloadedError) and labels is not None and labels[:2] in gateway._agents:
            # (an agent declared by the refused request itself is undeclared already: its name is kept nowhere)
            gateway.rejected[labels[:2]] += 1
            gateway.metrics.reject(labels[0], labels[1], labels[2] or err.model or "")  # "": refused before its model was read
        if isinstance(err, EngineError):
            log.warning("fairagents.server.engine_unavailable", path=request.url.path, error=str(err))
        return JSONResponse(body, status, headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        kind: wire.ErrorType = "authentication_error" if err.status_code == 401 else "invalid_request_error"
        code = "invalid_api_key" if err.status_code == 401 else None
        return JSONResponse(wire.error_body(str(err.detail), kind, code), err.status_code, err.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        param = str(first["loc"][-1]) if first["loc"] else None  # ("query", "history"): the query parameter
        return JSONResponse(wire.error_body(f"{where}: {first['msg']}", "invalid_request_error", "invalid_parameter",
                                            param), 400)

    @app.exception_handler(_ClientGone)
    async def _gone(request: Request, err: _ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it: nginx's "client closed request"

    @app.post("/v1/chat/completions")
    @holding
    async def chat_completions(request: Request, who: Caller) -> Response:
        raw = await _body(request)
        arrival = arbiter.clock()  # the request keeps its place while it is parsed and prepared
        body = await gateway.parse(request, who, wire.ChatCompletionRequest, raw)
        request.state.labels = (who.identity.app.name, who.identity.name, body.model)
        gateway.engine(body.model)
        spec = body.output_spec(arbiter.limits)
        # a full queue is a 429, tools or a format the model cannot serve a 400: before any tokenizing
        arbiter.check_admission(body.model, who, output=spec)
        messages = body.chat_messages(remote=gateway.fetcher is not None)
        if gateway.fetcher is not None:
            messages = await _until_disconnected(request, gateway.fetcher.inline(messages))
        prompt = await _until_disconnected(
            request, arbiter.prepare_chat(body.model, messages, agent=who, tools=spec.template_tools))
        app_name = who.identity.app.name
        max_tokens = body.requested_max_tokens() or gateway.default_max_tokens(body.model, prompt, app_name)
        return await gateway.respond(request, who, body, prompt, max_tokens, arrival)

    @app.post("/v1/completions")
    @holding
    async def completions(request: Request, who: Caller) -> Response:
        raw = await _body(request)
        arrival = arbiter.clock()
        body = await gateway.parse(request, who, wire.CompletionRequest, raw)
        request.state.labels = (who.identity.app.name, who.identity.name, body.model)
        gateway.engine(body.model)
        arbiter.check_admission(body.model, who)
        text = body.single_prompt()
        ready = text if isinstance(text, str) else Prompt(token_ids=tuple(text))
        prompt = await _until_disconnected(request, arbiter.prepare_text(body.model, ready, agent=who))
        app_name = who.identity.app.name
        max_tokens = body.requested_max_tokens() or gateway.default_max_tokens(body.model, prompt, app_name)
        return await gateway.respond(request, who, body, prompt, max_tokens, arrival)

    @app.post("/v1/images/generations")
    @holding
    async def images(request: Request, who: Caller) -> Response:
        body = await gateway.parse(request, who, wire.ImageGenerationRequest, await _body(request))
        image_models = [m for m in arbiter.models if arbiter.engine(m).profile.modality is Modality.IMAGE]
        model = body.model or (image_models[0] if len(image_models) == 1 else None)
        if model is None or model not in arbiter.models:
            raise UnknownModelError(f"no image model {body.model!r} is served; image models: {', '.join(image_models) or 'none'}",
                                    model=body.model)
        modality = arbiter.engine(model).profile.modality
        if modality is not Modality.IMAGE:
            raise InvalidParameterError(f"model {model!r} is a {modality.value} model and does not generate images",
                                        model=model, param="model")
        if body.response_format not in (None, "b64_json"):
            raise InvalidParameterError("response_format: images are returned as b64_json (no image URLs are hosted)",
                                        param="response_format")
        request.state.labels = (who.identity.app.name, who.identity.name, model)
        reply = await _until_disconnected(
            request, arbiter.generate_image(model, body.prompt, agent=who, size=body.dimensions(), n=body.n,
                                            run=_run(request))
        )
        data = [{"b64_json": base64.b64encode(png).decode()} for png in reply.png]
        return JSONResponse({"created": int(time.time()), "data": data, "usage": wire.images_usage(wire.Usage(
            prompt_tokens=reply.usage.prompt_tokens, completion_tokens=reply.usage.completion_tokens,
            unified_tokens=reply.usage.unified_tokens))})

    def card(name: str) -> dict[str, Any]:
        engine = arbiter.engine(name)  # UnknownModelError: a 404
        return {"id": name, "object": "model", "created": int(gateway.view.started), "owned_by": "fairagents",
                "max_model_len": engine.max_model_len, "modality": engine.profile.modality.value}

    @app.get("/v1/models")
    async def models(_: CallingApp) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [card(name) for name in arbiter.models]})

    @app.get("/v1/models/{model}")
    async def model_card(model: str, _: CallingApp) -> JSONResponse:
        return JSONResponse(card(model))

    @app.get("/v1/fairness")
    async def fairness(
        viewer: Observer,
        history: Annotated[float | None, Query(ge=0, description="seconds of service history to include")] = None,
        app_name: Annotated[str | None, Query(alias="app", description="the app whose per-agent history to include "
                                                                        "(an app's own key: its own)")] = None,
    ) -> Response:
        body = await gateway.view.body(history, draining=gateway.draining, app=viewer or app_name, only=viewer)
        return Response(body, media_type="application/json")

    @app.get("/metrics")
    async def metrics(_: Observer) -> Response:
        return Response(await gateway.metrics.exposition(config.server.views_cache_seconds), media_type=CONTENT_TYPE)

    @app.get("/health")
    async def health() -> JSONResponse:
        """Readiness: 200 only while every model serves; 503 when one is down (or the server drains)."""
        models = {name: {"healthy": m["healthy"], "restarting": m["restarting"]} for name, m in gateway.models().items()}
        healthy = sum(m["healthy"] for m in models.values())
        if gateway.draining:
            status = "draining"
        else:
            status = "ok" if models and healthy == len(models) else ("degraded" if healthy else "down")
        body: dict[str, Any] = {"status": status, "models": models}
        if gateway.arbiter.counters is not None:  # a lost Redis is reported, not a reason to stop serving
            body["counters"] = {"connected": gateway.arbiter.counters.status()["connected"]}  # not where: /metrics has more
        return JSONResponse(body, 200 if status == "ok" else 503)

    @app.get("/health/live")
    async def live() -> JSONResponse:
        """Liveness: the process answers; a model that is down is not a reason to restart it."""
        return JSONResponse({"status": "live"})

    @app.get("/dashboard", response_class=HTMLResponse)
    async def dashboard(_: Observer) -> HTMLResponse:
        return HTMLResponse(page(title), headers={"Cache-Control": "no-cache"})

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/dashboard")

    return app
