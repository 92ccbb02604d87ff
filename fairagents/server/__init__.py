"""Server mode: an OpenAI-compatible HTTP API in front of one shared arbiter.

When the apps are separate processes, or separate teams, fairness needs one arbiter
they all reach over the network, speaking the protocol their clients already speak.
``fairagents serve --config FILE`` runs it; in code, :func:`create_app` builds the
FastAPI application for an arbiter and :func:`serve` runs it with a graceful SIGTERM.

| module | what it is |
| --- | --- |
| :mod:`~fairagents.server.config` | the configuration (TOML or YAML, pydantic): models, apps and keys, agents, policy |
| :mod:`~fairagents.server.app` | :func:`create_app`: the FastAPI app, its routers, errors in OpenAI's shape |
| :mod:`~fairagents.server.gateway` | the server's state and its way with one request: parse, queue the choices, answer |
| :mod:`~fairagents.server.identities` | apps by API key, agents by header, declared and forgotten; who reads the views |
| :mod:`~fairagents.server.routes` | the routes, a router per protocol (OpenAI's; the views) |
| :mod:`~fairagents.server.streaming` | a request's choices streamed together as server-sent events |
| :mod:`~fairagents.server.incoming` | what a request brings: its bounded body, its key, its context, its client leaving |
| :mod:`~fairagents.server.wire` | OpenAI response bodies; the request models of :mod:`fairagents.openai_request` |
| :mod:`~fairagents.server.schema` | the OpenAPI document at ``/openapi.json``: bodies, errors, security |
| :mod:`~fairagents.server.fetch` | image URLs fetched from allowed hosts only, when configured |
| :mod:`~fairagents.server.fairness` | the live fairness view behind ``/v1/fairness`` |
| :mod:`~fairagents.server.metrics` | Prometheus metrics behind ``/metrics`` |
| :mod:`~fairagents.server.dashboard` | the live fairness page at ``/dashboard`` |
| :mod:`~fairagents.server.serve` | uvicorn in the arbiter's loop; SIGTERM drain; ``fairagents serve`` |

Examples:
    >>> import fairagents as fa
    >>> from fairagents.server import Config, create_app
    >>> from fairagents.testing import FakeEngine
    >>> arbiter = fa.Arbiter(policy="hmfs")
    >>> arbiter.add_model("chat", FakeEngine())
    >>> config = Config.model_validate({"apps": {"driving": {"api_key": "sk-driving", "weight": 2.0}}})
    >>> app = create_app(arbiter, config)     # then: uvicorn, or `async with running(app) as url:`
    >>> app.state.gateway.app_for_key("sk-driving")
    'driving'
"""

from __future__ import annotations

from fairagents.server.app import create_app
from fairagents.server.config import (
    AgentConfig,
    AppConfig,
    Config,
    CountersConfig,
    ImageFetchConfig,
    ModelConfig,
    RestartConfig,
    ServerSettings,
    SLOConfig,
    build_arbiter,
    load_config,
)
from fairagents.server.gateway import Gateway
from fairagents.server.identities import DEFAULT_APP
from fairagents.server.serve import free_socket, main, running, serve

__all__ = [
    "AgentConfig",
    "AppConfig",
    "Config",
    "CountersConfig",
    "DEFAULT_APP",
    "Gateway",
    "ImageFetchConfig",
    "ModelConfig",
    "RestartConfig",
    "SLOConfig",
    "ServerSettings",
    "build_arbiter",
    "create_app",
    "free_socket",
    "load_config",
    "main",
    "running",
    "serve",
]
