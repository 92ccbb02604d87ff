"""Streamed answers as OpenAI's server-sent events.

:func:`sse_events` turns the deltas of a request's choices (read together by
:class:`~fairagents.choices.Choices`) into chat or completion chunks, usage last, then
``[DONE]``; :class:`EventStream` sends them, cutting a client that stops reading.

Examples:
    >>> import asyncio
    >>> from fairagents.choices import Choices
    >>> from fairagents.engines import Delta
    >>> from fairagents.server.streaming import sse_events
    >>> async def one():
    ...     yield Delta(1, "hi", "stop")
    >>> async def events():
    ...     choices = Choices([one()])
    ...     head = await choices.head()
    ...     stream = sse_events("c1", "chat", choices, head, chat=False, include_usage=False, logprobs=False,
    ...                         usage=lambda produced, cached: None)
    ...     return [event async for event in stream]
    >>> sent = asyncio.run(events())
    >>> len(sent), '"hi"' in sent[0], sent[-1].strip()
    (2, True, 'data: [DONE]')
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

import fairagents.server.wire as wire
from fairagents._logging import get_logger
from fairagents.choices import Choices
from fairagents.engines.base import Delta
from fairagents.errors import FairAgentsError
from fairagents.server.incoming import error_reply

__all__ = ["ABORT_EXTENSION", "EventStream", "Stalled", "sse_events", "within"]

log = get_logger("fairagents.server")

#: The ASGI scope extension under which the server (:mod:`fairagents.server.serve`) hands the
#: app a callable that drops the request's connection at once, unsent bytes and all.
ABORT_EXTENSION = "fairagents.abort"


async def sse_events(
    rid: str, model: str, streams: Choices, head: list[tuple[int, Delta | None]], *, chat: bool,
    include_usage: bool, logprobs: bool, usage: Callable[[list[int], list[int]], wire.Usage],
) -> AsyncGenerator[str, None]:
    """The events of a streamed answer, from its first events (``head``) on.

    ``usage(produced, cached)`` prices the choices' tokens for the last chunk when the
    client asked for it. An error mid-stream (the engine failed, the drain timed out) is
    the last event.
    """
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
        yield wire.sse(error_reply(err)[1])
        return
    finally:
        await streams.aclose()
    build = wire.chat_chunk if chat else wire.completion_chunk
    for i in range(n):
        if not finished[i]:
            yield wire.sse(build(rid, model, created, index=i, finish_reason="stop", include_usage=include_usage))
    if include_usage:
        yield wire.sse(build(rid, model, created, usage=usage(produced, cached)))
    yield wire.sse("[DONE]")


class EventStream(StreamingResponse):
    """An SSE response that always closes its event generator and its choices, however the response ends.

    A response can end before its first event, and then the generator's own cleanup never runs.

    A client that stops reading is cut after ``stall_timeout`` seconds on one send: its
    request ends cancelled, as if it had disconnected (charged only for what it produced,
    its slot and budget freed), and the connection is dropped.
    """

    media_type = "text/event-stream"

    def __init__(self, events: AsyncGenerator[str, None], choices: Choices, headers: dict[str, str],
                 stall_timeout: float) -> None:
        super().__init__(events, headers=headers)
        self._events = events
        self._choices = choices
        self._stall_timeout = stall_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, within(send, scope, self._stall_timeout))
        except Stalled:
            log.info("fairagents.server.stream_stalled", path=scope.get("path"), timeout=self._stall_timeout)
        finally:
            await self._events.aclose()
            await self._choices.aclose()


class Stalled(Exception):
    """The client read nothing of its response for the stall timeout."""


def within(send: Send, scope: Scope, timeout: float) -> Send:
    """``send``, raising :class:`Stalled` past ``timeout`` seconds, after dropping the connection.

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
            raise Stalled() from None

    return bounded
