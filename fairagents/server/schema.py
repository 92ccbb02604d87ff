"""The served OpenAPI document: request bodies, errors, success bodies and security, as the server answers them.

The endpoints read and validate their JSON bodies themselves (with
:func:`~fairagents.openai_request.parse`, so that a bad body is an OpenAI-shaped 400
before anything is charged), and build their responses as plain dicts, so FastAPI's own
document knows neither bodies nor errors. :func:`install_openapi` completes it, from the
request models of :mod:`~fairagents.openai_request` and a table of what each endpoint
answers:

- the JSON request bodies, tightened where the server is stricter than its pydantic
  model (``stop`` strings not empty, ``seed`` 64-bit, OpenAI's shapes of tools,
  ``tool_choice`` and ``response_format``, unknown fields only when harmless or empty);
  what the model cannot say (a prompt over the context, a tool named twice) is a
  documented 400;
- every error status an endpoint can answer, with OpenAI's error body and the headers
  the server sends (``WWW-Authenticate`` on 401, ``Retry-After`` on 429);
- the success bodies, ``text/event-stream`` for the streaming endpoints, Prometheus text
  for ``/metrics``, and the ``bearer`` security scheme where a key is taken.

The document describes the app's own configuration (``server.auth = false``: an
``X-Fairagents-App`` header instead of a key). The test suite fuzzes a live server
against it.

Examples:
    >>> import fairagents as fa
    >>> from fairagents.server import Config, create_app
    >>> app = create_app(fa.Arbiter(), Config.model_validate({"apps": {"driving": {"api_key": "sk-1"}}}))
    >>> chat = app.openapi()["paths"]["/v1/chat/completions"]["post"]
    >>> sorted(chat["responses"]), chat["security"]
    (['200', '400', '401', '404', '413', '429', '503'], [{'bearer': []}])
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, get_args

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

import fairagents.server.wire as wire
from fairagents.constants import HEADER_AGENT, HEADER_AGENT_SLO, HEADER_AGENT_WEIGHT, HEADER_APP, HEADER_RUN, RUN_PATTERN
from fairagents.labels import OTHER
from fairagents.protocols import anthropic, responses
from fairagents.server.identity_rules import NAME_PATTERN
from fairagents.server.schema_protocols import REQUIRED, SCHEMAS, TWEAKS

__all__ = ["install_openapi"]

_REF = "#/components/schemas/{model}"
_JSON = "application/json"
# FastAPI's schemas for its own 422, which this server never answers (a bad parameter is a 400).
_UNUSED = ("HTTPValidationError", "ValidationError")


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=name)}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [*(schema["anyOf"] if list(schema) == ["anyOf"] else [schema]), {"type": "null"}]}


def _object(required: dict[str, Any], optional: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A JSON object schema: these fields always sent, those sometimes; other fields allowed."""
    return {"type": "object", "properties": {**required, **(optional or {})}, "required": list(required), **extra}


_INT = {"type": "integer", "minimum": 0}
_NUMBER = {"type": "number"}
_STRING = {"type": "string"}

# -- response bodies ----------------------------------------------------------------------

_USAGE = _object(
    {"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT,
     "unified_tokens": {"type": "number", "minimum": 0, "description": "what the request was charged, in unified tokens"}},
    description="OpenAI's `usage`, plus `unified_tokens`.",
)
_FINISH = {"enum": ["stop", "length", "tool_calls"]}
_TOKEN = _object({"token": _STRING, "logprob": {"type": "number", "minimum": -9999.0, "maximum": 0},
                  "bytes": _nullable({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}})})
_CHAT_LOGPROBS = _nullable(_object(
    {"content": _nullable({"type": "array", "items": {"allOf": [
        _TOKEN, _object({"top_logprobs": {"type": "array", "items": _TOKEN}})]}})},
    {"refusal": {"type": "null"}},
    description="With `logprobs: true`: each output token, its log probability (at least -9999) and its "
                "`top_logprobs` most likely alternatives.",
))
_COMPLETION_LOGPROBS = _nullable(_object(
    {"tokens": {"type": "array", "items": _STRING},
     "token_logprobs": {"type": "array", "items": {"type": "number"}},
     "top_logprobs": {"type": "array", "items": {"type": "object", "additionalProperties": {"type": "number"}}},
     "text_offset": {"type": "array", "items": _INT}},
    description="With `logprobs`: each output token, its log probability and its most likely alternatives.",
))
_FUNCTION_CALL = _object({"name": _STRING, "arguments": {**_STRING, "description": "JSON text"}})
_TOOL_CALL = _object({"id": _STRING, "type": {"const": "function"}, "function": _FUNCTION_CALL})
_TOOL_CALL_DELTA = _object(
    {"index": _INT, "function": _object({}, {"name": _STRING, "arguments": _STRING})},
    {"id": _STRING, "type": {"const": "function"}},
    description="A piece of a tool call: its first piece has `id`, `type` and `function.name`; the next ones "
                "carry `function.arguments` text to append.",
)
_CHOICES = {"type": "array", "minItems": 1, "maxItems": wire.MAX_CHOICES}
_CHUNK_CHOICES = {"type": "array", "maxItems": 1}
_PERCENTILES = _object({"p50": _nullable(_NUMBER), "p99": _nullable(_NUMBER)})
_CLIENT = _object(
    {"weight": _NUMBER, "weight_share": _NUMBER, "service": _NUMBER, "share": _NUMBER, "queued": _INT,
     "in_flight": _INT, "done": _INT, "failed": _INT, "cancelled": _INT, "rejected": _INT,
     "wait_seconds": _PERCENTILES, "ttft_seconds": _PERCENTILES,
     "demand_met": {"type": "boolean", "description": "none of its requests waits for dispatch now"},
     "backlogged": {**_nullable(_NUMBER), "description": "fraction of the window's samples in which it had requests waiting"},
     "active": {"type": "boolean", "description": "requests queued or running now, or waiting or served in the last "
                                                  "`entitlement.window_seconds`"},
     "entitled_share": {**_nullable(_NUMBER),
                        "description": "its weight over its active peers' weights; null when idle"},
     "recent_share": {**_nullable(_NUMBER), "description": "its share of its peers' service in the last "
                                                          "`entitlement.window_seconds`; null before any"},
     "below_entitlement": {"type": "boolean",
                           "description": "requests waiting, and `recent_share` short of `entitled_share` by more "
                                          "than `entitlement.tolerance` of it"}},
    description="One app's or agent's standing: service in unified tokens, share against weight share, counts, latencies.",
)
_RESTARTING = {"restarting": {"type": "boolean", "description": "the model is down and being restarted"}}
_MODEL_STATE = _object({"healthy": {"type": "boolean"}, "in_flight": _INT, "in_flight_limit": _nullable(_INT), "queued": _INT},
                       {**_RESTARTING, "device": _STRING})

_RESPONSES: dict[str, dict[str, Any]] = {
    "ErrorResponse": _object(
        {"error": _object({
            "message": _STRING,
            "type": {"enum": list(get_args(wire.ErrorType))},
            "param": _nullable(_STRING),
            "code": _nullable(_STRING),
        })},
        description="OpenAI's error body; the `openai` client raises its usual exception class for the status.",
    ),
    "Usage": _USAGE,
    "ChatCompletion": _object({
        "id": _STRING, "object": {"const": "chat.completion"}, "created": _INT, "model": _STRING,
        "choices": {**_CHOICES, "description": "One per `n`, by `index`.", "items": _object({
            "index": _INT,
            "message": _object({"role": {"const": "assistant"}, "content": _nullable(_STRING)},
                               {"tool_calls": {"type": "array", "minItems": 1, "items": _TOOL_CALL}},
                               description="`content` is null when the model only called tools."),
            "finish_reason": _FINISH,
            "logprobs": _CHAT_LOGPROBS,
        })},
        "usage": _ref("Usage"),
    }, description="`usage.prompt_tokens` counts the prompt once, as OpenAI does; `usage.unified_tokens` is what "
                   "all the choices were charged, each its own prompt and output."),
    "TextCompletion": _object({
        "id": _STRING, "object": {"const": "text_completion"}, "created": _INT, "model": _STRING,
        "choices": {**_CHOICES, "items": _object({
            "index": _INT, "text": _STRING, "finish_reason": _FINISH, "logprobs": _COMPLETION_LOGPROBS,
        })},
        "usage": _ref("Usage"),
    }),
    "ChatCompletionChunk": _object({
        "id": _STRING, "object": {"const": "chat.completion.chunk"}, "created": _INT, "model": _STRING,
        "choices": {**_CHUNK_CHOICES, "items": _object({
            "index": _INT,
            "delta": _object({}, {"role": {"const": "assistant"}, "content": _STRING,
                                  "tool_calls": {"type": "array", "items": _TOOL_CALL_DELTA}}),
            "finish_reason": _nullable(_FINISH),
            "logprobs": _CHAT_LOGPROBS,
        })},
    }, {"usage": {**_nullable(_ref("Usage")),
                  "description": "With `stream_options.include_usage`: null, then the usage on a last chunk without choices."}},
        description="A piece of one choice (`index`); with `n` > 1 the choices' chunks interleave as they are "
                    "generated."),
    "TextCompletionChunk": _object({
        "id": _STRING, "object": {"const": "text_completion"}, "created": _INT, "model": _STRING,
        "choices": {**_CHUNK_CHOICES, "items": _object({
            "index": _INT, "text": _STRING, "finish_reason": _nullable(_FINISH), "logprobs": _COMPLETION_LOGPROBS,
        })},
    }, {"usage": {**_nullable(_ref("Usage")),
                  "description": "With `stream_options.include_usage`: null, then the usage on a last chunk without choices."}}),
    "ImagesUsage": {"allOf": [_USAGE, _object({
        "input_tokens": _INT, "output_tokens": _INT,
        "input_tokens_details": _object({"text_tokens": _INT, "image_tokens": _INT}),
        "output_tokens_details": _object({"text_tokens": _INT, "image_tokens": _INT}),
    })], "description": "OpenAI's images `usage` (the prompt's tokens in, the latent tokens out), with the fields "
                        "of the other endpoints' `usage` and `unified_tokens`."},
    "ImagesResponse": _object({
        "created": _INT,
        "data": {"type": "array", "minItems": 1, "items": _object({"b64_json": {**_STRING, "contentEncoding": "base64",
                                                                               "contentMediaType": "image/png"}})},
        "usage": _ref("ImagesUsage"),
    }, description="The images as base64 PNG; `usage.output_tokens` counts the latent tokens charged."),
    "Model": _object({
        "id": _STRING, "object": {"const": "model"}, "created": _INT, "owned_by": _STRING,
        "max_model_len": _INT, "modality": {"enum": ["text", "vision", "image"]},
    }),
    "ModelList": _object({"object": {"const": "list"}, "data": {"type": "array", "items": _ref("Model")}}),
    "FairnessView": _object(
        {"object": {"const": "fairness"}, "time": _NUMBER, "uptime_seconds": _NUMBER, "policy": _STRING,
         "unit": {"const": "unified_tokens"}, "draining": {"type": "boolean"},
         "models": {"type": "object", "additionalProperties": _MODEL_STATE},
         "pool": _object({"in_flight": _INT, "in_flight_limit": _nullable(_INT)}),
         "entitlement": _object({"window_seconds": _NUMBER, "tolerance": _NUMBER}),
         "apps": {"type": "object", "additionalProperties": {"allOf": [
             _CLIENT, _object({"agents": {"type": "object", "additionalProperties": _CLIENT}})]}},
         "devices": {"type": "object", "description": "Each device's service by app: a device splits its own.",
                     "additionalProperties": _object({"service": _NUMBER, "apps": {
                         "type": "object", "additionalProperties": _object({
                             "service": _NUMBER, "share": _NUMBER, "active": {"type": "boolean"},
                             "entitled_share": _nullable(_NUMBER), "recent_share": _nullable(_NUMBER)})}})},
         "history": _object({
             "interval_seconds": _NUMBER,
             "time": {"type": "array", "items": _NUMBER},
             "apps": {"type": "object", "additionalProperties": {"type": "array", "items": _NUMBER}},
             "agents": {"type": "object", "additionalProperties": {"type": "array", "items": _NUMBER}},
         })},
        description="Per app and per agent: service in unified tokens against entitlement, queues and latencies.",
    ),
    "Health": _object(
        {"status": {"enum": ["ok", "degraded", "down", "draining"]},
         "models": {"type": "object", "additionalProperties": _object({"healthy": {"type": "boolean"}}, _RESTARTING)}},
        {"counters": _object(
            {"backend": {"type": "string"}, "door": {"type": "string"}, "connected": {"type": "boolean"},
             "doors": _INT, "last_sync_age": _nullable(_NUMBER), "syncs": _INT, "failures": _INT},
            description="Counters shared with other servers (`server.counters`): while `connected` is false this "
                        "server serves on its own counters; it still answers `ok`.")},
        description="`ok`: every model serves; `degraded`: a model is down or restarting; `down`: every model; "
                    "`draining`: the server is shutting down.",
    ),
    "Liveness": _object({"status": {"const": "live"}}),
}

# -- errors -------------------------------------------------------------------------------

_HEADER_INT = {"schema": {"type": "integer", "minimum": 0}}
_ERRORS: dict[int, dict[str, Any]] = {
    400: {"description": "Invalid request (`invalid_request_error`; `code` `invalid_parameter`, "
                         "`context_length_exceeded`, `unknown_app` or `unknown_agent`): a body that is not JSON or "
                         "fails validation (numbers and flags are taken as JSON types, strictly: `8.0` is not an "
                         "integer here), an unsupported field, a prompt over the context, an image the model cannot "
                         "take, tools or an output format the model cannot serve, a JSON schema vLLM cannot compile, "
                         "`top_logprobs` past the model's limit, a `logit_bias` token outside its vocabulary, a bad "
                         "app or agent name. Nothing is charged."},
    401: {"description": "Missing or unknown key (`authentication_error`, `invalid_api_key`). Nothing runs.",
          "headers": {"WWW-Authenticate": {"required": True, "schema": {"const": "Bearer"}}}},
    404: {"description": "No such model in the pool (`model_not_found`)."},
    413: {"description": "The request body is over the server's limit (32 MiB)."},
    429: {"description": "The app already has its `max_queued` requests waiting for this model (`rate_limit_error`, "
                         "`queue_full`); retry after about one request's run time.",
          "headers": {"Retry-After": {"required": True, "description": "seconds to wait", **_HEADER_INT},
                      "retry-after-ms": {"required": True, "description": "milliseconds to wait", **_HEADER_INT}}},
    503: {"description": "The model's engine is down (`server_error`, `engine_unavailable`: `x-should-retry: true` "
                         "and `Retry-After` while it restarts, `false` while it stays down until restarted), or the "
                         "server is draining (`shutting_down`).",
          "headers": {"x-should-retry": {"description": "whether the model is coming back", "schema": {"enum": ["true", "false"]}},
                      "Retry-After": {"description": "seconds to wait, while the model restarts", **_HEADER_INT},
                      "retry-after-ms": {"description": "milliseconds to wait, while the model restarts", **_HEADER_INT}}},
}


def _error(status: int, schema: str = "ErrorResponse") -> dict[str, Any]:
    return {**copy.deepcopy(_ERRORS[status]), "content": {_JSON: {"schema": _ref(schema)}}}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": _ref(name)}}}


def _streaming(name: str, what: str) -> dict[str, Any]:
    # Before OpenAPI 3.2 (which names it `itemSchema`), the schema of an event stream describes one event.
    event = _object({"data": {
        "type": "string",
        "if": {"const": "[DONE]"},
        "else": {"contentMediaType": _JSON, "contentSchema": {"anyOf": [_ref(f"{name}Chunk"), _ref("ErrorResponse")]}},
    }}, {"event": _STRING})
    events = (f"With `stream: true`, server-sent events, one `{name}Chunk` each (`data: <JSON>`), an `ErrorResponse` "
              "if the request fails mid-stream, and `data: [DONE]` at the end.")
    return {"description": f"The {what}. {events}",
            "content": {_JSON: {"schema": _ref(name)}, "text/event-stream": {"schema": event}}}


def _events(name: str, event: str, what: str) -> dict[str, Any]:
    """An answer that streams as named events (``event: <type>``, ``data: <JSON>``), as Anthropic's and Responses do."""
    one = _object({"data": {"type": "string", "contentMediaType": _JSON, "contentSchema": _ref(event)}},
                  {"event": _STRING})
    return {"description": f"The {what}. With `stream: true`, server-sent events, one `{event}` each.",
            "content": {_JSON: {"schema": _ref(name)}, "text/event-stream": {"schema": one}}}


# -- the endpoints ------------------------------------------------------------------------

# Who may call an endpoint: an app's key, the observer key (if one is configured), anyone.
_APP, _OBSERVER, _OPEN = "app", "observer", "open"
_INFERENCE = (400, 401, 404, 413, 429, 503)


@dataclass(frozen=True)
class _Endpoint:
    summary: str
    access: str
    ok: dict[str, dict[str, Any]]
    errors: tuple[int, ...] = ()
    body: type[BaseModel] | None = None
    agent: bool = False
    error: str = "ErrorResponse"
    """The schema of its error bodies (Anthropic's endpoints answer in Anthropic's shape)."""
    harmless: frozenset[str] = wire.HARMLESS
    """Fields its body accepts and ignores."""


_ENDPOINTS: dict[tuple[str, str], _Endpoint] = {
    ("/v1/chat/completions", "post"): _Endpoint(
        "Chat completion (tools, structured output, `n` choices, logprobs); streamed as server-sent events with "
        "`stream: true`", _APP,
        {"200": _streaming("ChatCompletion", "chat completion")}, _INFERENCE, wire.ChatCompletionRequest, agent=True),
    ("/v1/completions", "post"): _Endpoint(
        "Text completion of one prompt (text or token ids), `n` choices; streamed with `stream: true`", _APP,
        {"200": _streaming("TextCompletion", "text completion")}, _INFERENCE, wire.CompletionRequest, agent=True),
    ("/v1/images/generations", "post"): _Endpoint(
        "Images from an image model, as base64 PNG", _APP,
        {"200": _json("ImagesResponse", "The images.")}, _INFERENCE, wire.ImageGenerationRequest, agent=True),
    ("/v1/messages", "post"): _Endpoint(
        "Anthropic's Messages API (tools, structured output); streamed as Anthropic's events with `stream: true`",
        _APP, {"200": _events("AnthropicMessage", "AnthropicEvent", "message")}, _INFERENCE,
        anthropic.MessagesRequest, agent=True, error="AnthropicError", harmless=anthropic.HARMLESS),
    ("/v1/messages/count_tokens", "post"): _Endpoint(
        "The tokens of a Messages request's prompt; nothing is charged", _APP,
        {"200": _json("MessageTokensCount", "The prompt's tokens.")}, (400, 401, 404, 413, 503),
        anthropic.CountTokensRequest, agent=True, error="AnthropicError", harmless=anthropic.HARMLESS),
    ("/v1/responses", "post"): _Endpoint(
        "OpenAI's Responses API, stateless (function tools, `text.format`); streamed as its events with "
        "`stream: true`", _APP, {"200": _events("Response", "ResponseEvent", "response")}, _INFERENCE,
        responses.ResponsesRequest, agent=True, harmless=responses.HARMLESS),
    ("/v1/models", "get"): _Endpoint(
        "The models of the pool", _APP, {"200": _json("ModelList", "The models, with their context length and modality.")},
        (400, 401, 503)),
    ("/v1/models/{model}", "get"): _Endpoint(
        "One model of the pool", _APP, {"200": _json("Model", "The model, with its context length and modality.")},
        (400, 401, 404, 503)),
    ("/v1/fairness", "get"): _Endpoint(
        "The live fairness view", _OBSERVER, {"200": _json("FairnessView", "The fairness view.")}, (400, 401)),
    ("/metrics", "get"): _Endpoint(
        "Prometheus metrics", _OBSERVER,
        {"200": {"description": "Prometheus text exposition.", "content": {"text/plain": {"schema": _STRING}}}}, (401,)),
    ("/health", "get"): _Endpoint(
        "Readiness: 200 while every model serves", _OPEN,
        {"200": {"description": "Every model serves.", "content": {_JSON: {"schema": {"allOf": [
            _ref("Health"), {"properties": {"status": {"const": "ok"}}}]}}}},
         "503": {"description": "A model is down or restarting, every model is, or the server is draining.",
                 "content": {_JSON: {"schema": {"allOf": [
                     _ref("Health"), {"properties": {"status": {"enum": ["degraded", "down", "draining"]}}}]}}}}}),
    ("/health/live", "get"): _Endpoint(
        "Liveness: 200 while the process answers", _OPEN, {"200": _json("Liveness", "The process answers.")}),
    ("/dashboard", "get"): _Endpoint(
        "The live fairness page", _OPEN,
        {"200": {"description": "One self-contained HTML page.", "content": {"text/html": {"schema": _STRING}}}}),
}

# -- request bodies -----------------------------------------------------------------------

_ANY_FIELD = {"description": "Accepted and ignored."}
_EMPTY = {
    "enum": [None, False, 0, [], {}],
    "description": "Fields fairagents does not implement are accepted only when empty (null, false, 0, [] or {}); "
                   "set to anything else, they are a 400 rather than silently ignored.",
}
_NON_EMPTY = {"type": "string", "minLength": 1}
_CONTENT_PARTS = {"type": "array", "items": {"oneOf": [
    _object({"type": {"const": "text"}, "text": _STRING}),
    _object({"type": {"const": "image_url"}, "image_url": _object({"url": {
        "type": "string", "pattern": "^data:",
        "description": "A data URL, `data:image/<format>;base64,<data>`: the server fetches nothing for a client.",
    }})}, description="An image, for a vision model (an image sent to any other model is a 400)."),
]}}
_TOOL_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"}
_TOOL = _object({"type": {"const": "function"}, "function": _object(
    {"name": _TOOL_NAME},
    {"description": _STRING,
     "parameters": {"type": "object", "properties": {"type": {"const": "object"}},
                    "description": "A JSON schema of an object: the function's arguments."},
     "strict": _nullable({"type": "boolean"})})})
_NAMED = _object({"type": {"const": "function"}, "function": _object({"name": _TOOL_NAME})})
_TWEAKS: dict[str, dict[str, dict[str, Any]]] = {
    # field -> schema that replaces pydantic's (which cannot see the validators)
    "_sampling": {
        "n": {**_nullable({"type": "integer", "minimum": 1, "maximum": wire.MAX_CHOICES}), "default": None,
              "description": "Choices to generate (default 1): each is a request of its own, charged to the caller "
                             "and scheduled fairly like any other."},
        "seed": {**_nullable({"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}), "default": None},
        "stop": {**_nullable({"anyOf": [_NON_EMPTY, {"type": "array", "items": _NON_EMPTY}]}), "default": None},
        "logit_bias": {**_nullable({"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                                    "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}}),
                       "default": None,
                       "description": "Token id → bias added to its logit (±100 in effect bans or forces it); ids "
                                      "outside the model's vocabulary are a 400."},
    },
    "ChatCompletionRequest": {
        "tools": {**_nullable({"type": "array", "items": _TOOL}), "default": None,
                  "description": "Function tools the model may call (names must differ: a repeated one is a 400)."},
        "tool_choice": {**_nullable({"anyOf": [{"enum": ["none", "auto", "required"]}, _NAMED]}), "default": None,
                        "description": "`auto` by default with tools; `required` and a named function (one of the "
                                       "`tools`, else a 400) are enforced in decoding."},
        "response_format": {**_nullable({"oneOf": [
            _object({"type": {"enum": ["text", "json_object"]}}),
            _object({"type": {"const": "json_schema"}, "json_schema": _object(
                {"name": {"type": "string", "minLength": 1}, "schema": {"type": "object"}},
                {"strict": _nullable({"type": "boolean"}), "description": _STRING})}),
        ]}), "default": None,
            "description": "JSON output enforced in decoding (a schema vLLM cannot compile is a 400)."},
    },
    "CompletionRequest": {
        "prompt": {"anyOf": [
            _NON_EMPTY,
            {"type": "array", "items": _STRING, "minItems": 1, "maxItems": 1, "description": "one prompt per request"},
            {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1, "description": "token ids"},
        ]},
    },
    "ImageGenerationRequest": {
        "size": {**_nullable({"type": "string", "pattern": "^[0-9]+[xX][0-9]+$", "description": "`WIDTHxHEIGHT`"}),
                 "default": None},
        "response_format": {**_nullable({"const": "b64_json"}), "default": None,
                            "description": "Images are returned as `b64_json`: no image URLs are hosted."},
    },
    "ChatMessage": {"content": {**_nullable({"anyOf": [_STRING, _CONTENT_PARTS]}), "default": None},
                    "tool_call_id": {**_nullable({"type": "string", "minLength": 1}), "default": None}},
}
# model -> conditions between its fields, added as `allOf`
_CONDITIONS: dict[str, list[dict[str, Any]]] = {
    "ChatCompletionRequest": [
        {"if": {"properties": {"top_logprobs": {"type": "integer"}}, "required": ["top_logprobs"]},
         "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]}},
    ],
    "ChatMessage": [
        {"if": {"properties": {"role": {"const": "tool"}}},
         "then": {"properties": {"tool_call_id": {"type": "string"}, "content": {"anyOf": [_STRING, _CONTENT_PARTS]}},
                  "required": ["tool_call_id", "content"]}},
        {"if": {"properties": {"tool_calls": {"type": "array", "minItems": 1}}, "required": ["tool_calls"]},
         "then": {"properties": {"role": {"const": "assistant"}}}},
    ],
}


def _describe(schema: dict[str, Any]) -> dict[str, Any]:
    """A model's schema without the docstring's examples, and with plain Markdown code spans."""
    text = schema.get("description")
    if isinstance(text, str):
        text = re.sub(r"``([^`]+)``", r"`\1`", text.split("\n\nExamples:")[0].strip())
        schema["description"] = re.sub(r":\w+:`~?[\w.]*?(\w+)`", r"`\1`", text)
    return schema


def _request_body(model: type[BaseModel], schemas: dict[str, Any], harmless: frozenset[str]) -> dict[str, Any]:
    """Add ``model``'s schema (and the ones it uses) to ``schemas``; the request body that refers to it."""
    schema = model.model_json_schema(ref_template=_REF)
    for name, definition in schema.pop("$defs", {}).items():
        schemas[name] = _tweak(name, _describe(definition))
    schema = _tweak(model.__name__, _describe(schema))
    if issubclass(model, wire.ChatCompletionRequest | wire.CompletionRequest):
        schema = _tweak("_sampling", schema)
    schema["properties"].update({name: dict(_ANY_FIELD) for name in sorted(harmless) if name not in schema["properties"]})
    schema["additionalProperties"] = copy.deepcopy(_EMPTY)
    schemas[model.__name__] = schema
    return {"required": True, "content": {_JSON: {"schema": _ref(model.__name__)}}}


def _tweak(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    for field, replacement in (_TWEAKS.get(name) or TWEAKS.get(name) or {}).items():
        title = schema["properties"][field].get("title")
        schema["properties"][field] = {**copy.deepcopy(replacement), **({"title": title} if title else {})}
    if name in _CONDITIONS:
        schema["allOf"] = copy.deepcopy(_CONDITIONS[name])
    schema["required"] = [*schema.get("required", []), *REQUIRED.get(name, [])]
    return schema


def _header(name: str, description: str) -> dict[str, Any]:
    """A header naming an app or agent: any name but the one ``/metrics`` counts the overflow under."""
    return {"name": name, "in": "header", "required": False, "description": description,
            "schema": {"type": "string", "pattern": NAME_PATTERN.pattern, "not": {"const": OTHER}}}


def _setting(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "description": description, "schema": {"type": "string"}}


def _document(app: FastAPI) -> dict[str, Any]:
    gateway = getattr(app.state, "gateway", None)
    auth = gateway is None or gateway.config.server.auth
    observer = gateway is not None and gateway.config.server.observer_key is not None
    doc = get_openapi(
        title=app.title, version=app.version, openapi_version=app.openapi_version, routes=app.routes,
        description="An OpenAI-compatible API in front of a fair scheduler: the bearer key decides the app, "
                    f"`{HEADER_AGENT}` the agent. Errors have OpenAI's shape.",
    )
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name in _UNUSED:
        schemas.pop(name, None)
    schemas.update(copy.deepcopy(_RESPONSES) | copy.deepcopy(SCHEMAS))
    components["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer",
                   "description": "An app's API key (it decides the app), or the observer key for the read-only views."},
        "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key",
                   "description": "An app's API key as Anthropic's clients send it (Messages API only)."},
    }
    for path, operations in doc.get("paths", {}).items():
        for method, operation in operations.items():
            endpoint = _ENDPOINTS.get((path, method))
            if endpoint is None:
                continue
            keyed = (endpoint.access == _APP and auth) or (endpoint.access == _OBSERVER and observer)
            errors = set(endpoint.errors)
            if not keyed:
                errors.discard(401)
            if endpoint.access == _APP and endpoint.body is None and auth:
                errors.discard(400)  # only a bad X-Fairagents-App (keys off) is a 400 here
            operation["summary"] = endpoint.summary
            operation["responses"] = copy.deepcopy(endpoint.ok) | {str(s): _error(s, endpoint.error) for s in sorted(errors)}
            parameters = [p for p in operation.get("parameters", []) if p.get("in") != "header"]
            if endpoint.agent:
                parameters.append(_header(HEADER_AGENT, "The agent the request is charged to (default: `default`)."))
                parameters += [_setting(HEADER_AGENT_WEIGHT, "The agent's weight within its app, a number > 0 "
                                        "(`2.0`); declares a new agent with it, and must match an agent's declaration."),
                               _setting(HEADER_AGENT_SLO, "The agent's SLO in seconds (`ttft=0.5, tpot=0.05, e2e=4`); "
                                        "as the weight."),
                               {"name": HEADER_RUN, "in": "header", "required": False,
                                "description": "The run (one invocation of an agent workflow) the request belongs to: "
                                               "1 to 128 letters, digits and `_.:@/+=-` (`thread-42/turn-3`); "
                                               "without it the request is a run of its own.",
                                "schema": {"type": "string", "pattern": f"^{RUN_PATTERN}$"}}]
            if endpoint.access == _APP and not auth:
                parameters.append(_header(HEADER_APP, "The app (default: `default`); this server takes no API keys."))
            for parameter in parameters:
                if parameter["name"] == "history":
                    parameter["schema"] = {"type": "number", "minimum": 0}
            if parameters:
                operation["parameters"] = parameters
            if endpoint.body is not None:
                operation["requestBody"] = _request_body(endpoint.body, schemas, endpoint.harmless)
            if keyed:
                operation["security"] = [{"bearer": []}, {"apiKey": []}] if endpoint.error == "AnthropicError" \
                    else [{"bearer": []}]
    fetch = None if gateway is None else gateway.config.server.image_fetch
    if fetch is not None:  # image URLs on allowed hosts are fetched too
        _allow_image_urls(doc, fetch.schemes, fetch.allow_hosts)
    return doc


def _allow_image_urls(node: Any, schemes: list[str], hosts: list[str]) -> None:
    if isinstance(node, dict):
        if node.get("pattern") == "^data:":
            node["pattern"] = "^(data:|" + "|".join(f"{s}://" for s in schemes) + ")"
            node["description"] = (f"A data URL, `data:image/<format>;base64,<data>`, or a {'/'.join(schemes)} URL on "
                                   f"a host this server fetches from ({', '.join(hosts)}); others are a 400.")
        for value in node.values():
            _allow_image_urls(value, schemes, hosts)
    elif isinstance(node, list):
        for value in node:
            _allow_image_urls(value, schemes, hosts)


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` (served at ``/openapi.json``) the complete document, built once on first use.

    Call it once the app exists; the document is built when first asked for, from the
    routes and the configuration (``app.state.gateway``) the app has by then.

    Examples:
        >>> from fastapi import FastAPI
        >>> from fairagents.server.schema import install_openapi
        >>> app = FastAPI()
        >>> @app.get("/v1/models")
        ... async def models() -> dict:
        ...     return {"object": "list", "data": []}
        >>> install_openapi(app)
        >>> app.openapi()["paths"]["/v1/models"]["get"]["security"]
        [{'bearer': []}]
        >>> app.openapi() is app.openapi()
        True
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
