"""The HTTP API: an OpenAI-compatible front door to an arbiter, with app identity from API keys.

:func:`create_app` builds the FastAPI application: a
:class:`~fairagents.server.gateway.Gateway` in its state, the routers of
:mod:`fairagents.server.routes`, and errors in OpenAI's shape. Each request is charged to an agent
of an app: the bearer key decides the app (a missing or unknown key is a 401 and
nothing runs), the ``X-Fairagents-Agent`` header the agent (``default`` otherwise).
With keys off (``server.auth = false``, local use), ``X-Fairagents-App`` names the app.
``X-Fairagents-Run`` names the run (one invocation of an agent workflow) the request
belongs to; without it the request is a run of its own.

Besides OpenAI's chat completions, the server speaks Anthropic's Messages API
(``/v1/messages``, errors in Anthropic's shape, the key also as ``x-api-key``) and OpenAI's
Responses API (``/v1/responses``), each translated into the same chat request
(:mod:`fairagents.protocols`).

What a request goes through, cheap checks first: the key (401), the run id (400), the bounded body
(413), validation (400, nothing charged; large bodies are parsed in the text
preprocessing pool), the model (404 if unknown), then
:meth:`~fairagents.Arbiter.check_admission` (503 while the model is down, 429 with
``Retry-After`` when the app's queue is full) — all before any tokenizing. The prompt
is then rendered once, off the event loop in the preprocessing pools (fair by app),
so its length is known for ``usage`` and for the default ``max_tokens``, and
:meth:`~fairagents.Arbiter.stream_chat` (or ``chat``, ``complete``,
``stream_complete``) queues it with the arrival time of the request, once per choice
(``n``). The server waits for the first token of every choice before it answers, so
an error while queued still gets its status (503 for an engine failure or shutdown);
a client that leaves meanwhile is noticed and its request cancelled (it leaves the
queue, or is aborted in the engine, charged only for tokens produced).

Examples:
    >>> import fairagents as fa
    >>> from fairagents.server import Config, create_app
    >>> from fairagents.testing import FakeEngine
    >>> arbiter = fa.Arbiter()
    >>> arbiter.add_model("chat", FakeEngine())
    >>> app = create_app(arbiter, Config.model_validate({"apps": {"driving": {"api_key": "sk-1"}}}))
    >>> sorted(route.path for route in app.routes if route.path.startswith("/v1"))  # doctest: +NORMALIZE_WHITESPACE
    ['/v1/chat/completions', '/v1/completions', '/v1/fairness', '/v1/images/generations', '/v1/messages',
     '/v1/messages/count_tokens', '/v1/models', '/v1/models/{model}', '/v1/responses']
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import fairagents.server.wire as wire
from fairagents._logging import get_logger
from fairagents.errors import EngineError, FairAgentsError, OverloadedError
from fairagents.protocols import anthropic as anthropic_protocol
from fairagents.runtime.arbiter import Arbiter
from fairagents.server.config import Config
from fairagents.server.gateway import Gateway
from fairagents.server.identities import DEFAULT_APP
from fairagents.server.incoming import ClientGone, context, error_reply
from fairagents.server.routes import anthropic, openai, responses, views
from fairagents.server.schema import install_openapi

__all__ = ["DEFAULT_APP", "Gateway", "create_app"]

log = get_logger("fairagents.server")


def create_app(arbiter: Arbiter, config: Config | None = None, *, title: str = "fairagents") -> FastAPI:
    """The FastAPI application serving ``arbiter``'s models to ``config``'s apps.

    The caller starts and closes the arbiter (:func:`~fairagents.server.serve` does
    both); the app declares the configured apps and agents on it. The :class:`Gateway`
    is at ``app.state.gateway``.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.server import Config, create_app
        >>> app = create_app(fa.Arbiter(), Config.default())
        >>> app.state.gateway.draining
        False
    """
    gateway = Gateway(arbiter, config or Config.default(), title=title)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sampler = asyncio.create_task(gateway.view.run())
        sweeper = asyncio.create_task(gateway.identities.sweep())
        try:
            yield
        finally:
            sampler.cancel()
            sweeper.cancel()
            await asyncio.gather(sampler, sweeper, return_exceptions=True)
            if gateway.fetcher is not None:
                await gateway.fetcher.aclose()

    app = FastAPI(title=f"{title} server", lifespan=lifespan, docs_url=None, redoc_url=None)
    install_openapi(app)
    app.state.gateway = gateway
    for routes in (openai, anthropic, responses, views):
        app.include_router(routes.router)

    @app.exception_handler(FairAgentsError)
    async def _fairagents_error(request: Request, err: FairAgentsError) -> JSONResponse:
        status, body, headers = error_reply(err, arbiter, request.url.path)
        labels = context(request).labels
        if isinstance(err, OverloadedError) and labels is not None and gateway.identities.knows(*labels[:2]):
            # (an agent declared by the refused request itself is undeclared already: its name is kept nowhere)
            gateway.identities.rejected[labels[:2]] += 1
            gateway.metrics.reject(labels[0], labels[1], labels[2] or err.model or "")  # "": refused before its model was read
        if isinstance(err, EngineError):
            log.warning("fairagents.server.engine_unavailable", path=request.url.path, error=str(err))
        return JSONResponse(_shaped(request, status, body), status, headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        kind: wire.ErrorType = "authentication_error" if err.status_code == 401 else "invalid_request_error"
        code = "invalid_api_key" if err.status_code == 401 else None
        return JSONResponse(_shaped(request, err.status_code, wire.error_body(str(err.detail), kind, code)),
                            err.status_code, err.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        param = str(first["loc"][-1]) if first["loc"] else None  # ("query", "history"): the query parameter
        return JSONResponse(_shaped(request, 400, wire.error_body(f"{where}: {first['msg']}", "invalid_request_error",
                                                                  "invalid_parameter", param)), 400)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, err: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it: nginx's "client closed request"

    return app


def _shaped(request: Request, status: int, body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped error body in the shape of the protocol the request spoke: Anthropic's on ``/v1/messages``."""
    if request.url.path.startswith("/v1/messages"):
        return anthropic_protocol.error_body(status, body["error"]["message"])
    return body
