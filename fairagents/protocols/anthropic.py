"""Anthropic's Messages API (``POST /v1/messages``): its requests in, its messages, events and errors out.

:func:`read` validates a body into a :class:`MessagesRequest` and translates it into the core
chat request: ``system`` becomes a system message; text and image blocks content parts;
``tool_use`` blocks an assistant's ``tool_calls``; ``tool_result`` blocks ``tool`` messages;
``tools`` (``input_schema``) function tools; ``tool_choice`` ``auto``/``any``/``tool``/``none``
OpenAI's ``auto``/``required``/named/``none`` (``disable_parallel_tool_use``:
``parallel_tool_calls: false``); ``stop_sequences`` ``stop``; ``output_config.format`` (a JSON schema) ``response_format``. The answer is rendered by
:func:`message` (a whole reply) or :func:`events` (a stream: ``message_start``,
``content_block_start``/``_delta``/``_stop`` with ``text_delta`` and ``input_json_delta``,
``message_delta`` with the ``stop_reason`` and usage, ``message_stop``); errors by
:func:`error_body`.

``thinking`` is accepted: the served models produce no thinking blocks, and those a client sends
back are dropped. ``metadata`` changes nothing, but the server's identity rules may read it (``body:metadata.user_id``).

Examples:
    >>> from fairagents.protocols.anthropic import read
    >>> body, chat = read(b'{"model": "chat", "max_tokens": 64, "messages": ['
    ...     b'{"role": "user", "content": "Weather in Oslo?"},'
    ...     b'{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Oslo"}}]},'
    ...     b'{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "12 C"}]}]}')
    >>> [m.role for m in chat.messages], chat.messages[2].tool_call_id, chat.messages[2].content
    (['user', 'assistant', 'tool'], 't1', '12 C')
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, model_validator

from fairagents.choices import Choices
from fairagents.constants import MAX_TOKEN_COUNT
from fairagents.engines.base import Delta
from fairagents.errors import FairAgentsError, InvalidParameterError
from fairagents.limits import DEFAULT_LIMITS, RequestLimits
from fairagents.openai_request import ChatCompletionRequest, parse, refuse_unsupported, validate
from fairagents.protocols.blocks import Block, BlockEvent, Used, Ended, answer_events

__all__ = ["HARMLESS", "CountTokensRequest", "MessageParam", "MessagesRequest", "error_body", "error_type", "events", "message", "read", "read_count",
           "stop_reason", "usage_body"]

#: Fields of a Messages request that change nothing here.
HARMLESS = frozenset({"metadata", "service_tier", "thinking", "cache_control", "context_management", "container",
                      "inference_geo", "speed", "diagnostics", "user_profile_id", "workspace_id"})



class MessageParam(BaseModel):
    """One message of a Messages request: a user's or an assistant's turn, text or content blocks."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    role: Literal["user", "assistant", "system"]
    """``system``: an instruction in the midst of the conversation (as Claude Code sends them)."""
    content: str | list[dict[str, Any]]


class MessagesRequest(BaseModel):
    """The body of ``POST /v1/messages`` (and, without ``max_tokens``, of ``/v1/messages/count_tokens``)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    model: str = Field(min_length=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=MAX_TOKEN_COUNT)
    """Most output tokens: required by ``/v1/messages``."""
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: StrictFloat | None = Field(default=None, ge=0, le=1)
    top_p: StrictFloat | None = Field(default=None, gt=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=0)
    stream: StrictBool = False
    tools: list[dict[str, Any]] | None = None
    """Tools as ``{"name", "description", "input_schema"}``."""
    tool_choice: dict[str, Any] | None = None
    """``{"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}``."""
    output_config: dict[str, Any] | None = None
    """``{"format": {"type": "json_schema", "schema"}}``: structured output, enforced in decoding (``effort`` is
    accepted and changes nothing)."""

    @model_validator(mode="after")
    def _no_unsupported_fields(self) -> MessagesRequest:
        refuse_unsupported(self.model_extra, HARMLESS)
        return self

    def chat(self, limits: RequestLimits = DEFAULT_LIMITS, *, counting: bool = False) -> ChatCompletionRequest:
        """The core chat request this one stands for (``counting``: for ``count_tokens``, no ``max_tokens`` needed)."""
        if self.max_tokens is None and not counting:
            raise InvalidParameterError("max_tokens: Field required", param="max_tokens")
        messages: list[dict[str, Any]] = []
        if self.system:
            messages.append({"role": "system", "content": self.system if isinstance(self.system, str)
                             else _text_of(self.system, "system")})
        for i, m in enumerate(self.messages):
            where = f"messages[{i}].content"
            if m.role == "user":
                messages += _user(m.content, where)
            elif m.role == "assistant":
                messages.append(_assistant(m.content, where))
            else:
                messages.append({"role": "system", "content": m.content if isinstance(m.content, str)
                                 else _text_of(m.content, where)})
        data: dict[str, Any] = {
            "model": self.model, "messages": messages, "max_tokens": self.max_tokens, "stream": self.stream,
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "stop": self.stop_sequences,
            "tools": None if self.tools is None else [_tool(t, i) for i, t in enumerate(self.tools)],
            **_tool_choice(self.tool_choice), "response_format": _format(self.output_config),
        }
        try:
            return validate(ChatCompletionRequest, {k: v for k, v in data.items() if v is not None}, limits)
        except InvalidParameterError as err:
            if err.param == "stop" or (err.param or "").startswith("stop["):
                err.param = "stop_sequences"
            elif err.param == "response_format":
                err.param = "output_config.format"
            raise


class CountTokensRequest(MessagesRequest):
    """The body of ``POST /v1/messages/count_tokens``: a Messages request whose ``max_tokens`` is not needed."""


def read(raw: bytes, limits: RequestLimits = DEFAULT_LIMITS) -> tuple[MessagesRequest, ChatCompletionRequest]:
    """A ``/v1/messages`` body validated, and the core chat request it stands for; an
    :class:`~fairagents.InvalidParameterError` if either is wrong."""
    body = parse(MessagesRequest, raw, limits)
    return body, body.chat(limits)


def read_count(raw: bytes, limits: RequestLimits = DEFAULT_LIMITS) -> tuple[MessagesRequest, ChatCompletionRequest]:
    """:func:`read` for ``/v1/messages/count_tokens`` (``max_tokens`` not needed)."""
    body = parse(CountTokensRequest, raw, limits)
    return body, body.chat(limits, counting=True)


# -- requests in -------------------------------------------------------------------------


def _block(block: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        raise InvalidParameterError(f"{where}: a content block is an object with a 'type'", param=where)
    return block


def _text_of(blocks: Sequence[Any], where: str) -> str:
    texts = []
    for j, block in enumerate(blocks):
        block = _block(block, f"{where}[{j}]")
        if block["type"] != "text" or not isinstance(block.get("text"), str):
            raise InvalidParameterError(f"{where}[{j}]: only text blocks are taken here, not {block['type']!r}",
                                        param=f"{where}[{j}]")
        texts.append(block["text"])
    return "\n".join(texts)


def _image(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if isinstance(source, Mapping) and source.get("type") == "base64":
        media, data = source.get("media_type"), source.get("data")
        if isinstance(media, str) and isinstance(data, str):
            return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if isinstance(source, Mapping) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}  # fetched only from allowed hosts
    raise InvalidParameterError(f"{where}: an image's source is {{'type': 'base64', 'media_type', 'data'}} or "
                                "{'type': 'url', 'url'}", param=where)


def _user(content: str | list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """A user turn: its ``tool_result`` blocks as ``tool`` messages, then the rest as one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    replies, parts = [], []
    for j, block in enumerate(content):
        block = _block(block, f"{where}[{j}]")
        kind = block["type"]
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append(_image(block, f"{where}[{j}]"))
        elif kind == "tool_result" and isinstance(block.get("tool_use_id"), str):
            result = block.get("content", "")
            if isinstance(result, list):  # text blocks, and images the following user message carries
                images = [b for b in result if isinstance(b, Mapping) and b.get("type") == "image"]
                parts += [_image(b, f"{where}[{j}].content") for b in images]
                result = _text_of([b for b in result if b not in images], f"{where}[{j}].content")
            elif not isinstance(result, str):
                raise InvalidParameterError(f"{where}[{j}].content: a tool result is text or content blocks",
                                            param=f"{where}[{j}].content")
            replies.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
        else:
            raise InvalidParameterError(f"{where}[{j}]: a user content block is text, image or tool_result "
                                        f"(with its fields), not {kind!r}", param=f"{where}[{j}]")
    return replies + ([{"role": "user", "content": parts}] if parts else [])


def _assistant(content: str | list[dict[str, Any]], where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts, calls = [], []
    for j, block in enumerate(content):
        block = _block(block, f"{where}[{j}]")
        kind = block["type"]
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and isinstance(block.get("id"), str) and isinstance(block.get("name"), str):
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": json.dumps(block.get("input") or {})}})
        elif kind not in ("thinking", "redacted_thinking"):  # the served models think nothing to send back
            raise InvalidParameterError(f"{where}[{j}]: an assistant content block is text or tool_use (with its "
                                        f"fields), not {kind!r}", param=f"{where}[{j}]")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str) or tool.get("type", "custom") != "custom":
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        raise InvalidParameterError(f"tools[{i}]: a tool is {{'name', 'description', 'input_schema'}}; server tools "
                                    f"({kind!r}) are not supported", param=f"tools[{i}]")
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Mapping[str, Any] | None) -> dict[str, Any]:
    if choice is None:
        return {}
    kind = choice.get("type")
    out: dict[str, Any] = {}
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise InvalidParameterError("tool_choice: {'type': 'tool'} needs the tool's 'name'", param="tool_choice")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif kind in ("auto", "any", "none"):
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    else:
        raise InvalidParameterError(f"tool_choice: type is 'auto', 'any', 'tool' or 'none', not {kind!r}",
                                    param="tool_choice")
    if choice.get("disable_parallel_tool_use") is True and kind != "none":
        out["parallel_tool_calls"] = False
    return out


def _format(config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    form = (config or {}).get("format")
    if form is None:
        return None
    if not isinstance(form, Mapping) or form.get("type") != "json_schema" or not isinstance(form.get("schema"), Mapping):
        raise InvalidParameterError("output_config.format: {'type': 'json_schema', 'schema': {...}}",
                                    param="output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": form["schema"]}}


# -- answers out -------------------------------------------------------------------------


def usage_body(used: Used) -> dict[str, Any]:
    """Anthropic's ``usage`` (input tokens read from the prefix cache apart, as Anthropic counts them), plus
    ``unified_tokens``: what the request was charged."""
    return {"input_tokens": used.prompt_tokens - used.cached_tokens, "output_tokens": used.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": used.cached_tokens,
            "unified_tokens": used.unified_tokens}

def stop_reason(finish_reason: str) -> str:
    """Anthropic's ``stop_reason`` for a finish reason: ``end_turn``, ``max_tokens`` or ``tool_use``.

    Examples:
        >>> from fairagents.protocols.anthropic import stop_reason
        >>> stop_reason("stop"), stop_reason("length"), stop_reason("tool_calls")
        ('end_turn', 'max_tokens', 'tool_use')
    """
    return {"length": "max_tokens", "tool_calls": "tool_use"}.get(finish_reason, "end_turn")


def _content(block: Block) -> dict[str, Any]:
    if block.kind == "text":
        return {"type": "text", "text": block.text}
    try:
        arguments = json.loads(block.text) if block.text.strip() else {}
    except ValueError:  # cut short by max_tokens: what there is, as text
        arguments = {"_partial_json": block.text}
    return {"type": "tool_use", "id": block.id, "name": block.name, "input": arguments}


def message(rid: str, model: str, blocks: Sequence[Block], finish_reason: str, usage: Used) -> dict[str, Any]:
    """A whole answer as Anthropic's ``message`` object.

    Examples:
        >>> from types import SimpleNamespace
        >>> from fairagents.protocols.anthropic import message
        >>> from fairagents.protocols.blocks import Block
        >>> used = SimpleNamespace(prompt_tokens=3, completion_tokens=1, unified_tokens=4.0, cached_tokens=0)
        >>> body = message("msg_1", "chat", [Block("text", 0, "hi")], "stop", used)
        >>> body["content"], body["stop_reason"], body["usage"]["input_tokens"]
        ([{'type': 'text', 'text': 'hi'}], 'end_turn', 3)
    """
    return {"id": rid, "type": "message", "role": "assistant", "model": model,
            "content": [_content(b) for b in blocks], "stop_reason": stop_reason(finish_reason),
            "stop_sequence": None, "usage": usage_body(usage)}


def _sse(event: str, data: dict[str, Any]) -> str:
    """One server-sent event of Anthropic's: its type as the event's name, and as the data's ``type``."""
    return f"event: {event}\ndata: {json.dumps({'type': event, **data}, separators=(',', ':'))}\n\n"


async def events(rid: str, model: str, streams: Choices, head: list[tuple[int, Delta | None]], prompt_tokens: int,
                 usage: Callable[[int, int], Used], failed: Callable[[FairAgentsError], tuple[int, str]],
                 ) -> AsyncGenerator[str, None]:
    """A streamed answer in Anthropic's events, from its first events (``head``) on.

    ``usage(produced, cached)`` prices it for ``message_delta``. An error mid-stream is an ``error`` event, last,
    of ``failed(err)``: its status and the message a client may see.
    """
    cached = max((d.cached_tokens or 0 for _, d in head if d is not None), default=0)
    start = {"id": rid, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None,
             "stop_sequence": None, "usage": {"input_tokens": prompt_tokens - cached, "output_tokens": 0,
                                               "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}}
    yield _sse("message_start", {"message": start})
    try:
        async for told in answer_events(streams, head):
            if isinstance(told, BlockEvent):
                yield _block_event(told)
            else:
                yield _ended(told, usage)
    except FairAgentsError as err:
        status, text = failed(err)
        yield _sse("error", {"error": {"type": error_type(status), "message": text}})
        return
    yield _sse("message_stop", {})


def _block_event(told: BlockEvent) -> str:
    block = told.block
    if told.kind == "start":
        opened = {"type": "text", "text": ""} if block.kind == "text" else \
            {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
        return _sse("content_block_start", {"index": block.index, "content_block": opened})
    if told.kind == "delta":
        piece = {"type": "text_delta", "text": told.piece} if block.kind == "text" else \
            {"type": "input_json_delta", "partial_json": told.piece}
        return _sse("content_block_delta", {"index": block.index, "delta": piece})
    return _sse("content_block_stop", {"index": block.index})


def _ended(ended: Ended, usage: Callable[[int, int], Used]) -> str:
    return _sse("message_delta", {"delta": {"stop_reason": stop_reason(ended.finish_reason), "stop_sequence": None},
                                 "usage": usage_body(usage(ended.produced, ended.cached))})


# -- errors ------------------------------------------------------------------------------

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
          413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status.

    Examples:
        >>> from fairagents.protocols.anthropic import error_type
        >>> error_type(404), error_type(429), error_type(500)
        ('not_found_error', 'rate_limit_error', 'api_error')
    """
    return _TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")


def error_body(status: int, message: str) -> dict[str, Any]:
    """An Anthropic-shaped error: ``{"type": "error", "error": {"type", "message"}}``.

    Examples:
        >>> from fairagents.protocols.anthropic import error_body
        >>> error_body(401, "invalid API key")
        {'type': 'error', 'error': {'type': 'authentication_error', 'message': 'invalid API key'}}
    """
    return {"type": "error", "error": {"type": error_type(status), "message": message}}

