"""Where ``ChatFairAgents`` sends a call: an arbiter in this process, or a fairagents server.

Both speak in :class:`Call` and :class:`Piece`, whole or streamed, from async code
(:meth:`complete`, :meth:`stream`) or sync code (:meth:`complete_sync`,
:meth:`stream_sync`), so the chat model above them is the same. An arbiter is called
through a :class:`~fairagents.Portal`, from whatever loop or thread the caller is on. A
server is reached with the stock ``openai`` client: the app's API key as the bearer
token, the agent in ``X-Fairagents-Agent`` with the weight and SLO it states, which the
server declares it with (``X-Fairagents-Agent-Weight``, ``X-Fairagents-Agent-Slo``; see
:func:`fairagents.identity.identity_headers`), and the app in ``X-Fairagents-App`` when the
server runs without keys; the call's run in ``X-Fairagents-Run``.

Examples:
    >>> call = Call("chat", [{"role": "user", "content": "hi"}], {"max_tokens": 8}, agent=None)
    >>> call.params["max_tokens"]
    8
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from fairagents import AgentHandle, Portal, Reply
from fairagents.identity import Agent, identity_headers
from fairagents.openai_request import OUTPUT_PARAMS
from fairagents.tools import OutputSpec, ToolCall, ToolCallDelta

__all__ = ["OUTPUT_PARAMS", "Call", "LocalBackend", "Piece", "RemoteBackend"]


@dataclass(frozen=True, slots=True)
class Call:
    """One chat call, whoever serves it."""

    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    """As :meth:`fairagents.Arbiter.chat` takes them: max_tokens, temperature, top_p, seed, stop,
    ignore_eos, and those of :data:`OUTPUT_PARAMS` the call sets."""
    agent: AgentHandle | Agent | str | None
    """Who calls; ``None``: the agent bound in context (``fa.acting_as``). A name only for a server."""
    app: str | None = None
    """The app to name to a server that runs without keys (``None``: the calling agent's app)."""
    run: str | None = None
    """The run the call belongs to (read where the call was made: the arbiter's loop may be another's)."""


@dataclass(frozen=True, slots=True)
class Piece:
    """Text produced; the last piece of a call has its finish reason and usage."""

    text: str
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    """``input_tokens``, ``output_tokens``, ``total_tokens`` (LangChain's ``UsageMetadata``)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """What else the server or arbiter told: request id, unified tokens, timing."""
    tool_calls: tuple[ToolCall, ...] = ()
    """The tools a whole reply called."""
    tool_call_deltas: tuple[ToolCallDelta, ...] = ()
    """Pieces of the tool calls of a stream: joined by index, they are its calls."""


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}


class LocalBackend:
    """Calls go to an arbiter in this process, through ``portal`` (from any loop or thread).

    Args:
        portal: the portal onto the arbiter.
        timeout: seconds a call may wait for its reply, or a stream for its next piece
            (queueing included); past it, the request is cancelled and :class:`TimeoutError`
            raised. ``None``: no limit.
    """

    def __init__(self, portal: Portal, timeout: float | None = None) -> None:
        self.portal = portal
        self.arbiter = portal.arbiter
        self.timeout = timeout

    async def complete(self, call: Call) -> Piece:
        return await self.portal.run(self._complete, call)

    def complete_sync(self, call: Call) -> Piece:
        return self.portal.run_sync(self._complete, call)

    def stream(self, call: Call) -> AsyncIterator[Piece]:
        return self.portal.iterate(self._stream, call)

    def stream_sync(self, call: Call) -> Iterator[Piece]:
        return self.portal.iterate_sync(self._stream, call)

    # -- on the arbiter's loop ---------------------------------------------------------

    async def _complete(self, call: Call) -> Piece:
        async with asyncio.timeout(self.timeout):
            reply = await self.arbiter.chat(call.model, call.messages, agent=call.agent, run=call.run, **call.params)
        return _reply_piece(reply)

    async def _stream(self, call: Call) -> AsyncIterator[Piece]:
        # A stream reports no usage: the prompt is prepared first (the engine's own template and
        # tokenizer, off the loop), so its length is known, and sent with the time the call came in.
        arrival = self.arbiter.clock()
        spec = OutputSpec.of(**{name: call.params.get(name) for name in OUTPUT_PARAMS}, limits=self.arbiter.limits)
        self.arbiter.check_admission(call.model, call.agent, output=spec)  # what is refused costs no preparation
        async with asyncio.timeout(self.timeout):
            prompt = await self.arbiter.prepare_chat(
                call.model, call.messages, agent=call.agent, tools=spec.template_tools
            )
        produced = 0
        deltas = self.arbiter.stream_chat(call.model, prompt, agent=call.agent, arrival=arrival, run=call.run,
                                          **call.params)
        async with contextlib.aclosing(deltas):
            while True:
                async with asyncio.timeout(self.timeout):
                    delta = await anext(deltas, None)
                if delta is None:
                    return
                produced += delta.new_tokens
                if delta.finish_reason is None:
                    yield Piece(delta.text, tool_call_deltas=delta.tool_calls)
                    continue
                cost = self.arbiter.cost
                unified = cost.input_cost(call.model, prompt.n_tokens) + cost.output_cost(call.model, produced)
                yield Piece(
                    delta.text, delta.finish_reason, _usage(prompt.n_tokens, produced), {"unified_tokens": unified},
                    tool_call_deltas=delta.tool_calls,
                )


def _reply_piece(reply: Reply) -> Piece:
    return Piece(
        reply.text,
        reply.finish_reason,
        _usage(reply.usage.prompt_tokens, reply.usage.completion_tokens),
        {
            "request_id": reply.request_id,
            "unified_tokens": reply.usage.unified_tokens,
            "queue_wait": reply.timing.queue_wait,
            "ttft": reply.timing.ttft,
            "e2e": reply.timing.e2e,
        },
        tool_calls=reply.tool_calls,
    )


class RemoteBackend:
    """Calls go to a fairagents server through the ``openai`` client.

    Args:
        base_url: the server's OpenAI-compatible root, e.g. ``http://localhost:8000/v1``.
        api_key: the app's API key; ``None`` for a server that runs without keys (the app
            is then named in a header, and no ``Authorization`` is sent: in particular not
            ``OPENAI_API_KEY`` from the environment).
        timeout: seconds the client waits for the server (``None``: the client's default).
        max_retries: how many times the client retries a request that failed in transit
            or was turned away for the moment (connection errors, 408, 409, 429, 5xx).
        http_client, http_async_client: ``httpx`` clients for the sync and async ``openai`` clients.
            By default a connection serves one request and is closed after it, so no
            connection outlives the event loop it was opened on, and nothing is left open
            when the model is dropped; give clients of your own to keep connections alive.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        timeout: float | None = None,
        max_retries: int = 2,
        http_client: Any = None,
        http_async_client: Any = None,
    ) -> None:
        try:
            import openai
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                "a fairagents server is reached with openai: pip install 'fairagents-langgraph[remote]'"
            ) from err
        self._openai = openai
        self.keyed = bool(api_key)
        options: dict[str, Any] = {
            "base_url": base_url,
            "api_key": api_key if self.keyed else "fairagents-no-key",
            "max_retries": max_retries,
        }
        if timeout is not None:
            options["timeout"] = timeout
        limits = openai.DEFAULT_CONNECTION_LIMITS
        unpooled = {"limits": type(limits)(max_connections=limits.max_connections, max_keepalive_connections=0)}
        self.sync = openai.OpenAI(**options, http_client=http_client or openai.DefaultHttpxClient(**unpooled))
        self.aio = openai.AsyncOpenAI(
            **options, http_client=http_async_client or openai.DefaultAsyncHttpxClient(**unpooled)
        )

    def headers(self, call: Call) -> dict[str, Any]:
        """The identity headers of a call: the agent, its run, and the app when the server has no key to go by."""
        headers: dict[str, Any] = identity_headers(call.agent, app=call.app, name_app=not self.keyed, run=call.run)
        if not self.keyed:
            headers["Authorization"] = self._openai.Omit()
        return headers

    def _request(self, call: Call, stream: bool) -> dict[str, Any]:
        params = dict(call.params)
        request: dict[str, Any] = {
            "model": call.model,
            "messages": call.messages,
            "max_tokens": params.pop("max_tokens"),
            "temperature": params.pop("temperature"),
            "top_p": params.pop("top_p"),
            "extra_headers": self.headers(call),
        }
        if (seed := params.pop("seed", None)) is not None:
            request["seed"] = seed
        if stop := params.pop("stop", ()):
            request["stop"] = list(stop)
        if params.pop("ignore_eos", False):
            request["extra_body"] = {"ignore_eos": True}  # vLLM's extension, which the server takes too
        request.update((name, params[name]) for name in OUTPUT_PARAMS if name in params)
        if stream:
            request.update(stream=True, stream_options={"include_usage": True})
        return request

    async def complete(self, call: Call) -> Piece:
        return _completion_piece(await self.aio.chat.completions.create(**self._request(call, stream=False)))

    def complete_sync(self, call: Call) -> Piece:
        return _completion_piece(self.sync.chat.completions.create(**self._request(call, stream=False)))

    async def stream(self, call: Call) -> AsyncIterator[Piece]:
        chunks = await self.aio.chat.completions.create(**self._request(call, stream=True))
        reader = _ChunkReader()
        async with chunks:
            async for chunk in chunks:
                if (piece := reader.feed(chunk)) is not None:
                    yield piece
        if (piece := reader.end()) is not None:
            yield piece

    def stream_sync(self, call: Call) -> Iterator[Piece]:
        reader = _ChunkReader()
        with self.sync.chat.completions.create(**self._request(call, stream=True)) as chunks:
            for chunk in chunks:
                if (piece := reader.feed(chunk)) is not None:
                    yield piece
        if (piece := reader.end()) is not None:
            yield piece


def _server_usage(usage: Any) -> tuple[dict[str, int] | None, dict[str, Any]]:
    if usage is None:
        return None, {}
    extra = {"unified_tokens": u} if (u := getattr(usage, "unified_tokens", None)) is not None else {}
    return _usage(usage.prompt_tokens, usage.completion_tokens), extra


def _completion_piece(completion: Any) -> Piece:
    choice = completion.choices[0]
    usage, extra = _server_usage(completion.usage)
    calls = tuple(
        ToolCall(c.id, c.function.name, c.function.arguments or "") for c in choice.message.tool_calls or ()
    )
    return Piece(
        choice.message.content or "", choice.finish_reason, usage, {"request_id": completion.id, **extra},
        tool_calls=calls,
    )


def _call_delta(delta: Any) -> ToolCallDelta:
    function = delta.function
    return ToolCallDelta(
        delta.index,
        delta.id,
        function.name if function is not None else None,
        (function.arguments if function is not None else None) or "",
    )


class _ChunkReader:
    """Streamed chunks as pieces; the finish reason waits for the usage chunk that ends the stream."""

    def __init__(self) -> None:
        self.finish: str | None = None
        self.ended = False

    def feed(self, chunk: Any) -> Piece | None:
        if chunk.choices:
            choice = chunk.choices[0]
            self.finish = choice.finish_reason or self.finish
            deltas = tuple(_call_delta(d) for d in choice.delta.tool_calls or ())
            if not choice.delta.content and not deltas:
                return None
            return Piece(choice.delta.content or "", tool_call_deltas=deltas)
        self.ended = True
        usage, extra = _server_usage(chunk.usage)
        return Piece("", self.finish or "stop", usage, {"request_id": chunk.id, **extra})

    def end(self) -> Piece | None:
        """The last piece, for a server that sent no usage chunk."""
        return None if self.ended or self.finish is None else Piece("", self.finish)
