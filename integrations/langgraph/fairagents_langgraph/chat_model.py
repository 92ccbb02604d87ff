"""``ChatFairAgents``: a LangChain chat model whose calls are queued and served fairly by fairagents.

In process it calls an :class:`~fairagents.Arbiter` (on the event loop the arbiter runs
on); with ``base_url`` it calls a fairagents server through the ``openai`` client. Who
calls is decided per call, first match wins: the model's own ``agent``; the LangGraph
node the call is made in, under :func:`~fairagents_langgraph.fair_graph`; the agent bound
in context (:func:`fairagents.acting_as`, ``@fa.agent``).

Examples:
    >>> import asyncio
    >>> import fairagents as fa
    >>> from fairagents.testing import FakeEngine
    >>> arbiter = fa.Arbiter()
    >>> arbiter.add_model("chat", FakeEngine(tokens_per_reply=3))
    >>> planner = arbiter.app("driving").agent("planner")
    >>> llm = ChatFairAgents(arbiter=arbiter, model="chat", agent=planner)
    >>> async def main():
    ...     async with arbiter:
    ...         return await llm.ainvoke("plan a route")
    >>> message = asyncio.run(main())
    >>> message.content, message.usage_metadata["output_tokens"]
    ('t0 t1 t2 ', 3)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, model_validator

from fairagents.arbiter import AgentHandle, Arbiter
from fairagents.engines.base import GenerationParams
from fairagents.errors import InvalidParameterError
from fairagents.identity import Agent
from fairagents_langgraph import _sync
from fairagents_langgraph._backends import Call, LocalBackend, Piece, RemoteBackend
from fairagents_langgraph._messages import to_openai
from fairagents_langgraph.graph import current_loop, current_node_agent

__all__ = ["ChatFairAgents"]

# Generation parameters a call may override (llm.invoke(..., max_tokens=8)).
_PARAMS = ("max_tokens", "temperature", "top_p", "seed", "ignore_eos")


class ChatFairAgents(BaseChatModel):
    """A chat model served through fairagents: by an arbiter in this process, or by a fairagents server.

    Give ``arbiter`` (in process) or ``base_url`` (a server), not both. Messages with
    images go to ``vision_model``; without one they are a
    :class:`~fairagents.InvalidParameterError`. Bad input raises a
    :class:`~fairagents.BadInputError`, which is a ``ValueError``: LangGraph's default
    retry policy does not retry it.

    Examples:
        >>> import fairagents as fa
        >>> llm = ChatFairAgents(arbiter=fa.Arbiter(), model="chat", max_tokens=64)
        >>> llm.max_tokens, llm.vision_model
        (64, None)
        >>> remote = ChatFairAgents(base_url="http://localhost:8000/v1", api_key="sk-studio", agent="writer")
        >>> remote._llm_type
        'fairagents'
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")  # a misspelt argument is an error

    model: str = "chat"
    """The text model in the pool (or on the server)."""
    vision_model: str | None = None
    """The vision-language model that messages with images go to."""
    arbiter: Arbiter | None = Field(default=None, exclude=True)
    """The in-process arbiter that serves the calls."""
    base_url: str | None = None
    """Or a fairagents server's OpenAI-compatible root, e.g. ``http://localhost:8000/v1``."""
    api_key: SecretStr | None = Field(default=None, exclude=True)
    """The app's API key on the server; ``None`` when the server runs without keys."""
    app: str | None = None
    """The app to name to a server without keys (default: the calling agent's app)."""
    agent: AgentHandle | Agent | str | None = Field(default=None, exclude=True)
    """A fixed caller: an agent handle or identity; with a server, also an agent name. ``None``: per call."""
    max_tokens: int = 256
    """Most tokens to generate per call."""
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token, to exactly ``max_tokens`` (benchmarks, tests)."""
    loop: asyncio.AbstractEventLoop | None = Field(default=None, exclude=True)
    """The event loop the arbiter runs on, for sync calls from other threads outside a ``fair_graph`` async run."""
    http_client: Any = Field(default=None, exclude=True)
    """``httpx`` client for sync calls to a server."""
    http_async_client: Any = Field(default=None, exclude=True)
    """``httpx`` client for async calls to a server."""

    _connection: LocalBackend | RemoteBackend | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _one_backend(self) -> ChatFairAgents:
        if (self.arbiter is None) == (self.base_url is None):
            raise ValueError("give either arbiter= (in process) or base_url= (a fairagents server)")
        if isinstance(self.agent, str) and self.arbiter is not None:
            raise ValueError("in process, agent= is an agent handle or identity (arbiter.app(...).agent(...))")
        return self

    @property
    def _llm_type(self) -> str:
        return "fairagents"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model, "vision_model": self.vision_model, "base_url": self.base_url}

    # -- LangChain's four entry points end here --------------------------------------

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._call(messages, stop, kwargs)
        piece = await self._backend().complete(call)
        return _result(call.model, piece)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        call = self._call(messages, stop, kwargs)
        async for piece in self._backend().stream(call):
            yield _chunk(call.model, piece)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._call(messages, stop, kwargs)
        backend = self._backend()
        if isinstance(backend, RemoteBackend):
            piece = backend.complete_sync(call)
        else:
            piece = _sync.run(self.loop or current_loop(), backend.complete(call))
        return _result(call.model, piece)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        call = self._call(messages, stop, kwargs)
        backend = self._backend()
        if isinstance(backend, RemoteBackend):
            pieces = backend.stream_sync(call)
        else:
            pieces = _sync.iterate(self.loop or current_loop(), backend.stream(call))
        for piece in pieces:
            yield _chunk(call.model, piece)

    # -- token counting ------------------------------------------------------------------

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` under the model's own tokenizer (in process; no download).

        LangChain's default would fetch a GPT-2 tokenizer from the network (and hang
        offline). Over a server, the model's tokenizer is not at hand: this raises
        :class:`NotImplementedError` rather than counting with the wrong one.
        """
        return list(self._engine_for_counting().prepare_text(text).token_ids)

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Any = None) -> int:
        """Prompt tokens of ``messages`` as the model reads them: its chat template, its tokenizer."""
        if tools:
            raise NotImplementedError("counting the tokens of tool definitions is not supported")
        converted, _ = to_openai(messages)
        return self._engine_for_counting().prepare_chat(converted).n_tokens

    def _engine_for_counting(self) -> Any:
        if self.arbiter is None:
            raise NotImplementedError("token counting needs the model's tokenizer: use ChatFairAgents in process "
                                      "(arbiter=...); a server does not expose its tokenizer")
        return self.arbiter.engine(self.model)

    # -- internals -------------------------------------------------------------------

    def _call(self, messages: list[BaseMessage], stop: list[str] | None, overrides: dict[str, Any]) -> Call:
        unknown = sorted(set(overrides) - set(_PARAMS))
        if unknown:
            raise InvalidParameterError(
                f"ChatFairAgents takes no parameter {', '.join(unknown)} (it takes {', '.join(_PARAMS)})"
            )
        params = {name: overrides.get(name, getattr(self, name)) for name in _PARAMS}
        params["stop"] = tuple(stop or ())
        GenerationParams(**params)  # bad values fail here, typed, before anything is sent
        converted, has_image = to_openai(messages)
        model = self.model
        if has_image:
            if self.vision_model is None:
                raise InvalidParameterError(
                    f"the messages carry images, which the text model {self.model!r} cannot take: "
                    "set vision_model= to a vision-language model in the pool"
                )
            model = self.vision_model
        # The node is read from the run config LangChain keeps in context, not from the run manager:
        # LangChain 1.x hands none to _stream/_astream, and the context is the same on every path.
        agent = self.agent if self.agent is not None else current_node_agent()
        return Call(model, converted, params, agent, self.app)

    def _backend(self) -> LocalBackend | RemoteBackend:
        if self._connection is None:  # built on first use: the fields are the configuration
            if self.arbiter is not None:
                self._connection = LocalBackend(self.arbiter)
            else:
                assert self.base_url is not None
                key = self.api_key.get_secret_value() if self.api_key is not None else None
                self._connection = RemoteBackend(
                    self.base_url, key, http_client=self.http_client, http_async_client=self.http_async_client
                )
        return self._connection


def _metadata(model: str, piece: Piece) -> dict[str, Any]:
    return {"model_name": model, "finish_reason": piece.finish_reason, **piece.metadata}


def _result(model: str, piece: Piece) -> ChatResult:
    message = AIMessage(content=piece.text, usage_metadata=piece.usage, response_metadata=_metadata(model, piece))
    return ChatResult(
        generations=[ChatGeneration(message=message, generation_info={"finish_reason": piece.finish_reason})],
        llm_output={"model_name": model},
    )


def _chunk(model: str, piece: Piece) -> ChatGenerationChunk:
    if piece.finish_reason is None:
        return ChatGenerationChunk(message=AIMessageChunk(content=piece.text))
    message = AIMessageChunk(
        content=piece.text,
        usage_metadata=piece.usage,
        response_metadata=_metadata(model, piece),
        chunk_position="last",
    )
    return ChatGenerationChunk(message=message, generation_info={"finish_reason": piece.finish_reason})
