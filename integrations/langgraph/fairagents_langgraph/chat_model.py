"""``ChatFairAgents``: a LangChain chat model whose calls are queued and served fairly by fairagents.

In process it calls an :class:`~fairagents.Arbiter` through a :class:`~fairagents.Portal`,
so sync and async calls work from any event loop or thread; with ``base_url`` it calls a
fairagents server through the ``openai`` client. Who calls is decided per call, first
match wins: the model's own ``agent``; the LangGraph node the call is made in, under
:func:`~fairagents_langgraph.fair_graph`; the agent bound in context
(:func:`fairagents.acting_as`, ``@fa.agent``). Its run is the one bound in context
(:func:`fairagents.run_scope`, a node of a :func:`~fairagents_langgraph.fair_graph`
invocation), else the one its run config names (``fairagents_run`` in its metadata), else
none (a run of its own).

Tools (:meth:`ChatFairAgents.bind_tools`) and structured output
(:meth:`ChatFairAgents.with_structured_output`) go to the arbiter or server as OpenAI's
``tools``, ``tool_choice`` and ``response_format``; a forced call and a JSON format are
enforced while decoding (see :mod:`fairagents.tools`).

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

import contextlib
import threading
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, Literal, TypeVar

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, InvalidToolCall, ToolCall
from langchain_core.messages.tool import ToolCallChunk, tool_call_chunk
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import (
    JsonOutputKeyToolsParser,
    PydanticToolsParser,
    make_invalid_tool_call,
    parse_tool_call,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, model_validator

from fairagents import AgentHandle, Arbiter, Portal
from fairagents.engines import GenerationParams
from fairagents.errors import EngineError, InvalidParameterError
from fairagents.identity import Agent, current_agent, current_run
from fairagents.tools import OutputSpec, ToolCallDelta
from fairagents_langgraph._backends import OUTPUT_PARAMS, Call, LocalBackend, Piece, RemoteBackend
from fairagents_langgraph._messages import to_openai
from fairagents_langgraph.graph import current_node_agent, node_run

__all__ = ["ChatFairAgents"]

# Generation parameters a call may override (llm.invoke(..., max_tokens=8)).
_SAMPLING = ("max_tokens", "temperature", "top_p", "seed", "ignore_eos")
# Everything a call may set: the model, sampling, and (bind_tools, with_structured_output) its output.
_PER_CALL = ("model", *_SAMPLING, *OUTPUT_PARAMS)
_BACKEND_LOCK = threading.Lock()
T = TypeVar("T")

ToolLike = dict[str, Any] | type | Callable[..., Any] | BaseTool
StructuredOutputMethod = Literal["function_calling", "json_schema", "json_mode"]


class ChatFairAgents(BaseChatModel):
    """A chat model served through fairagents: by an arbiter in this process, or by a fairagents server.

    Give ``arbiter`` or ``portal`` (in process) or ``base_url`` (a server). In process,
    ``invoke``, ``stream``, ``batch`` and their async forms work from any event loop or
    thread: a call made off the arbiter's loop is carried to it by a portal (an
    arbiter not started yet is started on a loop thread of the portal's own). A sync
    call made on the arbiter's own loop would block it: it raises
    :class:`~fairagents.errors.ProtocolError` (a ``RuntimeError``); use the async form.

    Messages with images go to ``vision_model``; without one they are a
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
    """The text model in the pool (or on the server); a call may name another (``llm.invoke(..., model=...)``)."""
    vision_model: str | None = None
    """The vision-language model that messages with images go to."""
    arbiter: Arbiter | None = Field(default=None, exclude=True)
    """The in-process arbiter that serves the calls."""
    portal: Portal | None = Field(default=None, exclude=True)
    """The portal calls reach the arbiter through (default: one of the model's own). Give yours to
    share it, and to end the loop thread it may start with ``portal.close()``."""
    base_url: str | None = None
    """Or a fairagents server's OpenAI-compatible root, e.g. ``http://localhost:8000/v1``."""
    api_key: SecretStr | None = Field(default=None, exclude=True)
    """The app's API key on the server; ``None`` when the server runs without keys."""
    app: str | None = None
    """The app to name to a server without keys (default: the calling agent's app)."""
    agent: AgentHandle | Agent | str | None = Field(default=None, exclude=True)
    """A fixed caller: an agent handle or identity; with a server, also an agent name. ``None``: per call."""
    max_tokens: int | None = None
    """Most tokens to generate per call; ``None``: the arbiter's (or server's) rule, the rest of the context."""
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | None = None
    """Stop sequences of every call (a call's own ``stop`` replaces them)."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token, to exactly ``max_tokens`` (benchmarks, tests)."""
    parallel_tool_calls: bool | None = None
    """For calls with tools: ``False``, at most one call per turn (``bind_tools(parallel_tool_calls=...)``
    overrides it); ``None``: several allowed, as in OpenAI's API."""
    streaming: bool = False
    """Have ``invoke`` stream underneath, so callbacks see each token as it comes."""
    timeout: float | None = None
    """Seconds a call may wait for its reply, queueing included (a stream: for each piece); ``None``: no limit."""
    max_retries: int = 2
    """How many times a call to a server is retried when it fails in transit or is turned away for
    the moment (connection errors, 429, 5xx). In process nothing is retried: a node's retry policy decides."""
    http_client: Any = Field(default=None, exclude=True)
    """``httpx`` client for sync calls to a server."""
    http_async_client: Any = Field(default=None, exclude=True)
    """``httpx`` client for async calls to a server."""

    _connection: LocalBackend | RemoteBackend | None = PrivateAttr(default=None)

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.pop("loop", None) is not None:
            warnings.warn(
                "ChatFairAgents(loop=...) is deprecated and ignored: calls find the arbiter's event loop themselves",
                DeprecationWarning,
                stacklevel=2,
            )
        super().__init__(**kwargs)

    @model_validator(mode="after")
    def _one_backend(self) -> ChatFairAgents:
        if self.portal is not None:
            if self.arbiter is not None and self.arbiter is not self.portal.arbiter:
                raise ValueError("portal= is a portal onto another arbiter than arbiter=")
            self.arbiter = self.portal.arbiter
        if (self.arbiter is None) == (self.base_url is None):
            raise ValueError("give either arbiter= or portal= (in process), or base_url= (a fairagents server)")
        if isinstance(self.agent, str) and self.arbiter is not None:
            raise ValueError("in process, agent= is an agent handle or identity (arbiter.app(...).agent(...))")
        return self

    @property
    def _llm_type(self) -> str:
        return "fairagents"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model, "vision_model": self.vision_model, "base_url": self.base_url}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "fairagents"
        if not stop and self.stop:
            params["ls_stop"] = self.stop
        return params

    # -- tools and structured output -------------------------------------------------

    def bind_tools(
        self,
        tools: Sequence[ToolLike],
        *,
        tool_choice: str | bool | dict[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """The model with ``tools`` offered on every call; the calls come back in ``AIMessage.tool_calls``.

        Args:
            tools: LangChain tools, functions, pydantic models, TypedDicts or OpenAI tool
                dicts (anything ``convert_to_openai_tool`` takes).
            tool_choice: ``"auto"`` (the model decides; the default), ``"none"``, ``"any"``,
                ``"required"`` or ``True`` (it must call one or more), a tool's name (it
                must call that one), or OpenAI's ``{"type": "function", "function": {"name": ...}}``.
                A forced call is enforced in decoding: it is a valid call of the tool.
            parallel_tool_calls: ``False``: at most one call per turn.
            strict: mark the tools strict (``additionalProperties: false``, every field required).
            **kwargs: further call parameters to bind (``max_tokens=...``).

        Raises:
            InvalidParameterError: a ``tool_choice`` that names no given tool, or is none of the above.

        Examples:
            >>> import fairagents as fa
            >>> def weather(city: str) -> str:
            ...     '''Today's weather in a city.'''
            ...     return "sunny"
            >>> llm = ChatFairAgents(arbiter=fa.Arbiter())
            >>> bound = llm.bind_tools([weather], tool_choice="weather")
            >>> bound.kwargs["tool_choice"]
            {'type': 'function', 'function': {'name': 'weather'}}
            >>> bound.kwargs["tools"][0]["function"]["parameters"]["required"]
            ['city']
        """
        formatted = [convert_to_openai_tool(tool, strict=strict) for tool in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = _tool_choice(tool_choice, formatted)
        if parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = parallel_tool_calls
        return super().bind(tools=formatted, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: StructuredOutputMethod = "function_calling",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
        """The model answering in ``schema``: a pydantic object, or a dict for the other kinds of schema.

        Args:
            schema: a pydantic model (v2 or v1), a TypedDict, a JSON schema or an OpenAI
                tool dict; ``None`` only with ``method="json_mode"`` (any JSON object).
            method: ``"function_calling"``: the model must call a tool whose parameters are
                the schema; ``"json_schema"``: OpenAI's ``response_format`` of that schema.
                Both are enforced in decoding, so the output always fits (unless cut short
                by ``max_tokens``). ``"json_mode"``: any JSON object (``{"type":
                "json_object"}``); the schema is only used to parse it, so say in the prompt
                what keys to write.
            include_raw: return ``{"raw": AIMessage, "parsed": ..., "parsing_error": ...}``
                instead of raising when the output does not parse.
            strict: OpenAI's ``strict`` flag, for the tool or the JSON schema.

        Raises:
            InvalidParameterError: an unknown ``method``, or no ``schema`` for a method that needs one.

        Examples:
            >>> import fairagents as fa
            >>> from pydantic import BaseModel
            >>> class Route(BaseModel):
            ...     '''A route between two cities.'''
            ...     origin: str
            ...     destination: str
            >>> llm = ChatFairAgents(arbiter=fa.Arbiter())
            >>> chain = llm.with_structured_output(Route, method="json_schema")
            >>> chain.first.kwargs["response_format"]["json_schema"]["name"]
            'Route'
            >>> llm.with_structured_output(Route).first.kwargs["tool_choice"]
            {'type': 'function', 'function': {'name': 'Route'}}
        """
        if kwargs:
            raise InvalidParameterError(f"with_structured_output takes no argument {', '.join(sorted(kwargs))}")
        if method not in ("function_calling", "json_schema", "json_mode"):
            raise InvalidParameterError(
                f"method must be 'function_calling', 'json_schema' or 'json_mode', got {method!r}"
            )
        if schema is None and method != "json_mode":
            raise InvalidParameterError(f"method {method!r} needs a schema")
        traced = {"ls_structured_output_format": {"kwargs": {"method": method, "strict": strict}, "schema": schema}}
        pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        if method == "function_calling":
            assert schema is not None
            name = convert_to_openai_tool(schema)["function"]["name"]
            llm = self.bind_tools([schema], tool_choice=name, strict=strict, **traced)
            parser: Runnable[Any, Any] = (
                PydanticToolsParser(tools=[schema], first_tool_only=True)
                if pydantic
                else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
            )
        else:
            llm = self.bind(response_format=_response_format(schema, method, strict), **traced)
            parser = PydanticOutputParser(pydantic_object=schema) if pydantic else JsonOutputParser()
        return _parsed(llm, parser, include_raw)

    # -- LangChain's four entry points end here --------------------------------------

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._call(messages, stop, kwargs)
        return _result(call.model, await self._backend().complete(call))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        call = self._call(messages, stop, kwargs)
        async with contextlib.aclosing(self._backend().stream(call)) as pieces:  # type: ignore[type-var]
            async for piece in pieces:
                yield _chunk(call.model, piece)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._call(messages, stop, kwargs)
        return _result(call.model, self._backend().complete_sync(call))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        call = self._call(messages, stop, kwargs)
        with contextlib.closing(self._backend().stream_sync(call)) as pieces:  # type: ignore[type-var]
            for piece in pieces:
                yield _chunk(call.model, piece)

    # -- token counting ------------------------------------------------------------------

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` under the model's own tokenizer (in process; no download).

        LangChain's default would fetch a GPT-2 tokenizer from the network (and hang
        offline). Over a server, the model's tokenizer is not at hand: this raises
        :class:`NotImplementedError` rather than counting with the wrong one.

        Examples:
            >>> import fairagents as fa
            >>> from fairagents.testing import FakeEngine
            >>> arbiter = fa.Arbiter()
            >>> arbiter.add_model("chat", FakeEngine())
            >>> ChatFairAgents(arbiter=arbiter).get_num_tokens("three little words")
            4
        """
        if not text:
            return []
        return list(self._counted(lambda engine: engine.prepare_text(text).token_ids))

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Sequence[ToolLike] | None = None) -> int:
        """Prompt tokens of ``messages`` (and ``tools``) as the model reads them: its chat template, its tokenizer.

        This is what ``trim_messages(messages, token_counter=llm, ...)`` counts with.

        Examples:
            >>> import fairagents as fa
            >>> from fairagents.testing import FakeEngine
            >>> from langchain_core.messages import HumanMessage
            >>> arbiter = fa.Arbiter()
            >>> arbiter.add_model("chat", FakeEngine())
            >>> ChatFairAgents(arbiter=arbiter).get_num_tokens_from_messages([HumanMessage("two words")])
            3
        """
        if not messages:
            return 0
        converted, _ = to_openai(messages)
        rendered = OutputSpec.of(tools=[convert_to_openai_tool(t) for t in tools]).template_tools if tools else None
        return self._counted(lambda engine: engine.prepare_chat(converted, tools=rendered).n_tokens)

    def _counted(self, count: Callable[[Any], T]) -> T:
        """``count(engine)`` with the model's engine; an engine whose tokenizer comes with its start (vLLM's)
        is started first, as a call would start it: through the portal."""
        if self.arbiter is None:
            raise NotImplementedError(
                "token counting needs the model's tokenizer: use ChatFairAgents in process "
                "(arbiter=...); a server does not expose its tokenizer"
            )
        engine = self.arbiter.engine(self.model)
        try:
            return count(engine)
        except EngineError:
            if self.arbiter.loop is not None:  # started, or starting elsewhere: not ours to start
                raise
        backend = self._backend()
        assert isinstance(backend, LocalBackend)
        backend.portal.start()
        return count(engine)

    # -- internals -------------------------------------------------------------------

    def _call(self, messages: list[BaseMessage], stop: list[str] | None, overrides: dict[str, Any]) -> Call:
        unknown = sorted(set(overrides) - set(_PER_CALL))
        if unknown:
            raise InvalidParameterError(
                f"ChatFairAgents takes no parameter {', '.join(unknown)} (it takes {', '.join(_PER_CALL)})"
            )
        params = {name: overrides.get(name, getattr(self, name)) for name in _SAMPLING}
        params["stop"] = tuple(stop if stop is not None else self.stop or ())
        unset = params["max_tokens"] is None  # the arbiter's rule: the rest of the context
        GenerationParams(**{**params, "max_tokens": 1 if unset else params["max_tokens"]})  # bad values fail here
        output = {name: overrides[name] for name in OUTPUT_PARAMS if overrides.get(name) is not None}
        if output.get("tools") and self.parallel_tool_calls is not None:
            output.setdefault("parallel_tool_calls", self.parallel_tool_calls)
        OutputSpec.of(**output)  # so do bad tools and formats
        converted, has_image = to_openai(messages)
        model = overrides.get("model") or self._model_for(has_image)
        # The node is read from the run config LangChain keeps in context, not from the run manager:
        # LangChain 1.x hands none to _stream/_astream, and the context is the same on every path.
        agent = next((who for who in (self.agent, current_node_agent(), current_agent()) if who is not None), None)
        run = current_run()
        return Call(model, converted, {**params, **output}, agent, self.app, run if run is not None else node_run())

    def _model_for(self, has_image: bool) -> str:
        if not has_image:
            return self.model
        if self.vision_model is None:
            raise InvalidParameterError(
                f"the messages carry images, which the text model {self.model!r} cannot take: "
                "set vision_model= to a vision-language model in the pool"
            )
        return self.vision_model

    def _backend(self) -> LocalBackend | RemoteBackend:
        with _BACKEND_LOCK:  # threads' first calls share one backend (and portal), not one each
            if self._connection is None:
                self._connection = self._new_backend()  # built on first use: the fields are the configuration
            return self._connection

    def _new_backend(self) -> LocalBackend | RemoteBackend:
        if self.arbiter is not None:
            return LocalBackend(self.portal or Portal(self.arbiter), timeout=self.timeout)
        assert self.base_url is not None
        key = self.api_key.get_secret_value() if self.api_key is not None else None
        return RemoteBackend(
            self.base_url,
            key,
            timeout=self.timeout,
            max_retries=self.max_retries,
            http_client=self.http_client,
            http_async_client=self.http_async_client,
        )


def _tool_choice(choice: str | bool | dict[str, Any], tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    """LangChain's ``tool_choice`` values as OpenAI's (what the arbiter and the server take)."""
    if isinstance(choice, dict):
        return choice
    if choice is True or choice in ("any", "required"):
        return "required"
    if choice in ("auto", "none"):
        return choice  # type: ignore[return-value]
    names = [tool["function"]["name"] for tool in tools]
    if isinstance(choice, str) and choice in names:
        return {"type": "function", "function": {"name": choice}}
    raise InvalidParameterError(
        f"tool_choice must be 'auto', 'none', 'any', 'required', True or a tool's name ({', '.join(names)}), "
        f"got {choice!r}"
    )


def _response_format(schema: dict[str, Any] | type | None, method: str, strict: bool | None) -> dict[str, Any]:
    if method == "json_mode":
        return {"type": "json_object"}
    assert schema is not None
    function = convert_to_openai_tool(schema, strict=strict)["function"]
    spec = {"name": function["name"], "schema": function.get("parameters") or {"type": "object", "properties": {}}}
    if strict is not None:
        spec["strict"] = strict
    return {"type": "json_schema", "json_schema": spec}


def _parsed(llm: Runnable[Any, Any], parser: Runnable[Any, Any], include_raw: bool) -> Runnable[Any, Any]:
    """``llm`` then ``parser``; with ``include_raw``, the raw message too, and the parsing error instead of raising."""
    if not include_raw:
        return llm | parser
    parse = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    unparsed = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | parse.with_fallbacks([unparsed], exception_key="parsing_error")


def _metadata(model: str, piece: Piece) -> dict[str, Any]:
    return {"model_name": model, "finish_reason": piece.finish_reason, **piece.metadata}


def _tool_calls(piece: Piece) -> tuple[list[ToolCall], list[InvalidToolCall]]:
    """A reply's calls as LangChain's; a call whose arguments are not a JSON object is an invalid one."""
    valid: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for call in piece.tool_calls:
        raw = call.as_openai()
        try:
            parsed = parse_tool_call(raw, return_id=True)
        except OutputParserException as err:
            invalid.append(make_invalid_tool_call(raw, str(err)))
            continue
        if parsed is not None and isinstance(parsed["args"], dict):
            valid.append(parsed)  # type: ignore[arg-type]
        else:
            invalid.append(make_invalid_tool_call(raw, "the arguments are not a JSON object"))
    return valid, invalid


def _result(model: str, piece: Piece) -> ChatResult:
    valid, invalid = _tool_calls(piece)
    message = AIMessage(
        content=piece.text,
        tool_calls=valid,
        invalid_tool_calls=invalid,
        usage_metadata=piece.usage,
        response_metadata=_metadata(model, piece),
    )
    return ChatResult(
        generations=[ChatGeneration(message=message, generation_info={"finish_reason": piece.finish_reason})],
        llm_output={"model_name": model},
    )


def _call_chunks(deltas: Sequence[ToolCallDelta]) -> list[ToolCallChunk]:
    """A piece's call deltas as LangChain's chunks, one per call: chunks of one message are not merged by index."""
    merged: dict[int, ToolCallChunk] = {}
    for d in deltas:
        seen = merged.get(d.index)
        if seen is None:
            merged[d.index] = tool_call_chunk(name=d.name, args=d.arguments, id=d.id, index=d.index)
        else:
            seen.update(name=seen["name"] or d.name, id=seen["id"] or d.id, args=(seen["args"] or "") + d.arguments)
    return list(merged.values())


def _chunk(model: str, piece: Piece) -> ChatGenerationChunk:
    calls = _call_chunks(piece.tool_call_deltas)
    if piece.finish_reason is None:
        return ChatGenerationChunk(message=AIMessageChunk(content=piece.text, tool_call_chunks=calls))
    message = AIMessageChunk(
        content=piece.text,
        tool_call_chunks=calls,
        usage_metadata=piece.usage,
        response_metadata=_metadata(model, piece),
        chunk_position="last",
    )
    return ChatGenerationChunk(message=message, generation_info={"finish_reason": piece.finish_reason})
