"""OpenAI's chat completions and images, served by an arbiter in this process.

Requests are read as the OpenAI API reads them and answered with the ``openai``
package's own response types, so code written for ``openai.AsyncOpenAI`` runs
unchanged: tools and tool calls, ``response_format``, logprobs, penalties and
``logit_bias`` included. What fairagents cannot honour here (``n > 1``: make ``n``
calls, each scheduled and charged fairly; audio, predicted outputs) is refused with an
:class:`~fairagents.InvalidParameterError` rather than ignored.

Examples:
    >>> chat_params({"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stop": "."})
    ({'max_tokens': 8, 'stop': ('.',)}, False, False, None)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import openai
from openai.types import CompletionUsage, Image, ImagesResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs

from fairagents.arbiter import AgentHandle, Arbiter
from fairagents.engines.base import Delta
from fairagents.errors import InvalidParameterError, UnknownModelError
from fairagents.identity import Agent, Modality
from fairagents.images import parse_size
from fairagents.portal import Portal
from fairagents.reply import Reply, TokenLogprob
from fairagents.tools import OutputSpec, check_tool_replies, output_reader
from fairagents_openai._errors import openai_errors

__all__ = ["IN_PROCESS_URL", "ChatCompletionStream", "chat_completion", "chat_params", "generate_image", "given"]

IN_PROCESS_URL = "fairagents://in-process/v1"
"""The ``base_url`` of a client that serves through an arbiter in this process (no HTTP is spoken)."""

# Parameters about the caller or the transport, not the generation: accepted and not used.
_IGNORED = frozenset(
    {"user", "metadata", "store", "extra_headers", "extra_query", "safety_identifier", "prompt_cache_key",
     "service_tier"}
)
# Parameters whose default value asks for nothing.
_NO_OP = {"n": 1}
# Read as they are: Arbiter.chat takes them under the same names.
_PASSED = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "top_logprobs",
           "tools", "tool_choice", "parallel_tool_calls", "response_format")
_READ = frozenset(
    {"model", "messages", "max_tokens", "max_completion_tokens", "stop", "stream", "stream_options", "extra_body",
     "timeout", "logprobs", *_PASSED}
)


def given(value: Any) -> bool:
    """Whether a keyword argument was given: not ``None``, ``openai.NOT_GIVEN`` or ``openai.omit``.

    Examples:
        >>> given(0), given(None), given(openai.NOT_GIVEN), given(openai.omit)
        (True, False, False, False)
    """
    return value is not None and not isinstance(value, openai.NotGiven | openai.Omit)


def chat_params(request: Mapping[str, Any]) -> tuple[dict[str, Any], bool, bool, float | None]:
    """``create(...)``'s keyword arguments as :meth:`~fairagents.Arbiter.chat` parameters.

    Returns:
        The parameters, whether to stream, whether the stream ends with a usage chunk,
        and the timeout in seconds (``None``: none).

    Raises:
        InvalidParameterError: a parameter fairagents cannot honour.

    Examples:
        >>> tools = [{"type": "function", "function": {"name": "weather"}}]
        >>> chat_params({"model": "m", "messages": [], "tools": tools, "tool_choice": "required"})[0]["tool_choice"]
        'required'
        >>> chat_params({"model": "m", "messages": [], "n": 2})
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: n > 1 is not served in process: make n calls (each is scheduled and charged fairly), or send it to a fairagents server
    """
    present = {name: value for name, value in request.items() if given(value)}
    if present.get("n", 1) != 1:
        raise InvalidParameterError("n > 1 is not served in process: make n calls (each is scheduled and charged "
                                    "fairly), or send it to a fairagents server")
    refused = sorted(
        name for name, value in present.items() if name not in _READ | _IGNORED and _NO_OP.get(name, object()) != value
    )
    if refused:
        raise InvalidParameterError(f"fairagents cannot honour {', '.join(refused)} in process")
    params: dict[str, Any] = {name: present[name] for name in _PASSED if name in present}
    max_tokens = present.get("max_completion_tokens", present.get("max_tokens"))
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    if "stop" in present:
        params["stop"] = (present["stop"],) if isinstance(present["stop"], str) else tuple(present["stop"])
    if present.get("logprobs"):
        params["logprobs"] = True
    extra = dict(present.get("extra_body") or {})
    if extra.pop("ignore_eos", False):  # vLLM's extension
        params["ignore_eos"] = True
    if extra:
        raise InvalidParameterError(f"fairagents takes no extra_body parameter {', '.join(sorted(extra))}")
    stream = bool(present.get("stream", False))
    include_usage = bool((present.get("stream_options") or {}).get("include_usage", False))
    timeout = present.get("timeout")
    return params, stream, include_usage, timeout if isinstance(timeout, int | float) else None


def _messages(messages: Any) -> list[dict[str, Any]]:
    """Text-only content part lists as plain strings (what a text model takes); images kept as parts."""
    if not isinstance(messages, list | tuple):
        return messages  # the arbiter says what is wrong with it
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            message = {**message, "content": "\n".join(str(p.get("text", "")) for p in content)}
        out.append(message)
    return out


async def chat_completion(
    arbiter: Arbiter, agent: AgentHandle | Agent | None, request: Mapping[str, Any], portal: Portal | None = None,
) -> ChatCompletion | ChatCompletionStream:
    """Serve one ``chat.completions.create(**request)`` through ``arbiter``, on its event loop.

    Called from another loop, a ``portal`` (:class:`~fairagents.Portal`) carries the call,
    and the returned stream's chunks, to and from the arbiter's loop.
    """
    if portal is not None:
        served = await portal.run(chat_completion, arbiter, agent, request)
        if isinstance(served, ChatCompletionStream):
            served._portal = portal
        return served
    model, messages = request.get("model"), _messages(request.get("messages"))
    params, stream, include_usage, timeout = chat_params(request)
    if isinstance(messages, list) and all(isinstance(m, Mapping) for m in messages):
        check_tool_replies(messages)  # as OpenAI refuses it (other malformed messages: the arbiter says what is wrong)
    if stream:
        # Prepare once (images in the arbiter's pool; tools rendered), keeping the call's place in the
        # queue, so that the usage chunk counts the very prompt that was charged.
        arrival = arbiter.clock()
        spec = OutputSpec.of(**{k: params.get(k) for k in ("tools", "tool_choice", "parallel_tool_calls",
                                                            "response_format")})  # bad tools: before any work
        arbiter.check_admission(model, agent)  # unknown names, a model down, a full queue: before preparing
        output_reader(arbiter.engine(model), spec, model)  # tools or a format the model cannot serve, too
        tools = spec.template_tools
        prompt = await arbiter.prepare_chat(model, messages, agent=agent, tools=tools)  # type: ignore[arg-type]
        deltas = arbiter.stream_chat(model, prompt, agent=agent, arrival=arrival, **params)  # type: ignore[arg-type]
        try:
            first = await anext(deltas)  # bad input raises here, at create(), as the HTTP API answers 400
        except BaseException:
            await deltas.aclose()
            raise
        return ChatCompletionStream(arbiter, model, prompt.n_tokens, first, deltas, include_usage)  # type: ignore[arg-type]
    async with asyncio.timeout(timeout):
        reply = await arbiter.chat(model, messages, agent=agent, **params)  # type: ignore[arg-type]
    usage = reply.usage
    return ChatCompletion(
        id=f"chatcmpl-{reply.request_id}",
        object="chat.completion",
        created=int(time.time()),
        model=reply.model,
        choices=[
            Choice(
                index=0,
                message=_message(reply),
                finish_reason=reply.finish_reason,  # type: ignore[arg-type]
                logprobs=_logprobs(reply.logprobs) if params.get("logprobs") else None,
            )
        ],
        usage=CompletionUsage(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
            unified_tokens=usage.unified_tokens,  # type: ignore[call-arg]  # what fairagents charged
        ),
    )


def _message(reply: Reply) -> ChatCompletionMessage:
    """The reply as the assistant's message: its text, and its tool calls (content ``None`` when only calls)."""
    if not reply.tool_calls:
        return ChatCompletionMessage(role="assistant", content=reply.text)
    return ChatCompletionMessage.model_validate({
        "role": "assistant", "content": reply.text or None, "tool_calls": [c.as_openai() for c in reply.tool_calls],
    })


def _logprobs(tokens: Any, kind: Any = ChoiceLogprobs) -> Any:
    """Tokens' log probabilities as a choice's ``logprobs`` (``kind``: of a completion, or of a chunk)."""
    return kind.model_validate({"content": [t.as_openai() for t in tokens]})


class ChatCompletionStream:
    """The chunks of a streamed completion, as ``openai``'s ``AsyncStream`` yields them.

    Iterate it once with ``async for``; ``close()`` (or ``async with``) ends the request
    early, charged for what it produced. With ``stream_options={"include_usage": True}``
    the last chunk has no choices and carries the usage.

    Examples:
        >>> import asyncio
        >>> import fairagents as fa
        >>> from fairagents.testing import FakeEngine
        >>> arbiter = fa.Arbiter()
        >>> arbiter.add_model("chat", FakeEngine(tokens_per_reply=2))
        >>> writer = arbiter.app("studio").agent("writer")
        >>> async def main():
        ...     async with arbiter:
        ...         request = {"model": "chat", "messages": [{"role": "user", "content": "go"}], "stream": True}
        ...         stream = await chat_completion(arbiter, writer, request)
        ...         return [chunk.choices[0].delta.content async for chunk in stream]
        >>> asyncio.run(main())
        ['', 't0 ', 't1 ']
    """

    def __init__(
        self,
        arbiter: Arbiter,
        model: str,
        prompt_tokens: int,
        first: Delta,
        deltas: AsyncIterator[Delta],
        include_usage: bool,
    ) -> None:
        self._arbiter = arbiter
        self._model = model
        self._prompt_tokens = prompt_tokens
        self._deltas = deltas
        self._include_usage = include_usage
        self._id = f"chatcmpl-{uuid.uuid4().hex}"
        self._created = int(time.time())
        self._chunks = self._iterate(first)
        self._portal: Portal | None = None  # set when the caller's loop is not the arbiter's

    def __aiter__(self) -> ChatCompletionStream:
        return self

    async def __anext__(self) -> ChatCompletionChunk:
        with openai_errors(f"{IN_PROCESS_URL}/chat/completions", streaming=True):  # as a server's error event
            if self._portal is not None:
                return await self._portal.run(self._chunks.__anext__)
            return await self._chunks.__anext__()

    async def close(self) -> None:
        """Stop the request; what it produced so far is charged."""
        if self._portal is not None:
            await self._portal.run(self._close)
        else:
            await self._close()

    async def _close(self) -> None:
        await self._chunks.aclose()
        await self._deltas.aclose()  # type: ignore[attr-defined]  # when no chunk was read, _chunks never opened it

    async def __aenter__(self) -> ChatCompletionStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _chunk(self, delta: ChoiceDelta, finish: str | None = None,
               logprobs: tuple[TokenLogprob, ...] = ()) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self._id,
            object="chat.completion.chunk",
            created=self._created,
            model=self._model,
            choices=[ChunkChoice(index=0, delta=delta, finish_reason=finish,  # type: ignore[arg-type]
                                 logprobs=_logprobs(logprobs, ChunkLogprobs) if logprobs else None)],
        )

    async def _iterate(self, first: Delta) -> AsyncIterator[ChatCompletionChunk]:
        produced = 0
        async with contextlib.aclosing(self._deltas):
            yield self._chunk(ChoiceDelta(role="assistant", content=""))
            delta: Delta | None = first
            while delta is not None:
                produced += delta.new_tokens
                if delta.tool_calls and delta.finish_reason is not None:  # calls, then the finish in its own chunk
                    yield self._chunk(_delta(delta), None, delta.logprobs)  # as OpenAI (and openai's helper) has it
                    yield self._chunk(ChoiceDelta(), delta.finish_reason)
                elif delta.text or delta.finish_reason or delta.tool_calls or delta.logprobs:
                    yield self._chunk(_delta(delta), delta.finish_reason, delta.logprobs)
                delta = await anext(self._deltas, None)
        if self._include_usage:
            yield ChatCompletionChunk(
                id=self._id,
                object="chat.completion.chunk",
                created=self._created,
                model=self._model,
                choices=[],
                usage=self._usage(produced),
            )

    def _usage(self, produced: int) -> CompletionUsage:
        # A stream of deltas carries no usage: price the call as it was charged.
        prompt = self._prompt_tokens
        cost = self._arbiter.cost
        charged = cost.input_cost(self._model, prompt) + cost.output_cost(self._model, produced)
        return CompletionUsage(
            prompt_tokens=prompt,
            completion_tokens=produced,
            total_tokens=prompt + produced,
            unified_tokens=charged,  # type: ignore[call-arg]  # what fairagents charged
        )


def _delta(delta: Delta) -> ChoiceDelta:
    """A delta as a chunk's ``delta``: its content, and the pieces of its tool calls."""
    if not delta.tool_calls:
        return ChoiceDelta(content=delta.text or None)
    return ChoiceDelta.model_validate({"content": delta.text or None,
                                       "tool_calls": [p.as_openai() for p in delta.tool_calls]})


async def generate_image(arbiter: Arbiter, request: Mapping[str, Any], agent: AgentHandle | Agent | None = None) -> ImagesResponse:
    """Serve ``images.generate(**request)`` on the pool's image model, as ``agent`` (or the one in context).

    Takes ``model`` (default: the pool's only image model), ``prompt``, ``n``, ``size``
    (``"WxH"``) and ``response_format`` ``"b64_json"`` (images are never hosted, so
    ``"url"`` is refused), and answers with base64 PNGs.

    Raises:
        UnknownModelError: no image model of that name (or none at all) in the pool.
        InvalidParameterError: a parameter the image model cannot honour.
    """
    options = {k: v for k, v in request.items() if given(v) and k not in _IGNORED}
    image_models = [m for m in arbiter.models if arbiter.engine(m).profile.modality is Modality.IMAGE]
    model = options.pop("model", None)
    if model is not None:
        kind = arbiter.engine(model).profile.modality  # an unknown model raises UnknownModelError here
        if kind is not Modality.IMAGE:
            raise UnknownModelError(f"model {model!r} is a {kind.value} model, not an image model")
    elif len(image_models) == 1:
        model = image_models[0]
    else:
        known = ", ".join(sorted(arbiter.models)) or "none"
        problem = "no image model" if not image_models else "several image models; name one"
        raise UnknownModelError(f"the pool has {problem} to generate images with (models: {known})")
    prompt = options.pop("prompt", None)
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidParameterError("prompt must be a non-empty string")
    if options.pop("response_format", "b64_json") != "b64_json":
        raise InvalidParameterError("images are returned as b64_json: fairagents hosts no image URLs")
    n = options.pop("n", 1)
    size = options.pop("size", None)
    size = None if size is None else parse_size(size)
    if options:
        raise InvalidParameterError(f"images.generate parameters not supported: {', '.join(sorted(options))}")
    reply = await arbiter.generate_image(model, prompt, agent=agent, size=size, n=n)
    return ImagesResponse(
        created=int(time.time()), data=[Image(b64_json=base64.b64encode(png).decode()) for png in reply.png]
    )
