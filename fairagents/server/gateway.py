"""The server's state and its way with one request: parse it, queue its choices, answer.

:class:`Gateway` holds the arbiter, the :class:`~fairagents.server.identities.Identities`
of its callers, the views (``/v1/fairness``, ``/metrics``), the image fetcher and whether
the server drains; the routes (:mod:`fairagents.server.routes`) call it.

Examples:
    >>> import fairagents as fa
    >>> from fairagents.server import Config, Gateway
    >>> gateway = Gateway(fa.Arbiter(), Config.model_validate({"apps": {"a": {"api_key": "k", "agents": {"x": {}}}}}))
    >>> gateway.identities.app_for_key("k"), gateway.draining
    ('a', False)
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

import fairagents.server.wire as wire
from fairagents.choices import Choices, all_choices, streamed_charge
from fairagents.engines.base import Delta, Engine, Prompt
from fairagents.errors import InvalidParameterError
from fairagents.identity import Modality
from fairagents.limits import RequestLimits
from fairagents.reply import Reply
from fairagents.runtime.arbiter import AgentHandle, Arbiter
from fairagents.server.config import Config
from fairagents.server.fairness import FairnessView
from fairagents.server.fetch import ImageFetcher
from fairagents.server.identities import Identities
from fairagents.server.incoming import context, until_disconnected
from fairagents.server.metrics import Metrics
from fairagents.server.streaming import EventStream, sse_events
from fairagents.tools import OutputSpec

__all__ = ["Gateway", "INLINE_PARSE_BYTES"]

#: Bodies up to this size are parsed on the event loop (microseconds); larger ones in the text pool.
INLINE_PARSE_BYTES = 64 * 2**10

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class Gateway:
    """The server's state: the arbiter, its callers' identities, the views, whether it drains.

    Args:
        arbiter: the arbiter to serve (its models are the pool); the caller starts and closes it.
        config: apps, agents and server settings (``config.models`` is what
            :func:`~fairagents.server.build_arbiter` builds; it is not read here).
        title: the name the dashboard shows.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.server import Config, Gateway
        >>> gateway = Gateway(fa.Arbiter(), Config.model_validate({"apps": {"a": {"api_key": "k"}}}))
        >>> gateway.app_for_key("k"), gateway.app_for_key("nope")
        ('a', None)
    """

    def __init__(self, arbiter: Arbiter, config: Config, *, title: str = "fairagents") -> None:
        self.arbiter = arbiter
        self.config = config
        self.title = title
        self.draining = False
        self.active: dict[str, int] = defaultdict(int)
        """Requests of each model the server waits on (queued or in flight)."""
        server = config.server
        self.view = FairnessView(
            arbiter,
            keep=server.history_seconds,
            max_age=server.views_cache_seconds,
            clients=lambda: self.identities.clients(),
            extra=lambda: {k: {"rejected": v} for k, v in self.identities.rejected.items()},
            models=self.models,
        )
        self.metrics = Metrics(arbiter, self.view, draining=lambda: self.draining, models=self.models,
                               max_apps=server.metrics_max_apps, max_agents=server.metrics_max_agents_per_app)
        self.identities = Identities(arbiter, config, self.view, self.metrics, draining=lambda: self.draining)
        """Apps by key, agents by header, and who reads the views."""
        fetch = server.image_fetch
        self.fetcher = None if fetch is None else ImageFetcher(fetch.allow_hosts, max_bytes=fetch.max_bytes,
                                                                timeout=fetch.timeout, schemes=fetch.schemes,
                                                                max_images=fetch.max_images)
        """Fetches image URLs from allowed hosts when ``server.image_fetch`` is set."""

    def app_for_key(self, key: str) -> str | None:
        """The app whose API key ``key`` is, or ``None``."""
        return self.identities.app_for_key(key)

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
        """Validate a request body as ``model`` (see :meth:`read`)."""
        return await self.read(request, who, functools.partial(wire.parse, model), raw)

    async def read(self, request: Request, who: AgentHandle, reader: Callable[[bytes, RequestLimits], T],
                   raw: bytes) -> T:
        """``reader(raw, limits)``, for a small body at once, for a large one in the text preprocessing pool.

        Parsing megabytes of JSON takes milliseconds to tenths of a second; in the pool
        it queues fairly behind the app's own work, under the app's bound, and the
        event loop keeps serving everyone else meanwhile.
        """
        app = who.identity.app
        context(request).labels = (app.name, who.identity.name, None)
        if len(raw) <= INLINE_PARSE_BYTES:
            return reader(raw, self.arbiter.limits)
        pool = self.arbiter.text_preprocessor
        work = pool.run(reader, raw, self.arbiter.limits, app=app.name, weight=app.weight)
        return await until_disconnected(request, work)

    async def prepare_chat(self, request: Request, who: AgentHandle, body: wire.ChatCompletionRequest,
                           ) -> tuple[Prompt, int]:
        """A chat request admitted, its prompt rendered (:meth:`render`), and its ``max_tokens``.

        A full queue is a 429, tools or a format the model cannot serve a 400: before any tokenizing.
        """
        spec = body.output_spec(self.arbiter.limits)
        self.arbiter.check_admission(body.model, who, output=spec)
        prompt = await self.render(request, who, body, spec)
        max_tokens = body.requested_max_tokens() or self.default_max_tokens(body.model, prompt, who.identity.app.name)
        return prompt, max_tokens

    async def render(self, request: Request, who: AgentHandle, body: wire.ChatCompletionRequest,
                     spec: OutputSpec) -> Prompt:
        """A chat request's prompt, rendered and tokenized off the event loop, in the preprocessing pools (fair by
        app); image URLs on allowed hosts are fetched first (``server.image_fetch``)."""
        messages = body.chat_messages(remote=self.fetcher is not None)
        if self.fetcher is not None:
            messages = await until_disconnected(request, self.fetcher.inline(messages))
        return await until_disconnected(
            request, self.arbiter.prepare_chat(body.model, messages, agent=who, tools=spec.template_tools))

    async def replies(self, request: Request, who: AgentHandle, body: wire.ChatCompletionRequest | wire.CompletionRequest,
                      prompt: Prompt, max_tokens: int, arrival: float | None = None) -> list[Reply]:
        """Run the request's choices (queued at ``arrival``, if it was prepared first) and await their replies.

        Each of ``n`` choices is a request of its own, charged to the caller and scheduled like any
        other; one failing fails the request (the others are cancelled, charged only for what they
        produced). A client that leaves cancels them all.
        """
        chat = isinstance(body, wire.ChatCompletionRequest)
        call: Any = self.arbiter.chat if chat else self.arbiter.complete
        kwargs = self._kwargs(body, max_tokens)
        run = self._labelled(request, who, body.model)
        return await until_disconnected(request, all_choices([
            self._counted(body.model, call(body.model, prompt, agent=who, arrival=arrival, run=run, **kwargs))
            for _ in range(body.choices)]))

    async def streams(self, request: Request, who: AgentHandle, body: wire.ChatCompletionRequest | wire.CompletionRequest,
                      prompt: Prompt, max_tokens: int, arrival: float | None = None,
                      ) -> tuple[Choices, list[tuple[int, Delta | None]]]:
        """Stream the request's choices: ``(choices, head)``, once every choice has its first token.

        An error before then is raised (the answer's status), the choices closed.
        """
        chat = isinstance(body, wire.ChatCompletionRequest)
        stream: Any = self.arbiter.stream_chat if chat else self.arbiter.stream_complete
        kwargs = self._kwargs(body, max_tokens)
        run = self._labelled(request, who, body.model)
        streams = Choices([
            self._tracked(body.model, stream(body.model, prompt, agent=who, arrival=arrival, run=run, **kwargs))
            for _ in range(body.choices)])
        try:
            return streams, await until_disconnected(request, streams.head())
        except BaseException:
            await streams.aclose()
            raise

    async def respond(
        self, request: Request, who: AgentHandle, body: wire.ChatCompletionRequest | wire.CompletionRequest,
        prompt: Prompt, max_tokens: int, arrival: float | None = None,
    ) -> Response:
        """Answer an OpenAI chat or completion request: its choices' replies, or their stream once each has begun."""
        chat = isinstance(body, wire.ChatCompletionRequest)
        model = body.model
        rid = wire.new_id("chatcmpl" if chat else "cmpl")
        if not body.stream:
            replies = await self.replies(request, who, body, prompt, max_tokens, arrival)
            usage = self.reply_usage(prompt, replies)
            if chat:
                choices = [wire.chat_choice(i, None if r.tool_calls and not r.text else r.text, r.finish_reason,
                                            tool_calls=r.tool_calls, logprobs=r.logprobs)
                           for i, r in enumerate(replies)]
                return JSONResponse(wire.chat_completion(rid, model, choices, usage))
            choices = [wire.completion_choice(i, r.text, r.finish_reason, logprobs=r.logprobs)
                       for i, r in enumerate(replies)]
            return JSONResponse(wire.completion(rid, model, choices, usage))
        streams, head = await self.streams(request, who, body, prompt, max_tokens, arrival)
        events = sse_events(rid, model, streams, head, chat=chat, include_usage=body.include_usage,
                            logprobs=bool(self._kwargs(body, max_tokens)["logprobs"]),
                            usage=lambda produced, cached: self.usage(model, prompt, produced, cached))
        return self.event_stream(events, streams)

    def event_stream(self, events: AsyncGenerator[str, None], streams: Choices) -> EventStream:
        """The response sending ``events`` (of ``streams``), cut if the client stops reading."""
        return EventStream(events, streams, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                           stall_timeout=self.config.server.stream_stall_timeout)

    @staticmethod
    def _kwargs(body: wire.ChatCompletionRequest | wire.CompletionRequest, max_tokens: int) -> dict[str, Any]:
        if isinstance(body, wire.ChatCompletionRequest):
            return body.arbiter_kwargs(max_tokens)
        return body.sampling(max_tokens)

    @staticmethod
    def _labelled(request: Request, who: AgentHandle, model: str) -> str | None:
        """Label the request with its model (what a refusal is counted under); its run."""
        ctx = context(request)
        ctx.labels = (who.identity.app.name, who.identity.name, model)
        return ctx.run

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

    @staticmethod
    def reply_usage(prompt: Prompt, replies: list[Reply]) -> wire.Usage:
        """The usage of a request's replies: the prompt once, as OpenAI counts it; what each choice produced."""
        return wire.Usage(prompt_tokens=prompt.n_tokens,
                          completion_tokens=sum(r.usage.completion_tokens for r in replies),
                          unified_tokens=sum(r.usage.unified_tokens for r in replies),
                          cached_tokens=max(r.usage.cached_tokens for r in replies))

    def usage(self, model: str, prompt: Prompt, produced: list[int], cached: list[int]) -> wire.Usage:
        """The usage of a streamed request's choices: the prompt once, as OpenAI counts it; each choice charged it
        (:func:`~fairagents.choices.streamed_charge`)."""
        n = prompt.n_tokens
        unified = streamed_charge(self.arbiter.cost, model, n, produced, cached,
                                  cached_priced=self.arbiter.dispatcher.model(model).in_engine)  # as the ledger
        return wire.Usage(prompt_tokens=n, completion_tokens=sum(produced), unified_tokens=unified,
                          cached_tokens=min(max(cached), n))
