"""OpenAI chat and completion requests, read once for the server and the in-process clients.

A request body (JSON from the server, or ``create(**kwargs)`` in process) is validated
into a pydantic model, so that a bad one is an
:class:`~fairagents.InvalidParameterError` before anything is charged: tools,
``tool_choice`` and ``response_format`` as :meth:`fairagents.tools.OutputSpec.of` checks
them, sampling parameters in OpenAI's ranges, the bounds of
:class:`~fairagents.RequestLimits`. Fields fairagents does not implement (``echo``,
``best_of``, ``suffix``, ``prediction``, audio, web search…) are refused when set rather
than silently ignored; those that change nothing (:data:`HARMLESS`: ``user``,
``metadata``…) are accepted. :meth:`ChatCompletionRequest.arbiter_kwargs` gives the
keyword arguments of :meth:`~fairagents.Arbiter.chat` and ``stream_chat``
(:data:`SAMPLING_PARAMS` and :data:`OUTPUT_PARAMS`).

``n`` asks for several choices, as in OpenAI's API: each is a request of its own,
scheduled and charged fairly like any other (:attr:`ChatCompletionRequest.choices`).

Examples:
    >>> from fairagents.openai_request import ChatCompletionRequest, parse
    >>> body = parse(ChatCompletionRequest, b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "n": 2}')
    >>> body.model, body.messages[0].for_engine(), body.choices
    ('chat', 'hi', 2)
    >>> parse(ChatCompletionRequest, b'{"model": "chat", "messages": []}')
    Traceback (most recent call last):
    ...
    fairagents.errors.InvalidParameterError: messages: List should have at least 1 item after validation, not 0
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeInt, Strict, ValidationError, ValidationInfo,
                      model_validator)

from fairagents._json import NumberError, loads
from fairagents.constants import MAX_TOKEN_COUNT
from fairagents.engines.base import GenerationParams
from fairagents.errors import InvalidImageError, InvalidParameterError
from fairagents.images import parse_size
from fairagents.limits import DEFAULT_LIMITS, MAX_TOP_LOGPROBS, RequestLimits
from fairagents.runtime.sampling import OUTPUT_PARAMS, SAMPLING_PARAMS
from fairagents.tools import OutputSpec, check_tool_replies

__all__ = [
    "HARMLESS",
    "MAX_CHOICES",
    "MAX_COMPLETION_LOGPROBS",
    "OUTPUT_PARAMS",
    "SAMPLING_PARAMS",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "FunctionCall",
    "ImageGenerationRequest",
    "MessageToolCall",
    "StreamOptions",
    "join_text",
    "parse",
    "refuse_unsupported",
    "validate",
]

M = TypeVar("M", bound=BaseModel)

#: Fields clients commonly send that change nothing here.
HARMLESS = frozenset({"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"})
#: Most choices one request may ask for (``n``), as in OpenAI's API.
MAX_CHOICES = 128
#: Most alternatives per token of a completion (``logprobs``); a chat's ``top_logprobs``: ``MAX_TOP_LOGPROBS``.
MAX_COMPLETION_LOGPROBS = 5


def join_text(parts: Sequence[Any]) -> str | None:
    """Content parts that are all text as one string, joined by newlines; ``None`` if any part is not text.

    Examples:
        >>> join_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
        'a\\nb'
        >>> join_text([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "data:,"}}]) is None
        True
    """
    if all(isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in parts):
        return "\n".join(p["text"] for p in parts)
    return None


def parse(model: type[M], raw: bytes, limits: RequestLimits = DEFAULT_LIMITS) -> M:
    """Validate a JSON request body; anything wrong is an :class:`~fairagents.InvalidParameterError`.

    A number JSON or Python cannot take (``NaN``, ``1e999``, an integer of more digits
    than Python converts) is one too, naming its field. ``limits`` bound its stop
    strings, logit bias, tools and output constraint.

    Examples:
        >>> from fairagents.openai_request import CompletionRequest, parse
        >>> parse(CompletionRequest, b'not json')
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: the request body is not valid JSON: Expecting value: line 1 column 1 (char 0)
        >>> parse(CompletionRequest, b'{"model": "chat", "prompt": "a", "temperature": NaN}')
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: temperature: NaN is not valid JSON (JSON has no NaN or Infinity)
    """
    try:
        data = loads(raw)  # a lone surrogate ("\\ud800") fails here, not in a tokenizer
    except NumberError as err:
        where = _path(err.loc)
        raise InvalidParameterError(f"{where}: {err}" if where else str(err), param=where or None) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidParameterError(f"the request body is not valid JSON: {err}") from None
    except UnicodeEncodeError:
        raise InvalidParameterError("the request body holds text that is not valid Unicode (a lone surrogate)") from None
    except RecursionError:
        raise InvalidParameterError("the request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidParameterError("the request body must be a JSON object")
    return validate(model, data, limits)


def validate(model: type[M], data: Mapping[str, Any], limits: RequestLimits = DEFAULT_LIMITS) -> M:
    """Validate a request's fields (:func:`parse` without the JSON), as the in-process clients take them.

    Examples:
        >>> from fairagents.openai_request import ChatCompletionRequest, validate
        >>> validate(ChatCompletionRequest, {"model": "chat", "messages": [{"role": "user", "content": "hi"}],
        ...                                  "audio": {"voice": "alloy"}})
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: 'audio' is not supported by fairagents; remove it
    """
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
        >>> from fairagents.openai_request import _path
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


def refuse_unsupported(extra: Mapping[str, Any] | None, harmless: frozenset[str],
                       refused: Mapping[str, str] | None = None) -> None:
    """Refuse the fields of a request body its model does not declare, unless harmless or empty.

    ``refused`` names fields refused even when empty (``None`` aside), with the reason.

    Examples:
        >>> from fairagents.openai_request import refuse_unsupported
        >>> refuse_unsupported({"user": "u-1", "echo": False}, frozenset({"user"}))
        >>> refuse_unsupported({"echo": True}, frozenset())
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: 'echo' is not supported by fairagents; remove it
    """
    for name, value in (extra or {}).items():
        if refused and name in refused and value is not None:
            raise InvalidParameterError(f"{name}: {refused[name]}", param=name)
        if name not in harmless and value not in (None, False, 0, [], {}):
            raise InvalidParameterError(f"{name!r} is not supported by fairagents; remove it", param=name)


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="after")
    def _no_unsupported_fields(self) -> _Body:
        refuse_unsupported(self.model_extra, HARMLESS)
        return self


# Numbers and flags are taken as JSON types, strictly: `"temperature": false` or `"1"` is a 400, not 0 or 1.
_Int = Annotated[int, Strict()]
_Float = Annotated[float, Strict()]
_Bool = Annotated[bool, Strict()]


class StreamOptions(BaseModel):
    """``stream_options`` of a streaming request."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    include_usage: _Bool = False
    """Send a last chunk with the request's usage."""


class _Sampling(_Body):
    model: str = Field(min_length=1)
    max_tokens: _Int | None = Field(default=None, ge=1, le=MAX_TOKEN_COUNT)
    temperature: _Float | None = Field(default=None, ge=0, le=2)
    top_p: _Float | None = Field(default=None, gt=0, le=1)
    n: _Int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    """Choices to generate: each is a request of its own, scheduled and charged fairly."""
    seed: _Int | None = None
    stop: str | list[str] | None = None
    stream: _Bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: _Float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: _Float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: _Float | None = Field(default=None, gt=0, le=2)
    """vLLM's extension: a multiplicative penalty on tokens already seen (1: none); its benchmark client sends 1."""
    top_k: _Int | None = Field(default=None, ge=-1, le=MAX_TOKEN_COUNT)
    """vLLM's extension: sample among the ``top_k`` most likely tokens (0 or -1: all)."""
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
        """How many choices to generate (``n``, 1 when unset): each is a request of its own."""
        return self.n or 1

    def requested_max_tokens(self) -> int | None:
        """``max_tokens``: ``None`` leaves it to the arbiter (or the server) to fill."""
        return self.max_tokens

    def sampling(self, max_tokens: int | None = None) -> dict[str, Any]:
        """The :data:`SAMPLING_PARAMS` of :meth:`~fairagents.Arbiter.complete` (and ``chat``, and their streams).

        ``max_tokens`` stands for the request's own (:meth:`requested_max_tokens`).

        Examples:
            >>> from fairagents.openai_request import CompletionRequest
            >>> CompletionRequest(model="chat", prompt="a", logit_bias={"7": -100}).sampling(16)["logit_bias"]
            {7: -100.0}
        """
        max_tokens = self.requested_max_tokens() if max_tokens is None else max_tokens
        return {
            "max_tokens": max_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "seed": self.seed,
            "stop": self.stops,
            "ignore_eos": self.ignore_eos,
            "presence_penalty": self.presence_penalty or 0.0,
            "frequency_penalty": self.frequency_penalty or 0.0,
            "repetition_penalty": 1.0 if self.repetition_penalty is None else self.repetition_penalty,
            "top_k": max(0, self.top_k or 0),
            # the ids as the validator read them: "007" is 7, however many zeros lead
            "logit_bias": dict(GenerationParams(1, logit_bias=self.logit_bias or ()).logit_bias) or None,
            **self._logprobs(),
        }

    def _logprobs(self) -> dict[str, Any]:
        return {}

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


class FunctionCall(BaseModel):
    """The function of a tool call in an assistant message: its name, and its arguments as JSON text."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    name: str = Field(min_length=1)
    arguments: str = ""

    @model_validator(mode="after")
    def _json_arguments(self) -> FunctionCall:
        if self.arguments.strip():
            try:
                loads(self.arguments)
            except NumberError as err:
                where = f" at {_path(err.loc)}" if _path(err.loc) else ""
                raise InvalidParameterError(f"the arguments of {self.name!r} must be JSON text: {err}{where}",
                                            param="arguments") from None
            except ValueError:  # not JSON, or not Unicode
                raise InvalidParameterError(f"the arguments of {self.name!r} must be JSON text, "
                                            f"got {self.arguments[:80]!r}", param="arguments") from None
            except RecursionError:
                raise InvalidParameterError(f"the arguments of {self.name!r} are nested too deeply",
                                            param="arguments") from None
        return self


class MessageToolCall(BaseModel):
    """One call in an assistant message's ``tool_calls``, as the model made it.

    Examples:
        >>> from fairagents.openai_request import MessageToolCall
        >>> MessageToolCall(id="call_1", function={"name": "weather", "arguments": "{}"}).model_dump()
        {'id': 'call_1', 'type': 'function', 'function': {'name': 'weather', 'arguments': '{}'}}
    """

    model_config = ConfigDict(extra="ignore", frozen=True)
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One message of a chat; ``content`` is text or a list of content parts."""

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
        text = join_text(self.content)
        return [dict(part) for part in self.content] if text is None else text


class ChatCompletionRequest(_Sampling):
    """The body of ``POST /v1/chat/completions``, or the keyword arguments of ``chat.completions.create``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: _Int | None = Field(default=None, ge=1, le=MAX_TOKEN_COUNT)
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
        """The :data:`OUTPUT_PARAMS` of :meth:`~fairagents.Arbiter.chat`: the request's tools and format."""
        return {name: getattr(self, name) for name in OUTPUT_PARAMS}

    def arbiter_kwargs(self, max_tokens: int | None = None) -> dict[str, Any]:
        """Keyword arguments of :meth:`~fairagents.Arbiter.chat` and ``stream_chat``: sampling, tools and format.

        Examples:
            >>> from fairagents.openai_request import ChatCompletionRequest
            >>> body = ChatCompletionRequest(model="chat", messages=[{"role": "user", "content": "hi"}], stop=".",
            ...                              max_completion_tokens=8, tool_choice="none")
            >>> kwargs = body.arbiter_kwargs()
            >>> kwargs["max_tokens"], kwargs["stop"], kwargs["tool_choice"]
            (8, ['.'], 'none')
        """
        return {**self.sampling(max_tokens), **self.output_args()}

    def _logprobs(self) -> dict[str, Any]:
        return {"logprobs": bool(self.logprobs), "top_logprobs": self.top_logprobs}

    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (the current name) or ``max_tokens``; ``None`` when neither is set."""
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
        >>> from fairagents.openai_request import CompletionRequest
        >>> CompletionRequest(model="chat", prompt=["once upon a time"]).single_prompt()
        'once upon a time'
    """

    prompt: str | list[str] | list[NonNegativeInt] = Field(min_length=1)
    logprobs: _Int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    """Return each output token's log probability with this many most likely alternatives."""

    def _logprobs(self) -> dict[str, Any]:
        return {"logprobs": self.logprobs is not None, "top_logprobs": self.logprobs}

    def single_prompt(self) -> str | list[int]:
        """The prompt, text or token ids; several prompts in one request are not supported."""
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise InvalidParameterError(
                    "prompt: one prompt per request (send several requests for several prompts)", param="prompt")
            return self.prompt[0]  # type: ignore[return-value]
        return self.prompt  # type: ignore[return-value]


class ImageGenerationRequest(_Body):
    """The body of ``POST /v1/images/generations``."""

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
