"""The server's routes, one router per protocol, and the dependencies they share.

| module | routes |
| --- | --- |
| :mod:`~fairagents.server.routes.openai` | OpenAI's ``/v1/chat/completions``, ``/v1/completions``, ``/v1/images/generations``, ``/v1/models`` |
| :mod:`~fairagents.server.routes.anthropic` | Anthropic's ``/v1/messages``, ``/v1/messages/count_tokens`` |
| :mod:`~fairagents.server.routes.responses` | OpenAI's ``/v1/responses`` |
| :mod:`~fairagents.server.routes.views` | ``/v1/fairness``, ``/metrics``, ``/health``, ``/health/live``, ``/dashboard`` |

A route reads the :class:`~fairagents.server.gateway.Gateway` from the app's state
(:data:`GatewayDep`), and the caller through the gateway's checks, which run on the event
loop before it: :data:`Caller` (the calling agent), :data:`CallingApp` (the calling app),
:data:`Observer` (who reads a view).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response

from fairagents.choices import Choices
from fairagents.engines.base import Delta
from fairagents.errors import FairAgentsError
from fairagents.limits import RequestLimits
from fairagents.openai_request import ChatCompletionRequest
from fairagents.reply import Reply
from fairagents.runtime.arbiter import AgentHandle
from fairagents.server.gateway import Gateway
from fairagents.server.incoming import context, error_reply, read_body
from fairagents.server.wire import Usage, new_id

__all__ = ["Caller", "CallingApp", "Events", "GatewayDep", "Observer", "Whole", "accepted", "failed", "gateway_of",
           "holding", "translated"]

T = TypeVar("T")
B = TypeVar("B")



def gateway_of(request: Request) -> Gateway:
    """The gateway of the app serving ``request`` (:func:`~fairagents.server.create_app` puts it in the app's state)."""
    return request.app.state.gateway  # type: ignore[no-any-return]


async def _caller(request: Request) -> AgentHandle:
    return await gateway_of(request).identities.identify(request)


async def _calling_app(request: Request) -> str:
    return await gateway_of(request).identities.authenticate(request)


async def _observer(request: Request) -> str | None:
    return await gateway_of(request).identities.observe(request)


#: The gateway of the app serving the request.
GatewayDep = Annotated[Gateway, Depends(gateway_of)]
#: The calling agent: its app from the key, its name from ``X-Fairagents-Agent``.
Caller = Annotated[AgentHandle, Depends(_caller)]
#: The calling app, from its key.
CallingApp = Annotated[str, Depends(_calling_app)]
#: Who reads a view: ``None`` for all of it, an app's name for its own.
Observer = Annotated[str | None, Depends(_observer)]


def holding(endpoint: Callable[[Request, AgentHandle], Awaitable[Response]],
            ) -> Callable[[Request, AgentHandle], Awaitable[Response]]:
    """``endpoint``, releasing the caller's agent when it ends (see ``Identities.release``)."""
    @functools.wraps(endpoint)
    async def run(request: Request, who: Caller) -> Response:
        try:
            return await endpoint(request, who)
        finally:
            gateway_of(request).identities.release(request)

    return run


async def accepted(request: Request, who: AgentHandle, reader: Callable[[bytes, RequestLimits], T],
                   model: Callable[[T], str] = lambda body: body.model,  # type: ignore[attr-defined]
                   source: Callable[[T], object] = lambda body: body,
                   ) -> tuple[Gateway, AgentHandle, T, float]:
    """A request's body read (bounded in size and time) and parsed by ``reader``: ``(gateway, caller, body, arrival)``.

    ``arrival`` is when its body arrived: it keeps its place in the queue while it is parsed and
    prepared. The caller is the agent the identity rules that read the body (``source(body)``)
    name, if any (:meth:`~fairagents.server.identities.Identities.refine`); the request is
    labelled with it and its model (``model(body)``) for the views.
    """
    gateway = gateway_of(request)
    raw = await read_body(request, gateway.config.server.body_timeout)
    arrival = gateway.arbiter.clock()
    body = await gateway.read(request, who, reader, raw)
    who = await gateway.identities.refine(request, who, source(body))
    context(request).labels = (who.identity.app.name, who.identity.name, model(body))
    return gateway, who, body, arrival


#: What a protocol's route renders a whole answer with: ``(id, request as sent, core request, reply, usage)``.
Whole = Callable[[str, B, ChatCompletionRequest, Reply, Usage], dict[str, Any]]
#: What it renders a stream with: ``(id, request as sent, core request, choices, head, prompt tokens, usage, failed)``.
Events = Callable[[str, B, ChatCompletionRequest, Choices, list[tuple[int, Delta | None]], int,
                   Callable[[int, int], Usage], Callable[[FairAgentsError], tuple[int, str]]],
                  AsyncGenerator[str, None]]


async def translated(request: Request, who: AgentHandle,
                     reader: Callable[[bytes, RequestLimits], tuple[B, ChatCompletionRequest]], prefix: str,
                     whole: Whole[B], events: Events[B]) -> Response:
    """Serve a request of another protocol than chat completions: read into its core chat request, run as a chat,
    answered in the protocol's shape by ``whole`` or, streamed, ``events``; ``prefix`` starts its id."""
    gateway, who, (body, chat), arrival = await accepted(request, who, reader, lambda read: read[1].model,
                                                         lambda read: read[0])  # the rules read it as sent
    gateway.engine(chat.model)
    prompt, max_tokens = await gateway.prepare_chat(request, who, chat)
    rid = new_id(prefix, "_")
    if not chat.stream:
        [reply] = await gateway.replies(request, who, chat, prompt, max_tokens, arrival)
        return JSONResponse(whole(rid, body, chat, reply, gateway.reply_usage(prompt, [reply])))
    streams, head = await gateway.streams(request, who, chat, prompt, max_tokens, arrival)

    def usage(produced: int, cached: int) -> Usage:
        return gateway.usage(chat.model, prompt, [produced], [cached])

    return gateway.event_stream(events(rid, body, chat, streams, head, prompt.n_tokens, usage, failed), streams)


def failed(err: FairAgentsError) -> tuple[int, str]:
    """An error's status and the message a client sees (no server paths or addresses): a protocol's stream tells
    it in its own last event."""
    status, body, _ = error_reply(err)
    return status, body["error"]["message"]
