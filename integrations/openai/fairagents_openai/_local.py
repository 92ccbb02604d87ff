"""OpenAI's chat completions and images, served by an arbiter in this process.

Requests are read as a fairagents server reads them (:mod:`fairagents.openai_request`)
and answered with the ``openai`` package's own response types, so code written for
``openai.AsyncOpenAI`` runs unchanged: tools and tool calls, ``response_format``,
logprobs, penalties, ``logit_bias`` and ``n`` choices included. What fairagents cannot
honour (audio, predicted outputs…) is refused with an
:class:`~fairagents.InvalidParameterError` rather than ignored.

Examples:
    >>> body, stream, include_usage, timeout = chat_request(
    ...     {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stop": "."})
    >>> body.arbiter_kwargs()["stop"], stream, include_usage, timeout
    (['.'], False, False, None)
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import openai
from openai.types import CompletionUsage, Image, ImagesResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs

from fairagents import AgentHandle, Arbiter, Portal, Reply, TokenLogprob
from fairagents.choices import Choices, all_choices, streamed_charge
from fairagents.engines import Delta
from fairagents.errors import InvalidParameterError, UnknownModelError
from fairagents.constants import HEADER_RUN
from fairagents.identity import Agent, Modality, current_run, run_from_headers
from fairagents.images import parse_size
from fairagents.limits import RequestLimits
from fairagents.openai_request import HARMLESS, ChatCompletionRequest, join_text, validate
from fairagents.tools import merge_pieces
from fairagents_openai._errors import openai_errors

__all__ = ["IN_PROCESS_URL", "ChatCompletionStream", "ChatCompletionSyncStream", "chat_completion", "chat_request",
           "generate_image", "given", "request_run"]

IN_PROCESS_URL = "fairagents://in-process/v1"
"""The ``base_url`` of a client that serves through an arbiter in this process (no HTTP is spoken)."""

_CHAT = f"{IN_PROCESS_URL}/chat/completions"
# Options of the openai client's call, not of the request: for HTTP only (ignored here), or read here.
_TRANSPORT = frozenset({"extra_headers", "extra_query"})
_CLIENT_OPTIONS = _TRANSPORT | {"extra_body", "timeout"}


def given(value: Any) -> bool:
    """Whether a keyword argument was given: not ``None``, ``openai.NOT_GIVEN`` or ``openai.omit``.

    Examples:
        >>> given(0), given(None), given(openai.NOT_GIVEN), given(openai.omit)
        (True, False, False, False)
    """
    return value is not None and not isinstance(value, openai.NotGiven | openai.Omit)


def request_run(request: Mapping[str, Any]) -> str | None:
    """The run of a call: ``X-Fairagents-Run`` in its ``extra_headers``, read as a server reads it; else the run
    bound where the call is made (:func:`fairagents.run_scope`, a fair graph's node), if any.

    Raises:
        InvalidParameterError: the header is not a run id.

    Examples:
        >>> import fairagents as fa
        >>> request_run({"extra_headers": {"x-fairagents-run": "ticket-9"}})
        'ticket-9'
        >>> with fa.run_scope("digest-7"):
        ...     request_run({"model": "chat"})
        'digest-7'
    """
    headers = request.get("extra_headers")
    if given(headers):
        text = next((v for k, v in headers.items() if k.lower() == HEADER_RUN.lower() and given(v)), None)
        if text is not None and (run := run_from_headers({HEADER_RUN: text})) is not None:
            return run
    return current_run()


def chat_request(
    request: Mapping[str, Any], limits: RequestLimits | None = None,
) -> tuple[ChatCompletionRequest, bool, bool, float | None]:
    """``create(...)``'s keyword arguments as a validated request, as a fairagents server reads its body.

    ``extra_body`` is merged in, as the ``openai`` client sends it; it may set only
    fields of the request (``ignore_eos``, vLLM's extension, is one).

    Returns:
        The request, whether to stream, whether the stream ends with a usage chunk,
        and the timeout in seconds (``None``: none).

    Raises:
        InvalidParameterError: a parameter fairagents cannot honour, or out of its range.

    Examples:
        >>> tools = [{"type": "function", "function": {"name": "weather"}}]
        >>> messages = [{"role": "user", "content": "hi"}]
        >>> chat_request({"model": "m", "messages": messages, "tools": tools, "n": 2})[0].choices
        2
        >>> chat_request({"model": "m", "messages": messages, "extra_body": {"guided_json": {}}})
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: fairagents takes no extra_body parameter guided_json
    """
    present = {name: value for name, value in request.items() if given(value)}
    fields = {name: value for name, value in present.items() if name not in _CLIENT_OPTIONS}
    extra = dict(present.get("extra_body") or {})
    unknown = sorted(set(extra) - set(ChatCompletionRequest.model_fields))
    if unknown:
        raise InvalidParameterError(f"fairagents takes no extra_body parameter {', '.join(unknown)}",
                                    param=f"extra_body.{unknown[0]}")
    fields.update(extra)
    body = validate(ChatCompletionRequest, fields, *(() if limits is None else (limits,)))
    timeout = present.get("timeout")
    return body, body.stream, body.include_usage, timeout if isinstance(timeout, int | float) else None


def _messages(messages: Sequence[Any]) -> list[Any]:
    """The messages as given, text-only content part lists as plain strings (what a text model takes)."""
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        text = join_text(content) if isinstance(content, list) else None
        out.append(message if text is None else {**message, "content": text})
    return out


async def chat_completion(
    arbiter: Arbiter, agent: AgentHandle | Agent | None, request: Mapping[str, Any], portal: Portal | None = None,
    run: str | None = None,
) -> ChatCompletion | ChatCompletionStream:
    """Serve one ``chat.completions.create(**request)`` through ``arbiter``, on its event loop.

    Called from another loop, a ``portal`` (:class:`~fairagents.Portal`) carries the call,
    and the returned stream's chunks, to and from the arbiter's loop. Each of ``n``
    choices is a request of its own, scheduled and charged fairly, in ``run`` (default:
    :func:`request_run`, read before the call leaves the caller's context).
    """
    if run is None:
        run = request_run(request)
    if portal is not None:
        served = await portal.run(chat_completion, arbiter, agent, request, run=run)
        if isinstance(served, ChatCompletionStream):
            served._portal = portal
        return served
    body, stream, include_usage, timeout = chat_request(request, arbiter.limits)
    model, messages, n = body.model, _messages(request["messages"]), body.choices
    kwargs = body.arbiter_kwargs()
    async with asyncio.timeout(None if stream else timeout):
        if not stream and n == 1:
            replies = [await arbiter.chat(model, messages, agent=agent, run=run, **kwargs)]
        else:
            # Prepare once (images in the arbiter's pool; tools rendered), keeping the call's place in the
            # queue, so that every choice, and the usage, count the very prompt that was charged.
            arrival = arbiter.clock()
            spec = body.output_spec(arbiter.limits)
            # unknown names, a model down, a full queue, tools or a format the model cannot serve: before preparing
            arbiter.check_admission(model, agent, output=spec)
            prompt = await arbiter.prepare_chat(model, messages, agent=agent, tools=spec.template_tools)
            if stream:
                choices = Choices([arbiter.stream_chat(model, prompt, agent=agent, arrival=arrival, run=run, **kwargs)
                                   for _ in range(n)])
                try:  # bad input raises here, at create(), as the HTTP API answers 400: once every choice started
                    head = await choices.head()
                except BaseException:
                    await choices.aclose()
                    raise
                return ChatCompletionStream(arbiter, model, prompt.n_tokens, head, choices, include_usage)
            replies = await all_choices([arbiter.chat(model, prompt, agent=agent, arrival=arrival, run=run, **kwargs)
                                         for _ in range(n)])
    first_reply = replies[0]
    prompt_tokens = first_reply.usage.prompt_tokens
    completion_tokens = sum(r.usage.completion_tokens for r in replies)
    return ChatCompletion(
        id=f"chatcmpl-{first_reply.request_id}",
        object="chat.completion",
        created=int(time.time()),
        model=first_reply.model,
        choices=[
            Choice(
                index=i,
                message=_message(reply),
                finish_reason=reply.finish_reason,  # type: ignore[arg-type]
                logprobs=_logprobs(reply.logprobs) if kwargs["logprobs"] else None,
            )
            for i, reply in enumerate(replies)
        ],
        usage=CompletionUsage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            unified_tokens=sum(r.usage.unified_tokens for r in replies),  # type: ignore[call-arg]  # what was charged
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
    early, charged for what it produced. Chunks of ``n`` choices come as they are made,
    each with its choice's ``index``. With ``stream_options={"include_usage": True}``
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
        head: list[tuple[int, Delta | None]],
        choices: Choices,
        include_usage: bool,
    ) -> None:
        self._arbiter = arbiter
        self._model = model
        self._prompt_tokens = prompt_tokens
        self._n = choices.n
        self._choices = choices
        self._include_usage = include_usage
        self._id = f"chatcmpl-{uuid.uuid4().hex}"
        self._created = int(time.time())
        self._chunks = self._iterate(head)
        self._portal: Portal | None = None  # set when the caller's loop is not the arbiter's

    def __aiter__(self) -> ChatCompletionStream:
        return self

    async def __anext__(self) -> ChatCompletionChunk:
        with openai_errors(_CHAT, streaming=True):  # as a server's error event
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
        await self._choices.aclose()  # when no chunk was read, _chunks never began

    async def __aenter__(self) -> ChatCompletionStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _chunk(self, index: int, delta: ChoiceDelta, finish: str | None = None,
               logprobs: tuple[TokenLogprob, ...] = ()) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self._id,
            object="chat.completion.chunk",
            created=self._created,
            model=self._model,
            choices=[ChunkChoice(index=index, delta=delta, finish_reason=finish,  # type: ignore[arg-type]
                                 logprobs=_logprobs(logprobs, ChunkLogprobs) if logprobs else None)],
        )

    async def _iterate(self, head: list[tuple[int, Delta | None]]) -> AsyncIterator[ChatCompletionChunk]:
        produced, cached = [0] * self._n, [0] * self._n
        try:
            for i in range(self._n):
                yield self._chunk(i, ChoiceDelta(role="assistant", content=""))
            pending = list(head)
            while (event := pending.pop(0) if pending else await self._choices.next()) is not None:
                i, delta = event
                if delta is None:  # that choice ended
                    continue
                produced[i] += delta.new_tokens
                if delta.cached_tokens:
                    cached[i] = delta.cached_tokens
                if delta.tool_calls and delta.finish_reason is not None:  # calls, then the finish in its own chunk
                    yield self._chunk(i, _delta(delta), None, delta.logprobs)  # as OpenAI (and openai's helper) has it
                    yield self._chunk(i, ChoiceDelta(), delta.finish_reason)
                elif delta.text or delta.finish_reason or delta.tool_calls or delta.logprobs:
                    yield self._chunk(i, _delta(delta), delta.finish_reason, delta.logprobs)
        finally:
            await self._choices.aclose()
        if self._include_usage:
            yield ChatCompletionChunk(
                id=self._id,
                object="chat.completion.chunk",
                created=self._created,
                model=self._model,
                choices=[],
                usage=self._usage(produced, cached),
            )

    def _usage(self, produced: list[int], cached: list[int]) -> CompletionUsage:
        # A stream of deltas carries no usage: price the choices as they were charged (the prompt once each).
        prompt = self._prompt_tokens
        in_engine = self._arbiter.dispatcher.model(self._model).in_engine
        charged = streamed_charge(self._arbiter.cost, self._model, prompt, produced, cached, cached_priced=in_engine)
        return CompletionUsage(
            prompt_tokens=prompt,
            completion_tokens=sum(produced),
            total_tokens=prompt + sum(produced),
            unified_tokens=charged,  # type: ignore[call-arg]  # what fairagents charged
        )


class ChatCompletionSyncStream:
    """The chunks of a streamed completion for sync code, as ``openai``'s ``Stream`` yields them.

    Iterate it once; ``close()`` (or ``with``) ends the request early, charged for what
    it produced.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.testing import FakeEngine
        >>> from fairagents_openai import FairOpenAI
        >>> arbiter = fa.Arbiter()
        >>> arbiter.add_model("chat", FakeEngine(tokens_per_reply=50))
        >>> client = FairOpenAI(arbiter, agent=arbiter.app("a").agent("b"))
        >>> with client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "go"}],
        ...                                     stream=True) as chunks:
        ...     first = [next(chunks).choices[0].delta.role, next(chunks).choices[0].delta.content]
        >>> first, arbiter.stats().apps["a"].cancelled
        (['assistant', 't0 '], 1)
        >>> client.close()
    """

    def __init__(self, stream: ChatCompletionStream, portal: Portal) -> None:
        self._stream = stream
        self._portal = portal

    def __iter__(self) -> Iterator[ChatCompletionChunk]:
        return self

    def __next__(self) -> ChatCompletionChunk:
        try:
            with openai_errors(_CHAT, streaming=True):
                return self._portal.run_sync(self._stream.__anext__)
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        """Stop the request; what it produced so far is charged."""
        self._portal.run_sync(self._stream.close)

    def __enter__(self) -> ChatCompletionSyncStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _delta(delta: Delta) -> ChoiceDelta:
    """A delta as a chunk's ``delta``: its content, and the pieces of its tool calls."""
    if not delta.tool_calls:
        return ChoiceDelta(content=delta.text or None)
    return ChoiceDelta.model_validate({"content": delta.text or None,
                                       "tool_calls": [p.as_openai() for p in merge_pieces(delta.tool_calls)]})


async def generate_image(arbiter: Arbiter, request: Mapping[str, Any], agent: AgentHandle | Agent | None = None,
                         run: str | None = None) -> ImagesResponse:
    """Serve ``images.generate(**request)`` on the pool's image model, as ``agent`` (or the one in context), in ``run``
    (default: :func:`request_run`).

    Takes ``model`` (default: the pool's only image model), ``prompt``, ``n``, ``size``
    (``"WxH"``) and ``response_format`` ``"b64_json"`` (images are never hosted, so
    ``"url"`` is refused), and answers with base64 PNGs.

    Raises:
        UnknownModelError: no image model of that name (or none at all) in the pool.
        InvalidParameterError: a parameter the image model cannot honour.
    """
    run = request_run(request) if run is None else run
    options = {k: v for k, v in request.items() if given(v) and k not in HARMLESS | _TRANSPORT}
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
    reply = await arbiter.generate_image(model, prompt, agent=agent, size=size, n=n, run=run)
    return ImagesResponse(
        created=int(time.time()), data=[Image(b64_json=base64.b64encode(png).decode()) for png in reply.png]
    )
