"""The OpenAI wire format of the server: the response bodies it sends, and the request models it reads.

The request models, and :func:`parse`, are :mod:`fairagents.openai_request`'s (shared
with the in-process clients), re-exported here. Responses are plain dicts built by
functions, since stream chunks are on the hot path; their shape is the one the
``openai`` client parses. ``usage`` carries one extra field, ``unified_tokens``: what
the request was charged. Errors a client sees hide the server's file paths and network
addresses (:func:`redact_paths`, :func:`redact_addresses`).
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from fairagents.http_errors import ErrorType
from fairagents.http_errors import error_body as _error_body
from fairagents.limits import MAX_TOP_LOGPROBS
from fairagents.openai_request import (HARMLESS, MAX_CHOICES, MAX_COMPLETION_LOGPROBS, ChatCompletionRequest,
                                       ChatMessage, CompletionRequest, ImageGenerationRequest, StreamOptions, parse)
from fairagents.reply import TokenLogprob
from fairagents.tools import ToolCall, ToolCallDelta, merge_pieces

__all__ = [
    "HARMLESS",
    "MAX_CHOICES",
    "MAX_COMPLETION_LOGPROBS",
    "MAX_TOP_LOGPROBS",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ErrorType",
    "ImageGenerationRequest",
    "StreamOptions",
    "Usage",
    "chat_choice",
    "chat_chunk",
    "chat_completion",
    "chat_logprobs",
    "completion",
    "completion_choice",
    "completion_chunk",
    "completion_logprobs",
    "error_body",
    "finite",
    "images_usage",
    "new_id",
    "parse",
    "redact_addresses",
    "redact_paths",
    "sse",
]


class Usage(BaseModel):
    """``usage`` of a response: raw token counts and the unified tokens charged.

    Examples:
        >>> from fairagents.server.wire import Usage
        >>> Usage(prompt_tokens=3, completion_tokens=2, unified_tokens=1.5).as_dict()["total_tokens"]
        5
    """

    model_config = ConfigDict(frozen=True)
    prompt_tokens: int
    completion_tokens: int
    unified_tokens: float
    cached_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The OpenAI ``usage`` object, plus ``unified_tokens`` (and OpenAI's ``prompt_tokens_details`` on a prefix-cache hit)."""
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "unified_tokens": self.unified_tokens,
        }
        if self.cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage


def new_id(prefix: str, sep: str = "-") -> str:
    """A response id such as ``chatcmpl-…`` (``msg_…`` and ``resp_…`` with ``sep="_"``, as Anthropic and Responses
    write theirs)."""
    return f"{prefix}{sep}{uuid.uuid4().hex}"


def _finish(reason: str | None) -> str | None:
    if reason is None:
        return None
    return reason if reason in ("length", "tool_calls") else "stop"


def chat_logprobs(tokens: Sequence[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's ``logprobs``: ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}, ...]}``.

    Examples:
        >>> from fairagents.reply import TokenLogprob
        >>> from fairagents.server.wire import chat_logprobs
        >>> chat_logprobs([TokenLogprob("hi", -0.5)])
        {'content': [{'token': 'hi', 'logprob': -0.5, 'bytes': [104, 105], 'top_logprobs': []}], 'refusal': None}
    """
    return {"content": [t.as_openai() for t in tokens], "refusal": None}


def completion_logprobs(tokens: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """A completion choice's ``logprobs`` (the legacy shape); ``offset``: characters of output before these tokens.

    Examples:
        >>> from fairagents.reply import TokenLogprob
        >>> from fairagents.server.wire import completion_logprobs
        >>> completion_logprobs([TokenLogprob("a", -1.0, top=(TokenLogprob("a", -1.0),)), TokenLogprob("b", -2.0)], 3)
        {'tokens': ['a', 'b'], 'token_logprobs': [-1.0, -2.0], 'top_logprobs': [{'a': -1.0}, {}], 'text_offset': [3, 4]}
    """
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
    entries = [t.as_openai() for t in tokens]
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{alt["token"]: alt["logprob"] for alt in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


def chat_choice(
    index: int, content: str | None, finish_reason: str, *, tool_calls: Sequence[ToolCall] = (),
    logprobs: Sequence[TokenLogprob] | None = None,
) -> dict[str, Any]:
    """One choice of a chat completion: the message (its ``tool_calls``, if any), why it ended, its logprobs.

    Examples:
        >>> from fairagents.server.wire import chat_choice
        >>> from fairagents.tools import ToolCall
        >>> choice = chat_choice(0, None, "tool_calls", tool_calls=[ToolCall("call_1", "weather", '{"city": "Oslo"}')])
        >>> message = choice["message"]
        >>> message["content"], message["tool_calls"][0]["function"]["name"], choice["finish_reason"]
        (None, 'weather', 'tool_calls')
    """
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [call.as_openai() for call in tool_calls]
    return {"index": index, "message": message, "finish_reason": _finish(finish_reason),
            "logprobs": None if logprobs is None else chat_logprobs(logprobs)}


def chat_completion(rid: str, model: str, choices: list[dict[str, Any]], usage: Usage) -> dict[str, Any]:
    """The body of a non-streaming chat completion, of :func:`chat_choice` ``choices``.

    Examples:
        >>> from fairagents.server.wire import Usage, chat_choice, chat_completion
        >>> usage = Usage(prompt_tokens=3, completion_tokens=1, unified_tokens=5.0)
        >>> body = chat_completion("chatcmpl-1", "chat", [chat_choice(0, "hi", "length")], usage)
        >>> body["choices"][0]["message"], body["choices"][0]["finish_reason"]
        ({'role': 'assistant', 'content': 'hi'}, 'length')
    """
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage.as_dict(),
    }


def chat_chunk(
    rid: str, model: str, created: int, *, index: int = 0, content: str | None = None, role: bool = False,
    tool_calls: Sequence[ToolCallDelta] = (), logprobs: Sequence[TokenLogprob] | None = None,
    finish_reason: str | None = None, usage: Usage | None = None, include_usage: bool = False,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` of a stream, for choice ``index``; with ``usage``, the last chunk (no choices).

    Examples:
        >>> from fairagents.server.wire import chat_chunk
        >>> chat_chunk("c1", "chat", 0, content="", role=True)["choices"][0]["delta"]
        {'role': 'assistant', 'content': ''}
        >>> from fairagents.tools import ToolCallDelta
        >>> chat_chunk("c1", "chat", 0, index=1, tool_calls=[ToolCallDelta(0, arguments='{"a"')])["choices"][0]["delta"]
        {'tool_calls': [{'index': 0, 'function': {'arguments': '{"a"'}}]}
    """
    body: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    if usage is not None:
        body["choices"] = []
        body["usage"] = usage.as_dict()
        return body
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    if tool_calls:
        delta["tool_calls"] = [piece.as_openai() for piece in merge_pieces(tool_calls)]  # one entry per call
    body["choices"] = [{"index": index, "delta": delta, "finish_reason": _finish(finish_reason),
                        "logprobs": None if logprobs is None else chat_logprobs(logprobs)}]
    if include_usage:
        body["usage"] = None
    return body


def completion_choice(
    index: int, text: str, finish_reason: str, *, logprobs: Sequence[TokenLogprob] | None = None,
) -> dict[str, Any]:
    """One choice of a text completion.

    Examples:
        >>> from fairagents.server.wire import completion_choice
        >>> completion_choice(1, "and", "stop")
        {'index': 1, 'text': 'and', 'finish_reason': 'stop', 'logprobs': None}
    """
    return {"index": index, "text": text, "finish_reason": _finish(finish_reason),
            "logprobs": None if logprobs is None else completion_logprobs(logprobs)}


def completion(rid: str, model: str, choices: list[dict[str, Any]], usage: Usage) -> dict[str, Any]:
    """The body of a non-streaming text completion, of :func:`completion_choice` ``choices``.

    Examples:
        >>> from fairagents.server.wire import Usage, completion, completion_choice
        >>> usage = Usage(prompt_tokens=1, completion_tokens=1, unified_tokens=3.0)
        >>> completion("cmpl-1", "chat", [completion_choice(0, "and", "stop")], usage)["object"]
        'text_completion'
    """
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage.as_dict(),
    }


def completion_chunk(
    rid: str, model: str, created: int, *, index: int = 0, text: str = "", offset: int = 0,
    logprobs: Sequence[TokenLogprob] | None = None, finish_reason: str | None = None,
    usage: Usage | None = None, include_usage: bool = False,
) -> dict[str, Any]:
    """One chunk of a streamed text completion (``offset``: characters of choice ``index`` sent before it);
    with ``usage``, the last chunk (no choices).

    Examples:
        >>> from fairagents.server.wire import completion_chunk
        >>> completion_chunk("c1", "chat", 0, text="x")["choices"][0]["text"]
        'x'
    """
    body: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created, "model": model}
    if usage is not None:
        body["choices"] = []
        body["usage"] = usage.as_dict()
        return body
    body["choices"] = [{"index": index, "text": text, "finish_reason": _finish(finish_reason),
                        "logprobs": None if logprobs is None else completion_logprobs(logprobs, offset)}]
    if include_usage:
        body["usage"] = None
    return body


def images_usage(usage: Usage) -> dict[str, Any]:
    """``usage`` of an image generation, in the fields of OpenAI's images API and of the others.

    The prompt's tokens are the input (all text), the latent tokens the denoiser
    processed the output (all image).

    Examples:
        >>> from fairagents.server.wire import Usage, images_usage
        >>> body = images_usage(Usage(prompt_tokens=4, completion_tokens=512, unified_tokens=600.0))
        >>> body["input_tokens"], body["output_tokens"], body["total_tokens"], body["input_tokens_details"]
        (4, 512, 516, {'text_tokens': 4, 'image_tokens': 0})
    """
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"text_tokens": usage.prompt_tokens, "image_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"text_tokens": 0, "image_tokens": usage.completion_tokens},
        **usage.as_dict(),
    }


def error_body(message: str, type: ErrorType, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-shaped error body; file paths in ``message`` are hidden (:func:`redact_paths`).

    Examples:
        >>> from fairagents.server.wire import error_body
        >>> error_body("bad", "invalid_request_error", "invalid_parameter")
        {'error': {'message': 'bad', 'type': 'invalid_request_error', 'param': None, 'code': 'invalid_parameter'}}
    """
    return _error_body(redact_addresses(redact_paths(message)), type, code, param)


# An absolute or home-relative path of two or more parts, or a file: URL; not "image/png" or "a/b".
_PATH = re.compile(r"file:\S*|(?<![\w:/.~-])~?/(?:[\w.@+-]+/)+[\w.@+-]*")


def redact_paths(message: str) -> str:
    """``message`` with the server's file paths replaced by ``<path>``.

    An error a client sees may wrap a library's message (a template error, an engine
    failure) that names files on the server: where the model lies, which libraries are
    installed, the user's home. The server log keeps the full message.

    Examples:
        >>> from fairagents.server.wire import redact_paths
        >>> redact_paths("model 'chat' failed: OSError('/home/ops/.cache/models/llama/config.json not found')")
        "model 'chat' failed: OSError('<path> not found')"
        >>> redact_paths("send data:image/png;base64,<data>, not file:///etc/passwd or ~/secrets/key")
        'send data:image/png;base64,<data>, not <path> or <path>'
    """
    return _PATH.sub("<path>", message)


# A URL with a host (http://replica:8000/v1, redis://10.0.0.5:6379/0); an IPv4 address, with its port if
# it has one (10.0.0.5:6379, ('10.0.0.5', 6379)); an IPv6 address in brackets ([::1]:8000) or quoted in
# a socket address (('::1', 8000, 0, 0)); a host name with its port (replica-2.internal:8000). A host
# name has a letter, and a port 2-5 digits that no ``:`` or ``.`` and digit follow: ``3:1``, ``12:30``
# and ``08:46:30`` are not addresses.
_ADDRESS = re.compile(
    r"(?<![\w+.-])[a-zA-Z][\w+.-]*://[^\s'\"<>()]+"
    r"|'?\b\d{1,3}(?:\.\d{1,3}){3}\b(?::\d+|', ?\d+)?"
    r"|\[[0-9a-fA-F]*:[0-9a-fA-F]*:[0-9a-fA-F:.]*(?:%\w+)?\](?::\d{1,5})?"
    r"|'[0-9a-fA-F]*:[0-9a-fA-F]*:[0-9a-fA-F:.]*(?:%\w+)?'(?:, ?\d+){0,3}"
    r"|(?<![\w.-])(?=[\w.-]*[a-zA-Z])[a-zA-Z0-9](?:[\w-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[\w-]*[a-zA-Z0-9])?)*"
    r":\d{2,5}\b(?![.:]\d)"
)


def redact_addresses(message: str) -> str:
    """``message`` with network addresses (replica URLs, hosts and ports) replaced by ``<address>``.

    Which replicas serve a model, and where, is the operator's: the server log and the
    observer's views keep it, a client's error does not.

    Examples:
        >>> from fairagents.server.wire import redact_addresses
        >>> redact_addresses("replica http://10.0.0.7:8000/v1 of 'chat' did not answer in 60 s")
        "replica <address> of 'chat' did not answer in 60 s"
        >>> redact_addresses("Connect call failed ('10.0.0.7', 8000)")
        'Connect call failed (<address>)'
        >>> redact_addresses("Cannot connect to host replica-2.internal:8000 ssl:default")
        'Cannot connect to host <address> ssl:default'
        >>> redact_addresses("no answer from [::1]:8000 nor ('fe80::1', 8000, 0, 0)")
        'no answer from <address> nor (<address>)'

        Ordinary text is left alone:

        >>> redact_addresses('ratio 3:1 at 12:30, T08:46:30, {"a": 1}')
        'ratio 3:1 at 12:30, T08:46:30, {"a": 1}'
        >>> redact_addresses("model 'chat': no such model")
        "model 'chat': no such model"
    """
    return _ADDRESS.sub("<address>", message)


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event: ``data: <json>`` and a blank line.

    Examples:
        >>> from fairagents.server.wire import sse
        >>> sse("[DONE]")
        'data: [DONE]\\n\\n'
    """
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), allow_nan=False)
    return f"data: {payload}\n\n"


def finite(value: float) -> float | None:
    """``value``, or ``None`` for NaN and infinities (JSON has neither).

    Examples:
        >>> from fairagents.server.wire import finite
        >>> finite(float("nan")) is None, finite(0.25)
        (True, 0.25)
    """
    return value if math.isfinite(value) else None
