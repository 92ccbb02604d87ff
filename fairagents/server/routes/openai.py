"""OpenAI's endpoints: chat completions, completions, image generations, and the models.

Each request is charged to the calling agent (:data:`~fairagents.server.routes.Caller`);
what it goes through, cheap checks first, is told in :mod:`fairagents.server.app`.
"""

from __future__ import annotations

import base64
import functools
import time
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

import fairagents.server.wire as wire
from fairagents.engines.base import Prompt
from fairagents.errors import InvalidParameterError, UnknownModelError
from fairagents.identity import Modality
from fairagents.runtime.arbiter import AgentHandle
from fairagents.server.gateway import Gateway
from fairagents.server.incoming import context, read_body, until_disconnected
from fairagents.server.routes import Caller, CallingApp, GatewayDep, accepted, gateway_of, holding

__all__ = ["router"]

router = APIRouter()
"""The OpenAI-compatible routes under ``/v1``."""

M = TypeVar("M", wire.ChatCompletionRequest, wire.CompletionRequest)


async def _accepted(request: Request, who: AgentHandle, kind: type[M]) -> tuple[Gateway, AgentHandle, M, float]:
    """A chat or completion request read, parsed and its model checked: ``(gateway, caller, body, arrival)``."""
    gateway, who, body, arrival = await accepted(request, who, functools.partial(wire.parse, kind))
    gateway.engine(body.model)
    return gateway, who, body, arrival


@router.post("/v1/chat/completions")
@holding
async def chat_completions(request: Request, who: Caller) -> Response:
    gateway, who, body, arrival = await _accepted(request, who, wire.ChatCompletionRequest)
    prompt, max_tokens = await gateway.prepare_chat(request, who, body)
    return await gateway.respond(request, who, body, prompt, max_tokens, arrival)


@router.post("/v1/completions")
@holding
async def completions(request: Request, who: Caller) -> Response:
    gateway, who, body, arrival = await _accepted(request, who, wire.CompletionRequest)
    arbiter = gateway.arbiter
    arbiter.check_admission(body.model, who)
    text = body.single_prompt()
    ready = text if isinstance(text, str) else Prompt(token_ids=tuple(text))
    prompt = await until_disconnected(request, arbiter.prepare_text(body.model, ready, agent=who))
    max_tokens = body.requested_max_tokens() or gateway.default_max_tokens(body.model, prompt, who.identity.app.name)
    return await gateway.respond(request, who, body, prompt, max_tokens, arrival)


@router.post("/v1/images/generations")
@holding
async def images(request: Request, who: Caller) -> Response:
    gateway = gateway_of(request)
    arbiter = gateway.arbiter
    raw = await read_body(request, gateway.config.server.body_timeout)
    body = await gateway.parse(request, who, wire.ImageGenerationRequest, raw)
    image_models = [m for m in arbiter.models if arbiter.engine(m).profile.modality is Modality.IMAGE]
    model = body.model or (image_models[0] if len(image_models) == 1 else None)
    if model is None or model not in arbiter.models:
        raise UnknownModelError(f"no image model {body.model!r} is served; image models: {', '.join(image_models) or 'none'}",
                                model=body.model)
    modality = arbiter.engine(model).profile.modality
    if modality is not Modality.IMAGE:
        raise InvalidParameterError(f"model {model!r} is a {modality.value} model and does not generate images",
                                    model=model, param="model")
    if body.response_format not in (None, "b64_json"):
        raise InvalidParameterError("response_format: images are returned as b64_json (no image URLs are hosted)",
                                    param="response_format")
    ctx = context(request)
    ctx.labels = (who.identity.app.name, who.identity.name, model)
    reply = await until_disconnected(
        request, arbiter.generate_image(model, body.prompt, agent=who, size=body.dimensions(), n=body.n, run=ctx.run)
    )
    data = [{"b64_json": base64.b64encode(png).decode()} for png in reply.png]
    return JSONResponse({"created": int(time.time()), "data": data, "usage": wire.images_usage(wire.Usage(
        prompt_tokens=reply.usage.prompt_tokens, completion_tokens=reply.usage.completion_tokens,
        unified_tokens=reply.usage.unified_tokens))})


def _card(gateway: Gateway, name: str) -> dict[str, Any]:
    engine = gateway.arbiter.engine(name)  # UnknownModelError: a 404
    return {"id": name, "object": "model", "created": int(gateway.view.started), "owned_by": "fairagents",
            "max_model_len": engine.max_model_len, "modality": engine.profile.modality.value}


@router.get("/v1/models")
async def models(gateway: GatewayDep, _: CallingApp) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [_card(gateway, name) for name in gateway.arbiter.models]})


@router.get("/v1/models/{model}")
async def model_card(model: str, gateway: GatewayDep, _: CallingApp) -> JSONResponse:
    return JSONResponse(_card(gateway, model))
