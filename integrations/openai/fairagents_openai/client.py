"""``AsyncFairOpenAI`` and ``FairOpenAI``: ``openai``'s chat completions and images, served fairly.

``AsyncFairOpenAI`` stands in for ``openai.AsyncOpenAI``, ``FairOpenAI`` for the sync
``openai.OpenAI``. Two ways to serve, one surface:

- ``AsyncFairOpenAI(arbiter)``: through an arbiter in this process. The calling agent
  is the client's ``agent``, or else the one bound in context when the call is made
  (:func:`fairagents.acting_as`, ``@fa.agent``, a node under
  ``fairagents_langgraph.fair_graph``). Its run likewise: the one bound in context when the
  call is made (:func:`fairagents.run_scope`, a fair graph's invocation), or the
  ``X-Fairagents-Run`` of the call's ``extra_headers``, read as a server reads it.
- ``AsyncFairOpenAI(base_url=..., api_key=...)``: through a fairagents server, with the
  stock ``openai`` client. The API key is the app's (sent as the bearer token); the
  agent goes in ``X-Fairagents-Agent``, with the weight and SLO it states
  (``X-Fairagents-Agent-Weight``, ``X-Fairagents-Agent-Slo``: the server declares a new
  agent with them); a server that runs without keys is told the app
  in ``X-Fairagents-App`` instead, and gets no ``Authorization`` header at all (so not
  ``OPENAI_API_KEY`` from the environment either). The run bound in context goes in
  ``X-Fairagents-Run`` (a call's own ``extra_headers`` may name another).

In process, calls reach the arbiter through a :class:`~fairagents.Portal`: an
``AsyncFairOpenAI`` works from any event loop (the arbiter's, or another thread's), and
a ``FairOpenAI`` from sync code; an arbiter that is not started is started on a loop
thread of the portal's own, closed by ``close()``.

Either way a call that fails raises ``openai``'s exception for it, as a server answers
it (``openai.NotFoundError`` for an unknown model, ``RateLimitError`` for a full queue…);
in process it is also the fairagents error it stands for.

Examples:
    >>> import asyncio
    >>> import fairagents as fa
    >>> from fairagents.testing import FakeEngine
    >>> arbiter = fa.Arbiter()
    >>> arbiter.add_model("chat", FakeEngine(tokens_per_reply=2))
    >>> planner = arbiter.app("driving").agent("planner")
    >>> client = AsyncFairOpenAI(arbiter)
    >>> async def main():
    ...     async with arbiter:
    ...         with fa.acting_as(planner):
    ...             messages = [{"role": "user", "content": "go"}]
    ...             return await client.chat.completions.create(model="chat", messages=messages)
    >>> completion = asyncio.run(main())
    >>> completion.choices[0].message.content, completion.usage.completion_tokens
    ('t0 t1 ', 2)
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types import ImagesResponse
from openai.types.chat import ChatCompletion, ParsedChatCompletion

from fairagents import AgentHandle, Arbiter, Portal
from fairagents.errors import InvalidParameterError
from fairagents.identity import Agent, identity_headers
from fairagents_openai._errors import openai_errors
from fairagents_openai._events import ChatCompletionEventStream, ChatCompletionSyncEventStream, parsed, structured
from fairagents_openai._local import (IN_PROCESS_URL, ChatCompletionStream, ChatCompletionSyncStream, chat_completion,
                                      generate_image, request_run)

__all__ = ["AsyncFairOpenAI", "ChatCompletionSyncStream", "FairOpenAI", "RawResponse"]

_CHAT, _IMAGES = f"{IN_PROCESS_URL}/chat/completions", f"{IN_PROCESS_URL}/images/generations"
# Sent as the key to a server without keys; the Authorization header itself is then omitted.
_NO_KEY = "fairagents-no-key"


class _Client:
    """Where a client's calls go (an arbiter in this process, or a server) and who makes them."""

    _openai_class: Any

    def __init__(
        self,
        arbiter: Arbiter | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        app: str | None = None,
        agent: AgentHandle | Agent | str | None = None,
        **options: Any,
    ) -> None:
        if (arbiter is None) == (base_url is None):
            raise InvalidParameterError("give either an arbiter (in process) or base_url= (a fairagents server)")
        if arbiter is not None and (isinstance(agent, str) or options or api_key is not None):
            raise InvalidParameterError(
                "in process, agent= is an agent handle or identity, and api_key= and client options do not apply"
            )
        self.arbiter = arbiter
        self.agent = agent
        self.app = app
        self._keyed = bool(api_key)
        self.portal = None if arbiter is None else Portal(arbiter)
        """In process: how calls reach the arbiter's event loop from the caller's."""
        self.openai: Any = None
        """The underlying ``openai`` client, for a server (its other endpoints, as they are)."""
        if base_url is not None:
            self.openai = self._openai_class(base_url=base_url, api_key=api_key or _NO_KEY, **options)

    @property
    def base_url(self) -> str:
        """Where calls go, as ``openai``'s clients have it (frameworks read it to tell OpenAI's own API from others):
        the server's URL, or ``fairagents://in-process/v1`` for an arbiter in this process.

        Examples:
            >>> AsyncFairOpenAI(base_url="http://localhost:8000/v1").base_url
            'http://localhost:8000/v1/'
        """
        return IN_PROCESS_URL if self.openai is None else str(self.openai.base_url)

    def headers(self) -> dict[str, Any]:
        """The identity headers a call made now sends to a server.

        Examples:
            >>> import fairagents as fa
            >>> client = AsyncFairOpenAI(base_url="http://localhost:8000/v1", api_key="sk-driving")
            >>> with fa.acting_as(fa.Agent("planner", fa.App("driving"))):
            ...     client.headers()
            {'X-Fairagents-Agent': 'planner'}
        """
        headers: dict[str, Any] = identity_headers(self.agent, app=self.app, name_app=not self._keyed)
        if not self._keyed:
            headers["Authorization"] = openai.Omit()
        return headers

    def _remote_options(self, request: dict[str, Any]) -> dict[str, Any]:
        return {**request, "extra_headers": {**self.headers(), **(request.get("extra_headers") or {})}}

    def _errors(self, url: str) -> contextlib.AbstractContextManager[None]:
        """In process: errors raised as ``openai``'s exceptions, as a server's answer gives them."""
        return openai_errors(url, self.arbiter)


class AsyncFairOpenAI(_Client):
    """A drop-in for ``openai.AsyncOpenAI``'s ``chat.completions`` and ``images``, served by fairagents.

    ``chat.completions`` has ``create``, ``parse`` and ``stream`` (also reachable as
    ``beta.chat.completions``, where older ``openai`` code calls them); ``images`` has
    ``generate``.

    Args:
        arbiter: serve in this process, through this arbiter.
        base_url: or send to a fairagents server at this URL (``http://host:8000/v1``).
        api_key: the app's API key on the server; ``None`` when it runs without keys.
        app: the app to name to a server without keys (default: the calling agent's app).
        agent: a fixed caller (an agent handle or identity; with a server, also an agent
            name); ``None``: the agent bound in context at each call.
        **options: passed to ``openai.AsyncOpenAI`` (``timeout``, ``max_retries``,
            ``http_client``, ...), for a server.

    Raises:
        InvalidParameterError: neither or both of ``arbiter`` and ``base_url``.

    Examples:
        >>> client = AsyncFairOpenAI(base_url="http://localhost:8000/v1", api_key="sk-studio", agent="writer")
        >>> client.headers()
        {'X-Fairagents-Agent': 'writer'}
        >>> keys_off = AsyncFairOpenAI(base_url="http://localhost:8000/v1", app="studio", agent="writer")
        >>> sorted(keys_off.headers())  # Authorization: omitted
        ['Authorization', 'X-Fairagents-Agent', 'X-Fairagents-App']
    """

    _openai_class: Any = openai.AsyncOpenAI

    def __init__(self, arbiter: Arbiter | None = None, **kwargs: Any) -> None:
        super().__init__(arbiter, **kwargs)
        self.chat = _Chat(_Completions(self))
        self.beta = _Beta(self.chat)
        self.images = _Images(self)

    async def close(self) -> None:
        """Close the client: with a server, its connection; in process, its portal (later calls raise
        ShutdownError) and an arbiter the portal started."""
        if self.openai is not None:
            await self.openai.close()
        if self.portal is not None:  # its calls end here too; an arbiter it started is closed
            await asyncio.to_thread(self.portal.close)

    async def __aenter__(self) -> AsyncFairOpenAI:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Completions:
    def __init__(self, client: AsyncFairOpenAI) -> None:
        self._client = client

    async def create(self, **request: Any) -> ChatCompletion | ChatCompletionStream | Any:
        """``chat.completions.create``: a ``ChatCompletion``, or with ``stream=True`` an async iterator of chunks.

        In process, bad input (an unknown model or agent, ``max_tokens`` ≤ 0, bad tools, a
        parameter fairagents cannot honour) raises here rather than while iterating a stream,
        and costs nothing. Errors are ``openai``'s, as a server's answer gives them
        (``openai.NotFoundError`` for an unknown model, ``openai.BadRequestError``,
        ``openai.RateLimitError`` when the app's queue is full, ``openai.APITimeoutError``),
        each also the fairagents error it stands for (a :class:`~fairagents.BadInputError` is a
        ``ValueError``).
        """
        client = self._client
        if client.openai is not None:
            return await client.openai.chat.completions.create(**client._remote_options(request))
        assert client.arbiter is not None
        with client._errors(_CHAT):
            return await chat_completion(client.arbiter, client.agent, request, client.portal,  # type: ignore[arg-type]
                                         run=request_run(request))

    async def parse(self, **request: Any) -> ParsedChatCompletion[Any]:
        """``chat.completions.parse``: ``create``, with the answer parsed into ``response_format`` (a class).

        Tool calls' arguments are parsed too; as with ``openai``, every tool must then be a
        strict function (``openai.pydantic_function_tool(Model)`` makes one).

        Raises:
            openai.LengthFinishReasonError: the answer was cut short by ``max_tokens``.
        """
        client = self._client
        if client.openai is not None:
            return await client.openai.chat.completions.parse(**client._remote_options(request))
        with client._errors(_CHAT):
            converted, response_format, tools = structured(request, strict_tools=True)
        return parsed(await self.create(**converted), response_format, tools)

    @property
    def with_raw_response(self) -> _AsyncRawCompletions:
        """``create`` and ``parse`` answering an object whose ``parse()`` gives the result, as ``openai``'s do
        (frameworks such as ``langchain-openai`` call them so). In process it has no HTTP headers."""
        return _AsyncRawCompletions(self)

    def stream(self, **request: Any) -> ChatCompletionEventStream | Any:
        """``chat.completions.stream``: ``openai``'s stream events, within ``async with``.

        In process it is a :class:`~fairagents_openai.ChatCompletionEventStream`.
        """
        client = self._client
        if client.openai is not None:
            return client.openai.chat.completions.stream(**client._remote_options(request))
        with client._errors(_CHAT):
            converted, response_format, tools = structured(request)
        state = ChatCompletionStreamState(response_format=response_format, input_tools=tools)
        return ChatCompletionEventStream(lambda: self.create(**converted, stream=True), state)


class RawResponse:
    """What ``with_raw_response`` answers in process: the result, which no HTTP carried.

    Examples:
        >>> RawResponse("completion").parse(), dict(RawResponse("completion").headers)
        ('completion', {})
    """

    def __init__(self, result: Any) -> None:
        self._result = result
        self.headers: dict[str, str] = {}
        """No HTTP headers: the call was served in this process."""
        self.http_response = None
        """No HTTP response either."""

    def parse(self) -> Any:
        """The result: a ``ChatCompletion``, a ``ParsedChatCompletion`` or a stream of chunks."""
        return self._result


class _AsyncRawCompletions:
    def __init__(self, completions: _Completions) -> None:
        self._completions = completions

    async def create(self, **request: Any) -> Any:
        client = self._completions._client
        if client.openai is not None:
            return await client.openai.chat.completions.with_raw_response.create(**client._remote_options(request))
        return RawResponse(await self._completions.create(**request))

    async def parse(self, **request: Any) -> Any:
        client = self._completions._client
        if client.openai is not None:
            return await client.openai.chat.completions.with_raw_response.parse(**client._remote_options(request))
        return RawResponse(await self._completions.parse(**request))


class _SyncRawCompletions:
    def __init__(self, completions: _SyncCompletions) -> None:
        self._completions = completions

    def create(self, **request: Any) -> Any:
        client = self._completions._client
        if client.openai is not None:
            return client.openai.chat.completions.with_raw_response.create(**client._remote_options(request))
        return RawResponse(self._completions.create(**request))

    def parse(self, **request: Any) -> Any:
        client = self._completions._client
        if client.openai is not None:
            return client.openai.chat.completions.with_raw_response.parse(**client._remote_options(request))
        return RawResponse(self._completions.parse(**request))


class _Chat:
    def __init__(self, completions: Any) -> None:
        self.completions = completions


class _Beta:
    def __init__(self, chat: Any) -> None:
        self.chat = chat


class _Images:
    def __init__(self, client: AsyncFairOpenAI) -> None:
        self._client = client

    async def generate(self, **request: Any) -> ImagesResponse:
        """``images.generate``: base64 PNGs from the pool's image model (in process), or the server's.

        Raises:
            openai.NotFoundError: in process, no image model in the pool (or none of that name);
                also an :class:`~fairagents.UnknownModelError`.
            openai.BadRequestError: a parameter the image model cannot honour (``response_format="url"``);
                also an :class:`~fairagents.InvalidParameterError`.
        """
        client = self._client
        if client.openai is not None:
            return await client.openai.images.generate(**client._remote_options(request))
        assert client.arbiter is not None and client.portal is not None
        with client._errors(_IMAGES):
            return await client.portal.run(generate_image, client.arbiter, request, client.agent, request_run(request))


class FairOpenAI(_Client):
    """A drop-in for the sync ``openai.OpenAI``'s ``chat.completions`` and ``images``, served by fairagents.

    The arguments and the methods are :class:`AsyncFairOpenAI`'s, for sync code. In
    process, each call blocks its thread until the arbiter (on its own event loop)
    answers; with no loop anywhere, the first call starts the arbiter on a loop thread of
    the client's portal, and :meth:`close` (or leaving ``with``) closes it. Calling it
    from the arbiter's own event loop would block that loop: a
    :class:`~fairagents.errors.ProtocolError` says so.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.testing import FakeEngine
        >>> arbiter = fa.Arbiter()
        >>> arbiter.add_model("chat", FakeEngine(tokens_per_reply=2))
        >>> with FairOpenAI(arbiter, agent=arbiter.app("driving").agent("planner")) as client:
        ...     completion = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "go"}])
        ...     chunks = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "go"}],
        ...                                             stream=True)
        ...     pieces = [c.choices[0].delta.content for c in chunks]
        >>> completion.choices[0].message.content, pieces
        ('t0 t1 ', ['', 't0 ', 't1 '])
    """

    _openai_class: Any = openai.OpenAI

    def __init__(self, arbiter: Arbiter | None = None, **kwargs: Any) -> None:
        super().__init__(arbiter, **kwargs)
        self.chat = _Chat(_SyncCompletions(self))
        self.beta = _Beta(self.chat)
        self.images = _SyncImages(self)

    def close(self) -> None:
        """Close the client: with a server, its connection; in process, its portal (later calls raise
        ShutdownError) and an arbiter the portal started."""
        if self.openai is not None:
            self.openai.close()
        if self.portal is not None:
            self.portal.close()

    def __enter__(self) -> FairOpenAI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _SyncCompletions:
    def __init__(self, client: FairOpenAI) -> None:
        self._client = client

    def create(self, **request: Any) -> ChatCompletion | ChatCompletionSyncStream | Any:
        """``chat.completions.create``: a ``ChatCompletion``, or with ``stream=True`` an iterator of chunks.

        In process, bad input raises ``openai.BadRequestError`` (or ``NotFoundError`` for an
        unknown model; also the :class:`~fairagents.BadInputError`, a ``ValueError``) here
        rather than while iterating a stream, and costs nothing.
        """
        client = self._client
        if client.openai is not None:
            return client.openai.chat.completions.create(**client._remote_options(request))
        assert client.arbiter is not None and client.portal is not None
        with client._errors(_CHAT):
            served = client.portal.run_sync(
                chat_completion, client.arbiter, client.agent, request, run=request_run(request))  # type: ignore[arg-type]
        if isinstance(served, ChatCompletionStream):
            return ChatCompletionSyncStream(served, client.portal)
        return served

    def parse(self, **request: Any) -> ParsedChatCompletion[Any]:
        """``chat.completions.parse``, as :class:`AsyncFairOpenAI`'s, from sync code."""
        client = self._client
        if client.openai is not None:
            return client.openai.chat.completions.parse(**client._remote_options(request))
        with client._errors(_CHAT):
            converted, response_format, tools = structured(request, strict_tools=True)
        return parsed(self.create(**converted), response_format, tools)

    @property
    def with_raw_response(self) -> _SyncRawCompletions:
        """``create`` and ``parse`` answering an object whose ``parse()`` gives the result, as :class:`AsyncFairOpenAI`'s."""
        return _SyncRawCompletions(self)

    def stream(self, **request: Any) -> ChatCompletionSyncEventStream | Any:
        """``chat.completions.stream``: ``openai``'s stream events, within ``with``.

        In process it is a :class:`~fairagents_openai.ChatCompletionSyncEventStream`.
        """
        client = self._client
        if client.openai is not None:
            return client.openai.chat.completions.stream(**client._remote_options(request))
        with client._errors(_CHAT):
            converted, response_format, tools = structured(request)
        state = ChatCompletionStreamState(response_format=response_format, input_tools=tools)
        return ChatCompletionSyncEventStream(lambda: self.create(**converted, stream=True), state)


class _SyncImages:
    def __init__(self, client: FairOpenAI) -> None:
        self._client = client

    def generate(self, **request: Any) -> ImagesResponse:
        """``images.generate``, as :class:`AsyncFairOpenAI`'s, from sync code."""
        client = self._client
        if client.openai is not None:
            return client.openai.images.generate(**client._remote_options(request))
        assert client.arbiter is not None and client.portal is not None
        with client._errors(_IMAGES):
            return client.portal.run_sync(generate_image, client.arbiter, request, client.agent, request_run(request))
