"""OpenAI's Responses API (``POST /v1/responses``), stateless: its requests in, its responses and events out.

:func:`read` validates a body into a :class:`ResponsesRequest` and translates it into the core
chat request: ``instructions`` becomes a system message; ``input`` (a string, or items) the
messages: a message item with ``input_text``/``output_text``/``input_image`` parts, a
``function_call`` an assistant's call, a ``function_call_output`` a ``tool`` message;
function ``tools`` (those of a ``namespace`` tool too) OpenAI's chat tools, ``text.format`` the ``response_format``,
``max_output_tokens`` ``max_tokens``. The answer is rendered by :func:`response` (whole) or
:func:`events` (``response.created``, ``response.output_item.added``,
``response.output_text.delta``, ``response.function_call_arguments.delta``, ...,
``response.completed``).

Nothing is stored: ``previous_response_id`` and ``conversation`` are refused (send the whole
input each time), ``store`` is accepted and every response says ``"store": false``.
``reasoning`` and ``include`` are accepted: the served models produce no reasoning items,
and those a client sends back are dropped. A ``web_search`` tool is left out of what the model
sees (:data:`OPTIONAL_HOSTED_TOOLS`); other hosted tools are refused.

Examples:
    >>> from fairagents.protocols.responses import read
    >>> body, chat = read(b'{"model": "chat", "instructions": "Be brief.", "input": ['
    ...     b'{"role": "user", "content": "Weather in Oslo?"},'
    ...     b'{"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},'
    ...     b'{"type": "function_call_output", "call_id": "c1", "output": "12 C"}]}')
    >>> [m.role for m in chat.messages], chat.messages[2].tool_calls[0].function.name
    (['system', 'user', 'assistant', 'tool'], 'weather')
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, model_validator

from fairagents.choices import Choices
from fairagents.constants import MAX_TOKEN_COUNT
from fairagents.engines.base import Delta
from fairagents.errors import FairAgentsError, InvalidParameterError
from fairagents.limits import DEFAULT_LIMITS, RequestLimits
from fairagents.openai_request import ChatCompletionRequest, parse, refuse_unsupported, validate
from fairagents.protocols.blocks import Block, BlockEvent, Used, answer_events

__all__ = ["HARMLESS", "OPTIONAL_HOSTED_TOOLS", "ResponsesRequest", "events", "namespaces", "read", "response",
           "usage_body"]

#: Fields of a Responses request that change nothing here.
HARMLESS = frozenset({"metadata", "user", "store", "service_tier", "safety_identifier", "prompt_cache_key",
                      "reasoning", "include", "stream_options", "truncation", "background", "client_metadata"})
#: Hosted tools a request may offer that are left out of what the model sees: the served models cannot use them,
#: and a request offering them is served as if it had not (Codex CLI offers ``web_search`` by default).
OPTIONAL_HOSTED_TOOLS = frozenset({"web_search", "web_search_preview"})

_REFUSED = {"previous_response_id": "responses are not stored here: send the whole input with each request",
            "conversation": "conversations are not stored here: send the whole input with each request"}


class ResponsesRequest(BaseModel):
    """The body of ``POST /v1/responses``."""

    model_config = ConfigDict(extra="allow", frozen=True)
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    """Function tools, ``{"type": "function", "name", "description", "parameters", "strict"}``."""
    tool_choice: str | dict[str, Any] | None = None
    """``"auto"``, ``"none"``, ``"required"``, or ``{"type": "function", "name"}``."""
    parallel_tool_calls: StrictBool | None = None
    text: dict[str, Any] | None = None
    """``{"format": {"type": "text" | "json_object" | "json_schema", "name", "schema", "strict"}}``."""
    max_output_tokens: StrictInt | None = Field(default=None, ge=1, le=MAX_TOKEN_COUNT)
    temperature: StrictFloat | None = Field(default=None, ge=0, le=2)
    top_p: StrictFloat | None = Field(default=None, gt=0, le=1)
    seed: StrictInt | None = None
    """vLLM's extension, as on chat completions."""
    stream: StrictBool = False

    @model_validator(mode="after")
    def _no_unsupported_fields(self) -> ResponsesRequest:
        refuse_unsupported(self.model_extra, HARMLESS, _REFUSED)
        return self

    def chat(self, limits: RequestLimits = DEFAULT_LIMITS) -> ChatCompletionRequest:
        """The core chat request this one stands for."""
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            messages.append({"role": "user", "content": self.input})
        else:
            for i, item in enumerate(self.input):
                _item(messages, item, f"input[{i}]")
        data: dict[str, Any] = {
            "model": self.model, "messages": messages, "max_tokens": self.max_output_tokens, "stream": self.stream,
            "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
            "parallel_tool_calls": self.parallel_tool_calls,
            "tools": None if self.tools is None else _tools(self.tools),
            "tool_choice": _tool_choice(self.tool_choice), "response_format": _format(self.text),
        }
        try:
            return validate(ChatCompletionRequest, {k: v for k, v in data.items() if v is not None}, limits)
        except InvalidParameterError as err:
            if err.param == "response_format":
                err.param = "text.format"
            elif err.param == "max_tokens":
                err.param = "max_output_tokens"
            raise


def read(raw: bytes, limits: RequestLimits = DEFAULT_LIMITS) -> tuple[ResponsesRequest, ChatCompletionRequest]:
    """A ``/v1/responses`` body validated, and the core chat request it stands for; an
    :class:`~fairagents.InvalidParameterError` if either is wrong."""
    body = parse(ResponsesRequest, raw, limits)
    return body, body.chat(limits)


# -- requests in -------------------------------------------------------------------------

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def _parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidParameterError(f"{where}: content is text or a list of parts", param=where)
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        text = part.get("text", part.get("refusal")) if isinstance(part, Mapping) else None
        if kind in _TEXT_PARTS and isinstance(text, str):
            parts.append({"type": "text", "text": text})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):  # type: ignore[union-attr]
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})  # type: ignore[index]
        else:
            raise InvalidParameterError(f"{where}[{j}]: a content part is input_text, output_text or input_image "
                                        f"with an image_url (file ids and files are not supported), not {kind!r}",
                                        param=f"{where}[{j}]")
    return parts


def _item(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    """Append what input item ``item`` stands for to ``messages``."""
    kind = item.get("type", "message") if isinstance(item, Mapping) else None
    if kind == "message" and isinstance(item, Mapping) and item.get("role") in ("user", "system", "developer", "assistant"):
        messages.append({"role": item["role"], "content": _parts(item.get("content"), f"{where}.content")})
    elif kind == "function_call" and isinstance(item, Mapping) and isinstance(item.get("call_id"), str) \
            and isinstance(item.get("name"), str):
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item.get("arguments") or ""}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":  # calls of one turn: one assistant message
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output" and isinstance(item, Mapping) and isinstance(item.get("call_id"), str):
        output = item.get("output", "")
        parts = output if isinstance(output, str) else _parts(output, f"{where}.output")
        images = [] if isinstance(parts, str) else [p for p in parts if p["type"] == "image_url"]
        text = parts if isinstance(parts, str) else "\n".join(p["text"] for p in parts if p["type"] == "text")
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        if images:  # a tool message carries text: its images follow as the user's, as for Anthropic's tool results
            messages.append({"role": "user", "content": images})
    elif kind != "reasoning":  # the served models reason nothing to send back
        raise InvalidParameterError(f"{where}: an input item is a message, function_call or function_call_output "
                                    f"(with its fields), not {kind!r}", param=where)


def _tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """Function tools as chat tools, those of a ``namespace`` tool among them; optional hosted tools left out."""
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind in OPTIONAL_HOSTED_TOOLS:
            continue
        if kind == "namespace" and isinstance(tool, Mapping) and isinstance(tool.get("tools"), list):
            out += [_function(t, f"tools[{i}].tools[{j}]") for j, t in enumerate(tool["tools"])]
        else:
            out.append(_function(tool, f"tools[{i}]"))
    return out


def _function(tool: Any, where: str) -> dict[str, Any]:
    kind = tool.get("type") if isinstance(tool, Mapping) else None
    if kind != "function" or not isinstance(tool.get("name"), str):  # type: ignore[union-attr]
        raise InvalidParameterError(f"{where}: function tools only ({{'type': 'function', 'name', 'parameters'}}); "
                                    f"{kind!r} tools are not supported", param=where)
    assert isinstance(tool, Mapping)
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    function.setdefault("parameters", {"type": "object", "properties": {}})
    return {"type": "function", "function": function}


def namespaces(body: ResponsesRequest) -> dict[str, str]:
    """The namespace of each function offered inside a ``namespace`` tool: its calls carry it back."""
    return {t["name"]: tool["name"] for tool in body.tools or () if isinstance(tool, Mapping)
            and tool.get("type") == "namespace" and isinstance(tool.get("name"), str)
            for t in tool.get("tools") or () if isinstance(t, Mapping) and isinstance(t.get("name"), str)}


def _tool_choice(choice: str | Mapping[str, Any] | None) -> str | dict[str, Any] | None:
    if isinstance(choice, Mapping):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise InvalidParameterError("tool_choice: 'auto', 'none', 'required' or {'type': 'function', 'name'}",
                                        param="tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _format(text: Mapping[str, Any] | None) -> dict[str, Any] | None:
    form = (text or {}).get("format")
    if form is None:
        return None
    if not isinstance(form, Mapping) or form.get("type") not in ("text", "json_object", "json_schema"):
        raise InvalidParameterError("text.format: type is 'text', 'json_object' or 'json_schema'", param="text.format")
    if form["type"] != "json_schema":
        return {"type": form["type"]}
    schema = {k: form[k] for k in ("name", "schema", "strict", "description") if form.get(k) is not None}
    return {"type": "json_schema", "json_schema": schema}


# -- answers out -------------------------------------------------------------------------


def usage_body(used: Used) -> dict[str, Any]:
    """The Responses API's ``usage``, plus ``unified_tokens``: what the request was charged."""
    return {"input_tokens": used.prompt_tokens, "input_tokens_details": {"cached_tokens": used.cached_tokens},
            "output_tokens": used.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": used.prompt_tokens + used.completion_tokens, "unified_tokens": used.unified_tokens}

def _item_of(rid: str, block: Block, status: str = "completed", spaces: Mapping[str, str] | None = None,
             ) -> dict[str, Any]:
    item_id = f"{'msg' if block.kind == 'text' else 'fc'}_{rid.removeprefix('resp_')}_{block.index}"
    if block.kind == "text":
        content = [] if status != "completed" else [_text_part(block.text)]
        return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}
    item = {"type": "function_call", "id": item_id, "call_id": block.id, "name": block.name,
            "arguments": block.text if status == "completed" else "", "status": status}
    if spaces and block.name in spaces:
        item["namespace"] = spaces[block.name]
    return item


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response(rid: str, body: ResponsesRequest, chat: ChatCompletionRequest, blocks: Sequence[Block] | None,
             finish_reason: str | None, usage: Used | None, *, created: int | None = None,
             status: str | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``response`` object: done (``blocks``, ``finish_reason`` and ``usage`` given), or in progress.

    A response cut by ``max_output_tokens`` is ``incomplete``.
    """
    if status is None:
        status = "in_progress" if finish_reason is None else "incomplete" if finish_reason == "length" else "completed"
    return {
        "id": rid, "object": "response", "created_at": created or int(time.time()), "status": status,
        "error": error, "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions, "model": body.model,
        "output": [_item_of(rid, b, spaces=namespaces(body)) for b in blocks or ()],
        "parallel_tool_calls": chat.parallel_tool_calls is not False,
        "tool_choice": body.tool_choice or ("auto" if body.tools else "none"),
        "tools": body.tools or [], "temperature": body.temperature, "top_p": body.top_p,
        "max_output_tokens": body.max_output_tokens, "text": body.text or {"format": {"type": "text"}},
        "truncation": "disabled", "store": False, "metadata": (body.model_extra or {}).get("metadata") or {},
        "usage": None if usage is None else usage_body(usage),
    }


async def events(rid: str, body: ResponsesRequest, chat: ChatCompletionRequest, streams: Choices,
                 head: list[tuple[int, Delta | None]], usage: Callable[[int, int], Used],
                 failed: Callable[[FairAgentsError], tuple[int, str]]) -> AsyncGenerator[str, None]:
    """A streamed response in the Responses API's events, from its first events (``head``) on.

    ``usage(produced, cached)`` prices it for ``response.completed``. An error mid-stream ends it with
    ``response.failed``, of ``failed(err)``: its status and the message a client may see.
    """
    created = int(time.time())
    sequence = iter(range(2**62))

    def sse(event: str, **data: Any) -> str:
        payload = json.dumps({"type": event, "sequence_number": next(sequence), **data}, separators=(",", ":"))
        return f"event: {event}\ndata: {payload}\n\n"

    spaces = namespaces(body)
    begun = response(rid, body, chat, None, None, None, created=created)
    yield sse("response.created", response=begun)
    yield sse("response.in_progress", response=begun)
    try:
        async for told in answer_events(streams, head):
            if not isinstance(told, BlockEvent):
                done = response(rid, body, chat, told.blocks, told.finish_reason, usage(told.produced, told.cached),
                                created=created)
                # always response.completed, as vLLM sends it (its status may be incomplete): openai's stream helper
                # and Codex CLI wait for that event, and read the status from the response
                yield sse("response.completed", response=done)
                continue
            block, where = told.block, {"output_index": told.block.index}
            item_id = _item_of(rid, block)["id"]
            if told.kind == "start":
                yield sse("response.output_item.added", **where, item=_item_of(rid, block, "in_progress", spaces))
                if block.kind == "text":
                    yield sse("response.content_part.added", item_id=item_id, **where, content_index=0,
                              part=_text_part(""))
            elif told.kind == "delta" and block.kind == "text":
                yield sse("response.output_text.delta", item_id=item_id, **where, content_index=0, delta=told.piece,
                          logprobs=[])
            elif told.kind == "delta":
                yield sse("response.function_call_arguments.delta", item_id=item_id, **where, delta=told.piece)
            elif block.kind == "text":
                yield sse("response.output_text.done", item_id=item_id, **where, content_index=0, text=block.text,
                          logprobs=[])
                yield sse("response.content_part.done", item_id=item_id, **where, content_index=0,
                          part=_text_part(block.text))
                yield sse("response.output_item.done", **where, item=_item_of(rid, block, spaces=spaces))
            else:
                yield sse("response.function_call_arguments.done", item_id=item_id, **where, name=block.name,
                          arguments=block.text)
                yield sse("response.output_item.done", **where, item=_item_of(rid, block, spaces=spaces))
    except FairAgentsError as err:
        status, text = failed(err)
        code = "rate_limit_exceeded" if status == 429 else "server_error"
        yield sse("response.failed", response=response(rid, body, chat, None, None, None, created=created,
                                                        status="failed", error={"code": code, "message": text}))
