"""The OpenAI wire format: request models (pydantic) and the response bodies the server sends.

Requests are validated here, so that a bad one is a 400 before anything is charged:
tools, ``tool_choice`` and ``response_format`` are checked as
:meth:`fairagents.tools.OutputSpec.of` checks them, sampling parameters in OpenAI's
ranges. Fields fairagents does not implement (``echo``, ``best_of``, ``suffix``,
``prediction``, audio, web search…) are rejected when set rather than silently
ignored; harmless ones (``user``, ``metadata``) are accepted. Responses are plain dicts
built by functions, since stream chunks are on the hot path; their shape is the one the
``openai`` client parses. ``usage`` carries one extra field, ``unified_tokens``: what
the request was charged.

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
from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeInt, Strict, ValidationError, ValidationInfo,
                      model_validator)

from fairagents import http_errors
from fairagents.engines.base import GenerationParams
from fairagents.errors import InvalidImageError, InvalidParameterError
from fairagents.http_errors import ErrorType
from fairagents.images import parse_size
from fairagents.limits import DEFAULT_LIMITS, RequestLimits
from fairagents.reply import TokenLogprob
from fairagents.tools import OutputSpec, ToolCall, ToolCallDelta, check_tool_replies

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ImageGenerationRequest",
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
    "images_usage",
    "new_id",
    "parse",
    "redact_addresses",
    "redact_paths",
    "sse",
]

M = TypeVar("M", bound=BaseModel)

#: Fields clients commonly send that change nothing here.
HARMLESS = frozenset({"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"})
#: Most choices one request may ask for (``n``), as in OpenAI's API.
MAX_CHOICES = 128
#: Most alternatives per token of a chat request (``top_logprobs``) and of a completion (``logprobs``).
MAX_TOP_LOGPROBS, MAX_COMPLETION_LOGPROBS = 20, 5


def parse(model: type[M], raw: bytes, limits: RequestLimits = DEFAULT_LIMITS) -> M:
    """Validate a JSON request body; anything wrong is an :class:`~fairagents.InvalidParameterError`.

    ``limits`` bound its stop strings, logit bias, tools and output constraint.

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
        return model.model_validate(data, context={"limits": limits})
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = _path(first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise InvalidParameterError(f"{where}: {message}" if where else message, param=_param(first)) from None


# What pydantic adds to an error's location for the member of a union that failed: ``str``, ``list[...]``.
_UNION_MEMBERS = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})


def _path(loc: Sequence[int | str]) -> str:
    """A validation error's location as OpenAI writes a field: ``messages[0].content``.

    The members of a union that pydantic names in it, and the keys of a mapping, are left out.

    Examples:
        >>> from fairagents.server.wire import _path
        >>> _path(("messages", 0, "content", "str")), _path(("logit_bias", "7"))
        ('messages[0].content', 'logit_bias')
    """
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif re.fullmatch(r"[a-z_][a-z0-9_]*", part) and part not in _UNION_MEMBERS:
            path += f".{part}" if path else part
    return path


def _param(error: Any) -> str | None:
    """The request field a validation error is about: its location, then the field its validator named below it."""
    path = _path(error["loc"])
    inner = getattr((error.get("ctx") or {}).get("error"), "param", None)
    if inner:
        path = f"{path}.{inner}" if path else inner
    return path or None


def _limits(info: ValidationInfo) -> RequestLimits:
    """The bounds :func:`parse` was given (the defaults when a model is validated directly)."""
    return (info.context or {}).get("limits", DEFAULT_LIMITS)


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="after")
    def _no_unsupported_fields(self) -> _Body:
        for name, value in (self.model_extra or {}).items():
            if name not in HARMLESS and value not in (None, False, 0, [], {}):
                raise InvalidParameterError(f"{name!r} is not supported by fairagents; remove it", param=name)
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
    n: _Int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    """Choices to generate: each is a request of its own, charged and scheduled fairly."""
    seed: _Int | None = None
    stop: str | list[str] | None = None
    stream: _Bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: _Float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: _Float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, _Float] | None = None
    """Token id (as a string) → bias in [-100, 100] added to its logit."""
    ignore_eos: _Bool = False
    """vLLM's extension: keep generating past end of sequence (benchmarks)."""

    @model_validator(mode="after")
    def _checked_sampling(self, info: ValidationInfo) -> _Sampling:
        _limits(info).check_sampling(stop=self.stop, logit_bias=self.logit_bias)  # before any work on them
        GenerationParams(1, seed=self.seed, stop=self.stops, logit_bias=self.logit_bias or ())  # ranges, ids
        return self

    @property
    def stops(self) -> list[str]:
        """``stop`` as a list."""
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or ())

    @property
    def choices(self) -> int:
        """How many choices to generate (``n``, 1 when unset)."""
        return self.n or 1

    def sampling(self, max_tokens: int) -> dict[str, Any]:
        """Keyword arguments of :meth:`~fairagents.Arbiter.stream_complete` (and ``stream_chat``).

        Examples:
            >>> from fairagents.server.wire import CompletionRequest
            >>> CompletionRequest(model="chat", prompt="a", logit_bias={"7": -100}).sampling(16)["logit_bias"]
            {7: -100.0}
        """
        return {
            "max_tokens": max_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "seed": self.seed,
            "stop": self.stops,
            "ignore_eos": self.ignore_eos,
            "presence_penalty": self.presence_penalty or 0.0,
            "frequency_penalty": self.frequency_penalty or 0.0,
            "logit_bias": {int(token): float(bias) for token, bias in (self.logit_bias or {}).items()} or None,
            **self._logprobs(),
        }

    def _logprobs(self) -> dict[str, Any]:
        return {}

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


class FunctionCall(BaseModel):
    """The function of a tool call in an assistant message: its name, and its arguments as JSON text.

    Examples:
        >>> from fairagents.server.wire import FunctionCall
        >>> FunctionCall(name="weather", arguments='{"city": "Oslo"}').arguments
        '{"city": "Oslo"}'
    """

    model_config = ConfigDict(extra="ignore", frozen=True)
    name: str = Field(min_length=1)
    arguments: str = ""

    @model_validator(mode="after")
    def _json_arguments(self) -> FunctionCall:
        if self.arguments.strip():
            try:
                json.loads(self.arguments)
            except json.JSONDecodeError:
                raise InvalidParameterError(f"the arguments of {self.name!r} must be JSON text, "
                                            f"got {self.arguments[:80]!r}", param="arguments") from None
        return self


class MessageToolCall(BaseModel):
    """One call in an assistant message's ``tool_calls``, as the model made it.

    Examples:
        >>> from fairagents.server.wire import MessageToolCall
        >>> MessageToolCall(id="call_1", function={"name": "weather", "arguments": "{}"}).model_dump()
        {'id': 'call_1', 'type': 'function', 'function': {'name': 'weather', 'arguments': '{}'}}
    """

    model_config = ConfigDict(extra="ignore", frozen=True)
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One message of a chat; ``content`` is text or a list of content parts.

    Examples:
        >>> from fairagents.server.wire import ChatMessage
        >>> ChatMessage(role="user", content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]).for_engine()
        'a\\nb'
    """

    model_config = ConfigDict(extra="ignore", frozen=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[MessageToolCall] | None = None
    """An assistant's calls of tools (its ``content`` may then be null)."""
    tool_call_id: str | None = None
    """Which call a ``tool`` message answers."""

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise InvalidParameterError(f"only an assistant message carries tool_calls, not a {self.role!r} message",
                                        param="tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise InvalidParameterError("a tool message needs the tool_call_id of the call it answers",
                                        param="tool_call_id")
        return self

    def for_template(self, *, remote: bool = False) -> dict[str, Any]:
        """The message as engines take it: ``role`` and ``content`` (see :meth:`for_engine`), tool fields kept."""
        message: dict[str, Any] = {"role": self.role, "content": self.for_engine(remote=remote)}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
            if self.content is None:
                message["content"] = None
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message

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
    tools: list[dict[str, Any]] | None = None
    """Function tools the model may call, as
    ``{"type": "function", "function": {"name", "description", "parameters"}}``."""
    tool_choice: str | dict[str, Any] | None = None
    """``"none"``, ``"auto"`` (the default with tools), ``"required"``, or
    ``{"type": "function", "function": {"name"}}``."""
    parallel_tool_calls: _Bool | None = None
    """Whether the model may make several calls in one turn (default: true)."""
    response_format: dict[str, Any] | None = None
    """``{"type": "text"}``, ``{"type": "json_object"}`` or
    ``{"type": "json_schema", "json_schema": {"name", "schema"}}``."""
    logprobs: _Bool | None = None
    """Return each output token's log probability."""
    top_logprobs: _Int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    """Most likely alternatives per token, with ``logprobs``."""

    @model_validator(mode="after")
    def _checked_output(self, info: ValidationInfo) -> ChatCompletionRequest:
        self.output_spec(_limits(info)).constraint()  # a spec whose constraint cannot be built is refused here too
        check_tool_replies([m.model_dump(include={"role", "tool_calls", "tool_call_id"}) for m in self.messages])
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidParameterError("top_logprobs needs logprobs: true", param="top_logprobs")
        return self

    def output_spec(self, limits: RequestLimits | None = None) -> OutputSpec:
        """The request's tools, ``tool_choice``, ``parallel_tool_calls`` and ``response_format``, checked."""
        return OutputSpec.of(tools=self.tools, tool_choice=self.tool_choice, parallel_tool_calls=self.parallel_tool_calls,
                             response_format=self.response_format, limits=limits)

    def output_args(self) -> dict[str, Any]:
        """Keyword arguments of :meth:`~fairagents.Arbiter.stream_chat` for the request's tools and format."""
        return {"tools": self.tools, "tool_choice": self.tool_choice, "parallel_tool_calls": self.parallel_tool_calls,
                "response_format": self.response_format}

    def _logprobs(self) -> dict[str, Any]:
        return {"logprobs": bool(self.logprobs), "top_logprobs": self.top_logprobs}

    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (the current name) or ``max_tokens``."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def chat_messages(self, *, remote: bool = False) -> list[dict[str, Any]]:
        """The messages as engines take them (image parts kept; see :meth:`ChatMessage.for_template`)."""
        out = []
        for i, message in enumerate(self.messages):
            try:
                out.append(message.for_template(remote=remote))
            except (InvalidParameterError, InvalidImageError) as err:  # a content part it cannot take: say whose
                err.param = err.param or f"messages[{i}].content"
                raise
        return out


class CompletionRequest(_Sampling):
    """The body of ``POST /v1/completions``: one prompt, as text or token ids.

    Examples:
        >>> from fairagents.server.wire import CompletionRequest
        >>> CompletionRequest(model="chat", prompt=["once upon a time"]).single_prompt()
        'once upon a time'
    """

    prompt: str | list[str] | list[NonNegativeInt] = Field(min_length=1)
    logprobs: _Int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    """Return each output token's log probability with this many most likely alternatives."""

    def _logprobs(self) -> dict[str, Any]:
        return {"logprobs": self.logprobs is not None, "top_logprobs": self.logprobs}

    def requested_max_tokens(self) -> int | None:
        """``max_tokens``."""
        return self.max_tokens

    def single_prompt(self) -> str | list[int]:
        """The prompt, text or token ids; several prompts in one request are not supported."""
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise InvalidParameterError(
                    "prompt: one prompt per request (send several requests for several prompts)", param="prompt")
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
        delta["tool_calls"] = [piece.as_openai() for piece in tool_calls]
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
    return http_errors.error_body(redact_addresses(redact_paths(message)), type, code, param)


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
