"""Where ``ChatFairAgents`` sends a call: an arbiter in this process, or a fairagents server.

Both speak in :class:`Call` and :class:`Piece`, so the chat model above them is the same.
A server is reached with the stock ``openai`` client: the app's API key as the bearer
token, the agent in ``X-Fairagents-Agent`` (and the app in ``X-Fairagents-App`` when the
server runs without keys).

Examples:
    >>> call = Call("chat", [{"role": "user", "content": "hi"}], {"max_tokens": 8}, agent=None)
    >>> call.params["max_tokens"]
    8
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from fairagents.arbiter import AgentHandle, Arbiter
from fairagents.identity import Agent, identity_headers

__all__ = ["Call", "LocalBackend", "Piece", "RemoteBackend"]


@dataclass(frozen=True, slots=True)
class Call:
    """One chat call, whoever serves it."""

    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    """max_tokens, temperature, top_p, seed, stop, ignore_eos: as :meth:`fairagents.Arbiter.chat` takes them."""
    agent: AgentHandle | Agent | str | None
    """Who calls; ``None``: the agent bound in context (``fa.acting_as``). A name only for a server."""
    app: str | None = None
    """The app to name to a server that runs without keys (``None``: the calling agent's app)."""


@dataclass(frozen=True, slots=True)
class Piece:
    """Text produced; the last piece of a call has its finish reason and usage."""

    text: str
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    """``input_tokens``, ``output_tokens``, ``total_tokens`` (LangChain's ``UsageMetadata``)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """What else the server or arbiter told: request id, unified tokens, timing."""


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}


class LocalBackend:
    """Calls go through an arbiter in this process (on its event loop)."""

    def __init__(self, arbiter: Arbiter) -> None:
        self.arbiter = arbiter

    async def complete(self, call: Call) -> Piece:
        reply = await self.arbiter.chat(call.model, call.messages, agent=call.agent, **call.params)
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
        )

    async def stream(self, call: Call) -> AsyncIterator[Piece]:
        produced = 0
        deltas = self.arbiter.stream_chat(call.model, call.messages, agent=call.agent, **call.params)
        async with contextlib.aclosing(deltas):
            async for delta in deltas:
                produced += delta.new_tokens
                if delta.finish_reason is None:
                    yield Piece(delta.text)
                    continue
                # A stream reports no usage: count the prompt as the arbiter did (the engine's own
                # tokenizer) and price the whole call as it was charged.
                prompt = self.arbiter.engine(call.model).prepare_chat(call.messages).n_tokens
                unified = self.arbiter.cost.input_cost(call.model, prompt) + self.arbiter.cost.output_cost(
                    call.model, produced
                )
                yield Piece(delta.text, delta.finish_reason, _usage(prompt, produced), {"unified_tokens": unified})


class RemoteBackend:
    """Calls go to a fairagents server through the ``openai`` client.

    Args:
        base_url: the server's OpenAI-compatible root, e.g. ``http://localhost:8000/v1``.
        api_key: the app's API key; ``None`` for a server that runs without keys (the app
            is then named in a header, and no ``Authorization`` is sent: in particular not
            ``OPENAI_API_KEY`` from the environment).
        http_client, http_async_client: ``httpx`` clients for the sync and async ``openai`` clients.
    """

    def __init__(
        self, base_url: str, api_key: str | None, *, http_client: Any = None, http_async_client: Any = None
    ) -> None:
        try:
            import openai
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                "a fairagents server is reached with openai: pip install 'fairagents-langgraph[remote]'"
            ) from err
        self._openai = openai
        self.keyed = bool(api_key)
        options: dict[str, Any] = {"base_url": base_url, "api_key": api_key if self.keyed else "fairagents-no-key"}
        self.sync = openai.OpenAI(**options, http_client=http_client)
        self.aio = openai.AsyncOpenAI(**options, http_client=http_async_client)

    def headers(self, call: Call) -> dict[str, Any]:
        """The identity headers of a call: the agent, and the app when the server has no key to go by."""
        headers: dict[str, Any] = identity_headers(call.agent, app=call.app, name_app=not self.keyed)
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
    return Piece(choice.message.content or "", choice.finish_reason, usage, {"request_id": completion.id, **extra})


class _ChunkReader:
    """Streamed chunks as pieces; the finish reason waits for the usage chunk that ends the stream."""

    def __init__(self) -> None:
        self.finish: str | None = None
        self.ended = False

    def feed(self, chunk: Any) -> Piece | None:
        if chunk.choices:
            choice = chunk.choices[0]
            self.finish = choice.finish_reason or self.finish
            return Piece(choice.delta.content) if choice.delta.content else None
        self.ended = True
        usage, extra = _server_usage(chunk.usage)
        return Piece("", self.finish or "stop", usage, {"request_id": chunk.id, **extra})

    def end(self) -> Piece | None:
        """The last piece, for a server that sent no usage chunk."""
        return None if self.ended or self.finish is None else Piece("", self.finish)
