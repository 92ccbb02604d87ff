"""OpenAI's Responses API, stateless: ``POST /v1/responses``.

A request is read by :mod:`fairagents.protocols.responses` into the core chat request and goes
through the same checks, limits, charging and views as a chat completion; its answer is a
``response`` object, or the Responses API's events. Errors have OpenAI's shape, as for chat.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from fairagents.protocols import responses
from fairagents.protocols.blocks import reply_blocks
from fairagents.server.routes import Caller, holding, translated

__all__ = ["router"]

router = APIRouter()
"""The route of OpenAI's Responses API."""


@router.post("/v1/responses")
@holding
async def create_response(request: Request, who: Caller) -> Response:
    """A Responses request: its response object, or the Responses API's events with ``stream: true``."""
    return await translated(
        request, who, responses.read, "resp",
        lambda rid, body, chat, reply, usage: responses.response(rid, body, chat, reply_blocks(reply),
                                                                 reply.finish_reason, usage),
        lambda rid, body, chat, streams, head, _, usage, failed: responses.events(rid, body, chat, streams, head,
                                                                                  usage, failed))
