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
from fairagents.server.routes import Caller, accepted, holding, translated

__all__ = ["router"]

router = APIRouter()
"""The routes of Anthropic's Messages API."""


@router.post("/v1/messages")
@holding
async def messages(request: Request, who: Caller) -> Response:
    """A Messages request: its message, or Anthropic's events with ``stream: true``."""
    return await translated(
        request, who, anthropic.read, "msg",
        lambda rid, _, chat, reply, usage: anthropic.message(rid, chat.model, reply_blocks(reply), reply.finish_reason,
                                                             usage),
        lambda rid, _, chat, *stream: anthropic.events(rid, chat.model, *stream))


@router.post("/v1/messages/count_tokens")
@holding
async def count_tokens(request: Request, who: Caller) -> JSONResponse:
    """The prompt's tokens as the model's template renders it: tokenized in the preprocessing pool, charged nothing."""
    gateway, who, (_, chat), _ = await accepted(request, who, anthropic.read_count, lambda read: read[1].model,
                                                lambda read: read[0])
    gateway.engine(chat.model)
    prompt = await gateway.render(request, who, chat, chat.output_spec(gateway.arbiter.limits))
    return JSONResponse({"input_tokens": prompt.n_tokens})
