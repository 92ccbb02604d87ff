"""OpenAI's Responses API, stateless: ``POST /v1/responses``.

A request is read by :mod:`fairagents.protocols.responses` into the core chat request and goes
through the same checks, limits, charging and views as a chat completion; its answer is a
``response`` object, or the Responses API's events. Errors have OpenAI's shape, as for chat.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from fairagents.protocols import responses
from fairagents.protocols.blocks import reply_blocks
from fairagents.server.routes import Caller, accepted, as_sent, core_model, failed, holding
from fairagents.server.wire import Usage, new_id

__all__ = ["router"]

router = APIRouter()
"""The route of OpenAI's Responses API."""


@router.post("/v1/responses")
@holding
async def create_response(request: Request, who: Caller) -> Response:
    """A Responses request: its response object, or the Responses API's events with ``stream: true``."""
    gateway, who, (body, chat), arrival = await accepted(request, who, responses.read, core_model, as_sent)
    gateway.engine(chat.model)
    prompt, max_tokens = await gateway.prepare_chat(request, who, chat)
    rid = new_id("resp", "_")

    def usage(produced: int, cached: int) -> Usage:
        return gateway.usage(chat.model, prompt, [produced], [cached])

    if not chat.stream:
        [reply] = await gateway.replies(request, who, chat, prompt, max_tokens, arrival)
        return JSONResponse(responses.response(rid, body, chat, reply_blocks(reply), reply.finish_reason,
                                               gateway.reply_usage(prompt, [reply])))
    streams, head = await gateway.streams(request, who, chat, prompt, max_tokens, arrival)
    return gateway.event_stream(responses.events(rid, body, chat, streams, head, usage, failed), streams)
