"""The served OpenAPI document's part for Anthropic's Messages and OpenAI's Responses: answers, events, errors.

:mod:`fairagents.server.schema` builds the document; this module holds the schemas of what
``/v1/messages``, ``/v1/messages/count_tokens`` and ``/v1/responses`` answer, as
:mod:`fairagents.protocols` renders it, and the tightenings of their request bodies.

Examples:
    >>> from fairagents.server.schema_protocols import SCHEMAS
    >>> SCHEMAS["AnthropicError"]["properties"]["type"]
    {'const': 'error'}
"""

from __future__ import annotations

from typing import Any

__all__ = ["REQUIRED", "SCHEMAS", "TWEAKS"]

_INT = {"type": "integer", "minimum": 0}
_NUMBER = {"type": "number"}
_STRING = {"type": "string"}
_NULL = {"type": "null"}


def _object(required: dict[str, Any], optional: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {**required, **(optional or {})}, "required": list(required), **extra}


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, _NULL]}


_UNIFIED = {"type": "number", "minimum": 0, "description": "what the request was charged, in unified tokens"}
_ANTHROPIC_USAGE = _object(
    {"input_tokens": _INT, "output_tokens": _INT},
    {"cache_creation_input_tokens": _INT, "cache_read_input_tokens": _INT, "unified_tokens": _UNIFIED},
    description="Anthropic's `usage` (`input_tokens` without those read from the prefix cache), plus `unified_tokens`.")
_ANTHROPIC_BLOCK = {"oneOf": [
    _object({"type": {"const": "text"}, "text": _STRING}),
    _object({"type": {"const": "tool_use"}, "id": _STRING, "name": _STRING, "input": {"type": "object"}}),
]}
_RESPONSE_USAGE = _object(
    {"input_tokens": _INT, "output_tokens": _INT, "total_tokens": _INT},
    {"input_tokens_details": _object({"cached_tokens": _INT}),
     "output_tokens_details": _object({"reasoning_tokens": _INT}), "unified_tokens": _UNIFIED})
_OUTPUT_ITEM = {"oneOf": [
    _object({"type": {"const": "message"}, "id": _STRING, "role": {"const": "assistant"}, "status": _STRING,
             "content": {"type": "array", "items": _object({"type": {"const": "output_text"}, "text": _STRING})}}),
    _object({"type": {"const": "function_call"}, "id": _STRING, "call_id": _STRING, "name": _STRING,
             "arguments": {**_STRING, "description": "JSON text"}, "status": _STRING}),
]}

#: Schemas of the answers, by component name.
SCHEMAS: dict[str, dict[str, Any]] = {
    "AnthropicError": _object(
        {"type": {"const": "error"}, "error": _object({"type": {"enum": [
            "invalid_request_error", "authentication_error", "permission_error", "not_found_error",
            "request_too_large", "rate_limit_error", "api_error", "overloaded_error"]}, "message": _STRING})},
        description="Anthropic's error body; the `anthropic` client raises its usual exception class for the status."),
    "AnthropicMessage": _object({
        "id": _STRING, "type": {"const": "message"}, "role": {"const": "assistant"}, "model": _STRING,
        "content": {"type": "array", "items": _ANTHROPIC_BLOCK},
        "stop_reason": {"enum": ["end_turn", "max_tokens", "tool_use"]}, "stop_sequence": _NULL,
        "usage": _ANTHROPIC_USAGE,
    }, description="The answer: text, then the tools the model called."),
    "AnthropicEvent": _object({"type": {"enum": [
        "message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop", "error"]}}, description="One of Anthropic's stream events; its type is the event's name too."),
    "MessageTokensCount": _object({"input_tokens": _INT}, description="The prompt's tokens, as the model's template "
                                                                      "renders it with the tools."),
    "Response": _object({
        "id": _STRING, "object": {"const": "response"}, "created_at": _INT,
        "status": {"enum": ["completed", "incomplete", "in_progress", "failed"]}, "model": _STRING,
        "output": {"type": "array", "items": _OUTPUT_ITEM}, "parallel_tool_calls": {"type": "boolean"},
        "tool_choice": {"anyOf": [_STRING, {"type": "object"}]}, "tools": {"type": "array"},
        "usage": _or_null(_RESPONSE_USAGE),
    }, {"store": {"const": False}, "incomplete_details": _or_null(_object({"reason": _STRING})),
        "error": _or_null(_object({"code": _STRING, "message": _STRING}))},
        description="The response, not stored (`store` is false): send the whole input with each request."),
    "ResponseEvent": _object({"type": _STRING, "sequence_number": _INT},
                             description="One of the Responses API's stream events (`response.created`, "
                                         "`response.output_text.delta`, ..., `response.completed`)."),
}

#: Tightenings of the request bodies' schemas (field -> schema), where the models cannot say it.
TWEAKS: dict[str, dict[str, dict[str, Any]]] = {
    "MessagesRequest": {
        "max_tokens": {"type": "integer", "minimum": 1, "description": "Most output tokens (required)."},
    },
    "ResponsesRequest": {
        "input": {"anyOf": [{"type": "string", "minLength": 1},
                            {"type": "array", "minItems": 1, "items": {"type": "object"}}],
                  "description": "Text, or items: messages, `function_call`, `function_call_output`."},
    },
}
#: Fields a request body's schema requires that its model leaves optional (it serves two endpoints).
REQUIRED: dict[str, list[str]] = {"MessagesRequest": ["max_tokens"]}
