"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

A request is read by :mod:`fairagents.protocols.anthropic` into the core chat request and goes
through the same checks, limits, charging and views as a chat completion; its answer and its
errors have Anthropic's shape. The key comes as ``x-api-key`` or as a bearer key.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from fairagents.protocols import anthropic
from fairagents.protocols.blocks import reply_blocks
from fairagents.server.routes import Caller, accepted, as_sent, core_model, failed, holding
from fairagents.server.wire import Usage, new_id

__all__ = ["router"]

router = APIRouter()
"""The routes of Anthropic's Messages API."""


@router.post("/v1/messages")
@holding
async def messages(request: Request, who: Caller) -> Response:
    """A Messages request: its message, or Anthropic's events with ``stream: true``."""
    gateway, who, (_, chat), arrival = await accepted(request, who, anthropic.read, core_model, as_sent)
    gateway.engine(chat.model)
    prompt, max_tokens = await gateway.prepare_chat(request, who, chat)
    rid = new_id("msg", "_")

    def usage(produced: int, cached: int) -> Usage:
        return gateway.usage(chat.model, prompt, [produced], [cached])

    if not chat.stream:
        [reply] = await gateway.replies(request, who, chat, prompt, max_tokens, arrival)
        return JSONResponse(anthropic.message(rid, chat.model, reply_blocks(reply), reply.finish_reason,
                                              gateway.reply_usage(prompt, [reply])))
    streams, head = await gateway.streams(request, who, chat, prompt, max_tokens, arrival)
    events = anthropic.events(rid, chat.model, streams, head, prompt.n_tokens, usage, failed)
    return gateway.event_stream(events, streams)


@router.post("/v1/messages/count_tokens")
@holding
async def count_tokens(request: Request, who: Caller) -> JSONResponse:
    """The prompt's tokens as the model's template renders it: tokenized in the preprocessing pool, charged nothing."""
    gateway, who, (_, chat), _ = await accepted(request, who, anthropic.read_count, core_model, as_sent)
    gateway.engine(chat.model)
    spec = chat.output_spec(gateway.arbiter.limits)
    prompt = await gateway.render(request, who, chat, spec)
    return JSONResponse({"input_tokens": prompt.n_tokens})

