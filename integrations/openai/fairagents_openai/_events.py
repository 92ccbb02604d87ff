"""``chat.completions.parse`` and ``chat.completions.stream`` in process, read back by ``openai``'s own helpers.

``parse`` and ``stream`` take what ``create`` takes, except that ``response_format``
may also be a class (a pydantic model, a dataclass, a ``TypedDict``): it is sent as its
strict JSON schema, and the answer comes back parsed into it. A stream yields
``openai``'s stream events (``content.delta``, ``tool_calls.function.arguments.done``,
...), accumulated by ``openai``'s ``ChatCompletionStreamState``, and adds up to the
``ParsedChatCompletion`` that ``parse`` returns.

Examples:
    >>> from pydantic import BaseModel
    >>> class City(BaseModel):
    ...     name: str
    >>> request, _, _ = structured({"model": "chat", "messages": [], "response_format": City})
    >>> request["response_format"]["json_schema"]["schema"]["required"]
    ['name']
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import openai
from openai.lib._parsing import (
    materialize_input_tools,
    parse_chat_completion,
    type_to_response_format_param,
    validate_input_tools,
)
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ParsedChatCompletion

from fairagents.errors import InvalidParameterError
from fairagents_openai._local import ChatCompletionStream, ChatCompletionSyncStream, given

__all__ = ["ChatCompletionEventStream", "ChatCompletionSyncEventStream", "parsed", "structured"]


def structured(request: Mapping[str, Any], *, strict_tools: bool = False) -> tuple[dict[str, Any], Any, Any]:
    """A ``parse`` or ``stream`` request as ``create`` takes it, and what reading the answer back needs.

    Args:
        request: the call's keyword arguments.
        strict_tools: require every tool to be a strict function (``parse``'s rule, so
            that each call's arguments can be parsed).

    Returns:
        ``create``'s request (a ``response_format`` class as its JSON schema), the
        response format as given, and the tools.

    Raises:
        InvalidParameterError: ``stream=True`` was given (``stream()`` streams; ``parse`` does not).
        ValueError: with ``strict_tools``, a tool that is not a strict function.
        TypeError: a ``response_format`` class that has no JSON schema.

    Examples:
        >>> weather = {"type": "function", "function": {"name": "weather", "parameters": {}}}
        >>> request, response_format, tools = structured({"model": "chat", "messages": [], "tools": [weather]})
        >>> tools == [weather], given(request["response_format"])
        (True, False)
        >>> structured({"model": "chat", "messages": [], "tools": [weather]}, strict_tools=True)
        Traceback (most recent call last):
        ...
        ValueError: `weather` is not strict. Only `strict` function tools can be auto-parsed
    """
    if given(request.get("stream")):
        raise InvalidParameterError("parse() and stream() take no stream=: stream() streams, parse() does not")
    response_format = request["response_format"] if given(request.get("response_format")) else openai.omit
    tools = request["tools"] if given(request.get("tools")) else openai.omit
    tools = validate_input_tools(tools) if strict_tools else materialize_input_tools(tools)
    converted = {name: value for name, value in request.items() if name != "stream"}
    converted.update(response_format=type_to_response_format_param(response_format), tools=tools)
    return converted, response_format, tools


def parsed(completion: ChatCompletion, response_format: Any, tools: Any) -> ParsedChatCompletion[Any]:
    """``completion`` as ``parse`` returns it: content parsed into ``response_format``, calls' arguments parsed.

    Raises:
        openai.LengthFinishReasonError: the answer was cut short by ``max_tokens``.
        pydantic.ValidationError: the content does not fit ``response_format``.
    """
    return parse_chat_completion(response_format=response_format, input_tools=tools, chat_completion=completion)


class ChatCompletionEventStream:
    """What ``chat.completions.stream(...)`` returns in process: ``openai``'s stream events, then the parsed completion.

    Use it as ``openai``'s: ``async with`` it (bad input raises there), iterate the events,
    and ``await stream.get_final_completion()`` for the ``ParsedChatCompletion`` they add
    up to. Leaving ``async with`` early ends the request, charged for what it produced.

    Examples:
        >>> import asyncio
        >>> import fairagents as fa
        >>> from fairagents.testing import FakeEngine
        >>> from fairagents_openai import AsyncFairOpenAI
        >>> arbiter = fa.Arbiter()
        >>> arbiter.add_model("chat", FakeEngine(tokens_per_reply=2))
        >>> client = AsyncFairOpenAI(arbiter, agent=arbiter.app("a").agent("bot"))
        >>> async def main():
        ...     async with arbiter:
        ...         messages = [{"role": "user", "content": "go"}]
        ...         async with client.chat.completions.stream(model="chat", messages=messages) as stream:
        ...             text = "".join([event.delta async for event in stream if event.type == "content.delta"])
        ...             final = await stream.get_final_completion()
        ...     return text, final.choices[0].message.content
        >>> asyncio.run(main())
        ('t0 t1 ', 't0 t1 ')
    """

    def __init__(
        self, open_stream: Callable[[], Awaitable[ChatCompletionStream]], state: ChatCompletionStreamState
    ) -> None:
        self._open_stream = open_stream
        self._state = state
        self._chunks: ChatCompletionStream | None = None
        self._events = self._iterate()

    async def __aenter__(self) -> ChatCompletionEventStream:
        await self._opened()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> ChatCompletionEventStream:
        return self

    async def __anext__(self) -> Any:
        return await self._events.__anext__()

    async def until_done(self) -> ChatCompletionEventStream:
        """Read the stream to its end."""
        async for _ in self:
            pass
        return self

    async def get_final_completion(self) -> ParsedChatCompletion[Any]:
        """Read the stream to its end; the ``ParsedChatCompletion`` it adds up to."""
        await self.until_done()
        return self._state.get_final_completion()

    @property
    def current_completion_snapshot(self) -> Any:
        """The completion accumulated so far."""
        return self._state.current_completion_snapshot

    async def close(self) -> None:
        """Stop the request; what it produced so far is charged."""
        if self._chunks is not None:
            await self._chunks.close()

    async def _opened(self) -> ChatCompletionStream:
        if self._chunks is None:
            self._chunks = await self._open_stream()
        return self._chunks

    async def _iterate(self) -> AsyncIterator[Any]:
        async for chunk in await self._opened():
            for event in self._state.handle_chunk(chunk):
                yield event


class ChatCompletionSyncEventStream:
    """:class:`ChatCompletionEventStream` for sync code: what ``FairOpenAI``'s ``chat.completions.stream(...)`` returns.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.testing import FakeEngine
        >>> from fairagents_openai import FairOpenAI
        >>> arbiter = fa.Arbiter()
        >>> arbiter.add_model("chat", FakeEngine(tokens_per_reply=2))
        >>> messages = [{"role": "user", "content": "go"}]
        >>> with FairOpenAI(arbiter, agent=arbiter.app("a").agent("bot")) as client:
        ...     with client.chat.completions.stream(model="chat", messages=messages) as stream:
        ...         kinds = {event.type for event in stream}
        ...     final = stream.get_final_completion()
        >>> sorted(kinds), final.choices[0].finish_reason
        (['chunk', 'content.delta', 'content.done'], 'stop')
    """

    def __init__(self, open_stream: Callable[[], ChatCompletionSyncStream], state: ChatCompletionStreamState) -> None:
        self._open_stream = open_stream
        self._state = state
        self._chunks: ChatCompletionSyncStream | None = None
        self._events = self._iterate()

    def __enter__(self) -> ChatCompletionSyncEventStream:
        self._opened()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> ChatCompletionSyncEventStream:
        return self

    def __next__(self) -> Any:
        return next(self._events)

    def until_done(self) -> ChatCompletionSyncEventStream:
        """Read the stream to its end."""
        for _ in self:
            pass
        return self

    def get_final_completion(self) -> ParsedChatCompletion[Any]:
        """Read the stream to its end; the ``ParsedChatCompletion`` it adds up to."""
        self.until_done()
        return self._state.get_final_completion()

    @property
    def current_completion_snapshot(self) -> Any:
        """The completion accumulated so far."""
        return self._state.current_completion_snapshot

    def close(self) -> None:
        """Stop the request; what it produced so far is charged."""
        if self._chunks is not None:
            self._chunks.close()

    def _opened(self) -> ChatCompletionSyncStream:
        if self._chunks is None:
            self._chunks = self._open_stream()
        return self._chunks

    def _iterate(self) -> Iterator[Any]:
        for chunk in self._opened():
            yield from self._state.handle_chunk(chunk)
