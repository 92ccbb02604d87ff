"""The OpenAI wire format: request models (pydantic) and the response bodies the server sends.

Requests are validated here, so that a bad one is a 400 before anything is charged.
Fields fairagents does not implement (tools, logprobs, ``n`` > 1, penalties) are
rejected when set rather than silently ignored; harmless ones (``user``, ``metadata``)
are accepted. Responses are plain dicts built by functions, since stream chunks are
on the hot path; their shape is the one the ``openai`` client parses. ``usage``
carries one extra field, ``unified_tokens``: what the request was charged.

Examples:
    >>> from fairagents.server.wire import ChatCompletionRequest, parse
    >>> body = parse(ChatCompletionRequest, b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}]}')
    >>> body.model, body.messages[0].for_engine()
    ('chat', 'hi')
    >>> parse(ChatCompletionRequest, b'{"model": "chat", "messages": []}')
    Traceback (most recent call last):
    ...
    fairagents.errors.InvalidParameterError: messages: List should have at least 1 item after validation, not 0
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, Strict, ValidationError, model_validator

from fairagents.errors import InvalidImageError, InvalidParameterError
from fairagents.images import parse_size

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ImageGenerationRequest",
    "Usage",
    "chat_chunk",
    "chat_completion",
    "completion",
    "completion_chunk",
    "error_body",
    "new_id",
    "parse",
    "redact_paths",
    "sse",
]

M = TypeVar("M", bound=BaseModel)

#: Fields clients commonly send that change nothing here.
HARMLESS = frozenset(
    {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "safety_identifier", "prompt_cache_key"}
)


def parse(model: type[M], raw: bytes) -> M:
    """Validate a JSON request body; anything wrong is an :class:`~fairagents.InvalidParameterError`.

    Examples:
        >>> from fairagents.server.wire import CompletionRequest, parse
        >>> parse(CompletionRequest, b'not json')
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: the request body is not valid JSON: Expecting value: line 1 column 1 (char 0)
    """
    try:
        data = json.loads(raw)
        json.dumps(data, ensure_ascii=False).encode()  # a lone surrogate ("\\ud800") fails here, not in a tokenizer
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidParameterError(f"the request body is not valid JSON: {err}") from None
    except UnicodeEncodeError:
        raise InvalidParameterError("the request body holds text that is not valid Unicode (a lone surrogate)") from None
    except RecursionError:
        raise InvalidParameterError("the request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidParameterError("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise InvalidParameterError(f"{where}: {message}" if where else message) from None


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="after")
    def _no_unsupported_fields(self) -> _Body:
        for name, value in (self.model_extra or {}).items():
            if name not in HARMLESS and value not in (None, False, 0, [], {}):
                raise ValueError(f"{name!r} is not supported by fairagents; remove it")
        return self


# Numbers and flags are taken as JSON types, strictly: `"temperature": false` or `"1"` is a 400, not 0 or 1.
_Int = Annotated[int, Strict()]
_Float = Annotated[float, Strict()]
_Bool = Annotated[bool, Strict()]


class StreamOptions(BaseModel):
    """``stream_options`` of a streaming request.

    Examples:
        >>> from fairagents.server.wire import StreamOptions
        >>> StreamOptions(include_usage=True).include_usage
        True
    """

    model_config = ConfigDict(extra="ignore", frozen=True)
    include_usage: _Bool = False
    """Send a last chunk with the request's usage."""


class _Sampling(_Body):
    model: str = Field(min_length=1)
    max_tokens: _Int | None = Field(default=None, ge=1)
    temperature: _Float | None = Field(default=None, ge=0, le=2)
    top_p: _Float | None = Field(default=None, gt=0, le=1)
    n: _Int = 1
    seed: _Int | None = None
    stop: str | list[str] | None = None
    stream: _Bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: _Bool = False
    """vLLM's extension: keep generating past end of sequence (benchmarks)."""

    @model_validator(mode="after")
    def _one_choice(self) -> _Sampling:
        if self.n != 1:
            raise ValueError(f"n must be 1 (one choice per request), got {self.n}")
        return self

    def sampling(self, max_tokens: int) -> dict[str, Any]:
        """Keyword arguments of :meth:`~fairagents.Arbiter.stream_complete`."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        return {
            "max_tokens": max_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "seed": self.seed,
            "stop": stop,
            "ignore_eos": self.ignore_eos,
        }

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


class ChatMessage(BaseModel):
    """One message of a chat; ``content`` is text or a list of content parts.

    Examples:
        >>> from fairagents.server.wire import ChatMessage
        >>> ChatMessage(role="user", content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]).for_engine()
        'a\\nb'
    """

    model_config = ConfigDict(extra="ignore", frozen=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]] | None = None

    def for_engine(self, *, remote: bool = False) -> str | list[dict[str, Any]]:
        """The content as engines take it: text, or text and ``image_url`` parts for a vision model.

        Image URLs must be ``data:`` URLs, or, with ``remote``, also ``http(s)`` URLs
        (for a server that fetches them from allowed hosts).
        """
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        for part in self.content:
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                continue
            if kind != "image_url":
                raise InvalidParameterError(f"content part of type {kind!r} is not supported: send text and image_url parts")
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            fetchable = remote and isinstance(url, str) and url.lower().startswith(("https://", "http://"))
            if not isinstance(url, str) or not (url.startswith("data:") or fetchable):
                # The server reads nothing from its own disk or network on a client's behalf.
                raise InvalidImageError("over HTTP an image must be sent as a data URL: data:image/<format>;base64,<data>")
        if all(part["type"] == "text" for part in self.content):
            return "\n".join(part["text"] for part in self.content)
        return [dict(part) for part in self.content]


class ChatCompletionRequest(_Sampling):
    """The body of ``POST /v1/chat/completions``.

    Examples:
        >>> from fairagents.server.wire import ChatCompletionRequest
        >>> body = ChatCompletionRequest(model="chat", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=5)
        >>> body.requested_max_tokens()
        5
    """

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: _Int | None = Field(default=None, ge=1)

    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (the current name) or ``max_tokens``."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def chat_messages(self, *, remote: bool = False) -> list[dict[str, Any]]:
        """The messages as ``{"role", "content"}`` dicts, as engines take them (image parts kept; see ``for_engine``)."""
        return [{"role": m.role, "content": m.for_engine(remote=remote)} for m in self.messages]


class CompletionRequest(_Sampling):
    """The body of ``POST /v1/completions``: one prompt, as text or token ids.

    Examples:
        >>> from fairagents.server.wire import CompletionRequest
        >>> CompletionRequest(model="chat", prompt=["once upon a time"]).single_prompt()
        'once upon a time'
    """

    prompt: str | list[str] | list[NonNegativeInt] = Field(min_length=1)

    def single_prompt(self) -> str | list[int]:
        """The prompt, text or token ids; several prompts in one request are not supported."""
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise InvalidParameterError("prompt: one prompt per request (send several requests for several prompts)")
            return self.prompt[0]  # type: ignore[return-value]
        return self.prompt  # type: ignore[return-value]


class ImageGenerationRequest(_Body):
    """The body of ``POST /v1/images/generations``.

    Examples:
        >>> from fairagents.server.wire import ImageGenerationRequest
        >>> ImageGenerationRequest(prompt="a red car").model is None
        True
    """

    prompt: str = Field(min_length=1)
    model: str | None = None
    n: _Int = Field(default=1, ge=1)
    size: str | None = None
    response_format: str | None = None
    quality: str | None = None
    style: str | None = None

    def dimensions(self) -> tuple[int, int] | None:
        """``size`` (``"WIDTHxHEIGHT"``) as ``(width, height)``; ``None`` for the model's own."""
        return None if self.size is None else parse_size(self.size)


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

    def as_dict(self) -> dict[str, Any]:
        """The OpenAI ``usage`` object, plus ``unified_tokens``."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "unified_tokens": self.unified_tokens,
        }


def new_id(prefix: str) -> str:
    """A response id such as ``chatcmpl-…``.

    Examples:
        >>> from fairagents.server.wire import new_id
        >>> new_id("cmpl").startswith("cmpl-")
        True
    """
    return f"{prefix}-{uuid.uuid4().hex}"


def _finish(reason: str | None) -> str | None:
    return None if reason is None else ("length" if reason == "length" else "stop")


def chat_completion(rid: str, model: str, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
    """The body of a non-streaming chat completion.

    Examples:
        >>> from fairagents.server.wire import Usage, chat_completion
        >>> body = chat_completion("chatcmpl-1", "chat", "hi", "length", Usage(prompt_tokens=3, completion_tokens=1, unified_tokens=5.0))
        >>> body["choices"][0]["message"], body["choices"][0]["finish_reason"]
        ({'role': 'assistant', 'content': 'hi'}, 'length')
    """
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": _finish(finish_reason), "logprobs": None}
        ],
        "usage": usage.as_dict(),
    }


def chat_chunk(
    rid: str, model: str, created: int, *, content: str | None = None, role: bool = False,
    finish_reason: str | None = None, usage: Usage | None = None, include_usage: bool = False,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` of a stream; with ``usage``, the last chunk (no choices).

    Examples:
        >>> from fairagents.server.wire import chat_chunk
        >>> chat_chunk("c1", "chat", 0, content="", role=True)["choices"][0]["delta"]
        {'role': 'assistant', 'content': ''}
    """
    body: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    if usage is not None:
        body["choices"] = []
        body["usage"] = usage.as_dict()
        return body
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    body["choices"] = [{"index": 0, "delta": delta, "finish_reason": _finish(finish_reason), "logprobs": None}]
    if include_usage:
        body["usage"] = None
    return body


def completion(rid: str, model: str, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
    """The body of a non-streaming text completion.

    Examples:
        >>> from fairagents.server.wire import Usage, completion
        >>> completion("cmpl-1", "chat", "and", "stop", Usage(prompt_tokens=1, completion_tokens=1, unified_tokens=3.0))["object"]
        'text_completion'
    """
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": _finish(finish_reason), "logprobs": None}],
        "usage": usage.as_dict(),
    }


def completion_chunk(
    rid: str, model: str, created: int, *, text: str = "", finish_reason: str | None = None,
    usage: Usage | None = None, include_usage: bool = False,
) -> dict[str, Any]:
    """One chunk of a streamed text completion; with ``usage``, the last chunk (no choices).

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
    body["choices"] = [{"index": 0, "text": text, "finish_reason": _finish(finish_reason), "logprobs": None}]
    if include_usage:
        body["usage"] = None
    return body


ErrorType = Literal["invalid_request_error", "authentication_error", "rate_limit_error", "server_error"]


def error_body(message: str, type: ErrorType, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-shaped error body; file paths in ``message`` are hidden (:func:`redact_paths`).

    Examples:
        >>> from fairagents.server.wire import error_body
        >>> error_body("bad", "invalid_request_error", "invalid_parameter")
        {'error': {'message': 'bad', 'type': 'invalid_request_error', 'param': None, 'code': 'invalid_parameter'}}
    """
    return {"error": {"message": redact_paths(message), "type": type, "param": param, "code": code}}


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
