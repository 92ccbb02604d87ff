"""The model calls of an arbiter: chat, completion and image generation, whole or streamed.

:class:`ModelCalls` is the calling surface of :class:`~fairagents.Arbiter`: it checks
a call's parameters and prepares its input (images off the event loop), hands the
request to the arbiter, then waits for its dispatch, streams its engine's output while
reporting progress and its end, and turns it into a :class:`~fairagents.Reply` (or
:class:`~fairagents.ImageReply`).

Examples:
    >>> import fairagents as fa
    >>> from fairagents.calls import ModelCalls
    >>> issubclass(fa.Arbiter, ModelCalls)
    True
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fairagents.dispatcher import Ticket
from fairagents.engines.base import Delta, Engine, GenerationParams, Prompt
from fairagents.errors import EngineError, FairAgentsError, InvalidParameterError, ModalityError, ShutdownError
from fairagents.handles import AgentHandle
from fairagents.identity import Agent, Modality
from fairagents.images import has_images, to_png
from fairagents.limits import RequestLimits
from fairagents.pool import Pool
from fairagents.preprocessing import Preprocessor
from fairagents.prompts import Messages, chat_input, text_input
from fairagents.reply import ImageReply, Reply, Timing, TokenLogprob, Usage
from fairagents.request import Outcome, Request
from fairagents.tenants import Tenants
from fairagents.tools import OutputSpec, ToolCall, ToolReader, output_reader

__all__ = ["Call", "ModelCalls"]

#: Most alternatives per token a call may ask for (``top_logprobs``), as in OpenAI's API.
MAX_TOP_LOGPROBS = 20


@dataclass(eq=False)
class Call:
    """The async side of one request: what its engine needs, and the future its caller awaits.

    Examples:
        >>> from fairagents.calls import Call
        >>> Call.__dataclass_fields__["shutdown"].default
        False
    """

    request: Request
    prompt: Prompt
    params: GenerationParams
    dispatched: asyncio.Future[None]
    """Resolved when the dispatcher hands the request to its engine (or failed when it ends it first)."""
    ticket: Ticket | None = None
    """The dispatcher's accounting of it (kept after it ended, for the reply)."""
    shutdown: bool = False
    """Aborted by the arbiter's shutdown, not by its caller."""
    reader: ToolReader | None = None
    """Reads a chat call's output for tool calls (a call with tools or a response format)."""


class ModelCalls(abc.ABC):
    """The calls an agent makes, on top of an arbiter's submission and run of a request.

    Examples:
        >>> import fairagents as fa
        >>> callable(fa.Arbiter().chat)
        True
    """

    clock: Callable[[], float]
    pool: Pool
    preprocessor: Preprocessor
    text_preprocessor: Preprocessor
    limits: RequestLimits
    tenants: Tenants
    _default_max_tokens: int | None  # max_tokens of the calls that set none, of apps without their own

    async def chat(
        self,
        model: str,
        messages: Messages | Prompt,
        *,
        agent: AgentHandle | Agent | str | None = None,
        max_tokens: int | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: Mapping[int, float] | None = None,
        logprobs: bool = False,
        top_logprobs: int | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        response_format: dict[str, Any] | None = None,
        arrival: float | None = None,
    ) -> Reply:
        """Send a chat request as ``agent`` (or the agent bound in context) and wait for the reply.

        ``agent`` is a handle (``arbiter.app("a").agent("x")``), an :class:`~fairagents.Agent`,
        or a declared agent's name: ``"a/x"``, or ``"x"`` when one app declares an ``x``.

        ``max_tokens`` left unset is the app's or the arbiter's ``default_max_tokens``,
        else the rest of the model's context after the prompt, as much as the model's
        token budget can hold (:meth:`default_max_tokens`): the request reserves all of
        it while it runs, so give a bound when you know one.
        ``presence_penalty`` and ``frequency_penalty`` (in [-2, 2]) and ``logit_bias``
        (token id → bias in [-100, 100]) work as in OpenAI's API. ``logprobs=True``
        returns each output token's log probability in :attr:`Reply.logprobs`, with
        ``top_logprobs`` most likely alternatives per token.

        A message's content may be a list of text and image parts for a vision model
        (:mod:`fairagents.images` lists the shapes: OpenAI ``image_url`` parts with data
        URLs, file paths, PIL images). Such a request is prepared in the preprocessing
        pool and queued with the time it arrived; its image tokens count in its prompt.

        ``tools`` (OpenAI function tools), ``tool_choice`` (``"auto"``, ``"none"``,
        ``"required"`` or ``{"type": "function", "function": {"name": ...}}``),
        ``parallel_tool_calls`` and ``response_format`` (``{"type": "json_object"}`` or
        ``{"type": "json_schema", "json_schema": {"name", "schema"}}``) work as in
        OpenAI's API (see :mod:`fairagents.tools`): the calls come back in
        :attr:`Reply.tool_calls`, with ``finish_reason`` ``"tool_calls"``. A required
        call, a named function and a JSON format are enforced in decoding. Messages may
        carry an assistant's ``tool_calls`` and ``tool`` results.

        ``messages`` may be a :class:`~fairagents.engines.Prompt` from
        :meth:`prepare_chat` (given the same ``tools``), with the ``arrival`` time of the
        call (default: now).

        Raises:
            BadInputError: bad input (an unknown model, app or agent; invalid messages or
                parameters; a prompt longer than the context; an unreadable, unsupported or
                too large image, or an image for a model that takes none): nothing was
                charged or queued.
            EngineError: the model's engine failed.
            OverloadedError: the app's queue, or the preprocessing queue, is full.
            ShutdownError: the arbiter closed before the request finished.
        """
        spec = OutputSpec.of(tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                             response_format=response_format, limits=self.limits)
        params = _chat_params(spec, _params(max_tokens, temperature, top_p, seed, stop, ignore_eos, presence_penalty,
                                            frequency_penalty, logit_bias, logprobs, top_logprobs))
        return await self._collect(await self._chat_call(model, agent, params, messages, spec, arrival,
                                                         fill=max_tokens is None))

    async def stream_chat(
        self,
        model: str,
        messages: Messages | Prompt,
        *,
        agent: AgentHandle | Agent | str | None = None,
        max_tokens: int | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: Mapping[int, float] | None = None,
        logprobs: bool = False,
        top_logprobs: int | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        response_format: dict[str, Any] | None = None,
        arrival: float | None = None,
    ) -> AsyncIterator[Delta]:
        """Like :meth:`chat`, yielding each :class:`~fairagents.engines.Delta` as it is generated.

        With tools, a delta's ``text`` is the model's content and its ``tool_calls`` the
        pieces of its calls (:class:`~fairagents.tools.ToolCallDelta`); the last delta
        has ``finish_reason`` ``"tool_calls"`` when the model called any. With
        ``logprobs=True`` each delta's ``logprobs`` holds its tokens' log probabilities.
        Bad input raises at the first ``__anext__``; stopping iteration early cancels
        the request (it is charged only for what it produced).
        """
        spec = OutputSpec.of(tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                             response_format=response_format, limits=self.limits)
        params = _chat_params(spec, _params(max_tokens, temperature, top_p, seed, stop, ignore_eos, presence_penalty,
                                            frequency_penalty, logit_bias, logprobs, top_logprobs))
        call = await self._chat_call(model, agent, params, messages, spec, arrival, fill=max_tokens is None)
        reader = call.reader
        async with contextlib.aclosing(self._run(call)) as run:
            async for delta in run:
                if reader is None:
                    yield delta
                    continue
                content, pieces = reader.feed(delta.text)
                finish = delta.finish_reason
                if finish in ("stop", "length"):  # what the stream owes, so that it adds up to the reply
                    rest, owed = reader.flush()
                    content, pieces = content + rest, [*pieces, *owed]
                    if finish == "stop" and reader.finish()[1]:
                        finish = "tool_calls"
                yield dataclasses.replace(delta, text=content, finish_reason=finish, tool_calls=tuple(pieces))

    async def complete(
        self,
        model: str,
        prompt: str | Prompt,
        *,
        agent: AgentHandle | Agent | str | None = None,
        max_tokens: int | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: Mapping[int, float] | None = None,
        logprobs: bool = False,
        top_logprobs: int | None = None,
        arrival: float | None = None,
    ) -> Reply:
        """Like :meth:`chat` for a plain prompt, which the model continues (no chat template).

        ``prompt`` is text, tokenized by the model's engine (``prepare_text``), or a
        ready :class:`~fairagents.engines.Prompt` (token ids, or :meth:`prepare_chat`'s
        when the caller needs the prompt's length before sending). ``arrival`` (on
        :attr:`clock`) keeps the time the call came in, before the caller prepared its
        prompt, as its place in the queue. ``max_tokens`` and the sampling parameters
        are :meth:`chat`'s, with the same default. Raises as :meth:`chat`.
        """
        params = _params(max_tokens, temperature, top_p, seed, stop, ignore_eos, presence_penalty, frequency_penalty,
                         logit_bias, logprobs, top_logprobs)
        call = await self._text_call(model, agent, params, prompt, arrival, fill=max_tokens is None)
        return await self._collect(call)

    async def stream_complete(
        self,
        model: str,
        prompt: str | Prompt,
        *,
        agent: AgentHandle | Agent | str | None = None,
        max_tokens: int | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: Mapping[int, float] | None = None,
        logprobs: bool = False,
        top_logprobs: int | None = None,
        arrival: float | None = None,
    ) -> AsyncIterator[Delta]:
        """:meth:`complete`, yielding each :class:`~fairagents.engines.Delta` as :meth:`stream_chat` does."""
        params = _params(max_tokens, temperature, top_p, seed, stop, ignore_eos, presence_penalty, frequency_penalty,
                         logit_bias, logprobs, top_logprobs)
        call = await self._text_call(model, agent, params, prompt, arrival, fill=max_tokens is None)
        async with contextlib.aclosing(self._run(call)) as run:
            async for delta in run:
                yield delta

    async def generate_image(
        self,
        model: str,
        prompt: str,
        *,
        agent: AgentHandle | Agent | str | None = None,
        size: tuple[int, int] | None = None,
        steps: int | None = None,
        n: int = 1,
        guidance: float | None = None,
        seed: int | None = None,
    ) -> ImageReply:
        """Make ``n`` images of ``size`` (width, height) from ``prompt`` on an image model, as ``agent``.

        ``size`` and ``steps`` default to the model's own. The request is charged in
        unified tokens of the denoiser's latent tokens (latent patches × steps × ``n``),
        step by step as the denoiser runs; ``reply.usage.completion_tokens`` counts them.

        Raises:
            BadInputError: as :meth:`chat`, and a size, ``steps`` or ``n`` the model cannot
                make (:class:`~fairagents.InvalidParameterError`), or a model that makes no
                images (:class:`~fairagents.errors.ModalityError`).
            EngineError: the model's engine failed.
            ShutdownError: the arbiter closed before the request finished.
        """
        engine = self._engine_for_images(model)
        if engine.profile.modality is not Modality.IMAGE or not hasattr(engine, "prepare_image"):
            raise ModalityError(
                f"model {model!r} makes no images (it is a {engine.profile.modality.value} model)", model=model,
                param="model",
            )
        size = engine.default_size if size is None else size  # type: ignore[attr-defined]
        steps = engine.default_steps if steps is None else steps  # type: ignore[attr-defined]
        params = GenerationParams(engine.latent_tokens(size, steps, n), seed=seed)  # type: ignore[attr-defined]

        def prepare(engine: Engine) -> Prompt:
            return engine.prepare_image(prompt, size=size, steps=steps, n=n, guidance=guidance)  # type: ignore[attr-defined]

        call = self._submit(model, agent, params, prepare)
        images: tuple[Any, ...] = ()
        finish = "stop"
        async with contextlib.aclosing(self._run(call)) as run:
            async for delta in run:
                images = delta.images or images
                finish = delta.finish_reason or finish
        reply = self._reply(call, "", finish)
        return ImageReply(
            images=list(images), png=[to_png(image) for image in images], finish_reason=finish, model=model,
            request_id=reply.request_id, usage=reply.usage, timing=reply.timing,
        )

    # -- preparing chat input ----------------------------------------------------------

    async def prepare_chat(
        self, model: str, messages: Messages, *, agent: AgentHandle | Agent | str | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> Prompt:
        """``messages`` made ready for ``model``: chat template applied, tokenized, images decoded.

        The work runs off the event loop, in the preprocessing pools (images in one,
        text in another, so text never waits behind images), queued fairly by
        ``agent``'s app. For callers that need the prompt before sending it (its
        length, for usage), then send it with :meth:`complete` or
        :meth:`stream_complete`, passing ``arrival``.

        Raises:
            BadInputError: an unknown model, invalid messages, an unreadable image, or an
                image for a model that takes none.
            OverloadedError: the app's part of the preprocessing pool is full.
        """
        engine = self.pool.get(model).engine
        app, weight = self._fair_key(agent)
        if isinstance(messages, Sequence) and not isinstance(messages, str | bytes) and has_images(messages):
            if engine.profile.modality is not Modality.VISION:
                raise ModalityError(
                    f"model {model!r} takes no images (it is a {engine.profile.modality.value} model)", model=model,
                    param="messages",
                )
            return await self.preprocessor.run(chat_input(messages, tools), engine, app=app, weight=weight)
        return await self.text_preprocessor.run(chat_input(messages, tools), engine, app=app, weight=weight)

    async def prepare_text(
        self, model: str, prompt: str | Prompt, *, agent: AgentHandle | Agent | str | None = None
    ) -> Prompt:
        """A plain prompt tokenized for ``model`` (a ready :class:`Prompt` checked), off the event loop.

        Like :meth:`prepare_chat`, for completions.

        Raises:
            BadInputError: an unknown model, an empty prompt, token ids outside the
                vocabulary, or a prompt longer than the context.
            OverloadedError: the app's part of the preprocessing pool is full.
        """
        engine = self.pool.get(model).engine
        app, weight = self._fair_key(agent)
        return await self.text_preprocessor.run(text_input(prompt), engine, app=app, weight=weight)

    def _fair_key(self, agent: AgentHandle | Agent | str | None) -> tuple[str, float]:
        """The app whose share of the preprocessing pools a preparation uses, and its weight."""
        if agent is None:
            return "", 1.0
        app = self.tenants.resolve(agent).app
        return app.name, app.weight

    async def _chat_call(
        self, model: str, who: AgentHandle | Agent | str | None, params: GenerationParams, messages: Messages,
        spec: OutputSpec | None = None, arrival: float | None = None, *, fill: bool = False,
    ) -> Call:
        """Queue a chat call: text at once; with images, after preparing them in the pool.

        With ``fill``, ``params.max_tokens`` is replaced by :meth:`default_max_tokens` once
        the prompt is known.
        """
        spec = spec or OutputSpec()
        arrival = self.clock() if arrival is None else arrival  # before any preparation (DuetInfer)
        self.limits.check_sampling(stop=params.stop, logit_bias=params.logit_bias)
        readers: list[ToolReader | None] = []

        def reading(prepare: Callable[[Engine], Prompt]) -> Callable[[Engine], Prompt]:
            def prepared(engine: Engine) -> Prompt:
                readers.append(output_reader(engine, spec, model))  # refuses what the model cannot do, first
                return prepare(engine)
            return prepared

        if _engine_checks(params):  # what the engine would refuse is bad input, refused before queueing
            self.check_admission(model, who)
            output_reader(self.pool.get(model).engine, spec, model)
            await self._check_params(model, who, params)
        if isinstance(messages, Prompt):  # prepared already (prepare_chat)
            call = self._queue(model, who, params, reading(text_input(messages)), arrival, fill)
        elif not isinstance(messages, Sequence) or isinstance(messages, str | bytes) or not has_images(messages):
            call = self._queue(model, who, params, reading(chat_input(messages, spec.template_tools)), arrival, fill)
        else:
            self.check_admission(model, who)  # typed errors (and a full queue) before any image work
            output_reader(self.pool.get(model).engine, spec, model)
            prompt = await self.prepare_chat(model, messages, agent=who, tools=spec.template_tools)
            call = self._queue(model, who, params, reading(lambda _: prompt), arrival, fill)
        call.reader = readers[0]
        return call

    async def _text_call(
        self, model: str, who: AgentHandle | Agent | str | None, params: GenerationParams, prompt: str | Prompt,
        arrival: float | None, *, fill: bool,
    ) -> Call:
        """Queue a completion call (``fill``: as :meth:`_chat_call`)."""
        arrival = self.clock() if arrival is None else arrival  # before the checks off the loop
        self.limits.check_sampling(stop=params.stop, logit_bias=params.logit_bias)
        if _engine_checks(params):
            self.check_admission(model, who)
            await self._check_params(model, who, params)
        return self._queue(model, who, params, text_input(prompt), arrival, fill)

    async def _check_params(self, model: str, who: AgentHandle | Agent | str | None, params: GenerationParams) -> None:
        """The engine's own check of ``params`` (vLLM's ``SamplingParams.verify``), off the event loop.

        It converts an output constraint into a grammar, so it runs in the text
        preprocessing pool: queued fairly by app, and its time charged to the app that
        asked. ``self.limits`` bounds how long it can take.
        """
        check = getattr(self.pool.get(model).engine, "check_params", None)
        if check is not None:
            app, weight = self._fair_key(who)
            await self.text_preprocessor.run(check, params, app=app, weight=weight)

    def _queue(
        self, model: str, who: AgentHandle | Agent | str | None, params: GenerationParams,
        prepare: Callable[[Engine], Prompt], arrival: float | None, fill: bool,
    ) -> Call:
        """Submit a call; with ``fill``, its ``max_tokens`` is :meth:`default_max_tokens` for its prompt and app."""
        if not fill:
            return self._submit(model, who, params, prepare, arrival=arrival)
        self.check_admission(model, who)  # as the submission would, before preparing
        prompt = prepare(self.pool.get(model).engine)
        app = self.tenants.resolve(who).app.name
        params = dataclasses.replace(params, max_tokens=self.default_max_tokens(model, prompt.n_tokens, app=app))
        return self._submit(model, who, params, lambda _: prompt, arrival=arrival)

    def default_max_tokens(self, model: str, prompt_tokens: int, *, app: str | None = None) -> int:
        """``max_tokens`` of a call that sets none: the default of its ``app``, else the arbiter's, else the context.

        The one rule of every call (``chat``, ``stream_chat``, ``complete``,
        ``stream_complete``, and the server's endpoints). With no default set (the
        arbiter's ``default_max_tokens`` and the app's are ``None``), the output may run
        to the end of the context, as vLLM's OpenAI server has it. Either way it is
        clipped to what fits: a request reserves ``prompt + max_tokens`` of the model's
        token budget while it runs, so the rest of the context is also capped by the
        budget (in whole KV blocks): such a request never asks for more than the model
        can hold. A prompt that leaves no room gets 1, which the context check then refuses.

        Examples:
            >>> import fairagents as fa
            >>> from fairagents.testing import FakeEngine
            >>> arbiter = fa.Arbiter(token_budget=600, default_max_tokens=256)
            >>> arbiter.add_model("chat", FakeEngine(max_model_len=1024))
            >>> _ = arbiter.app("essays", default_max_tokens=2000)
            >>> arbiter.default_max_tokens("chat", 100), arbiter.default_max_tokens("chat", 100, app="essays")
            (256, 500)
        """
        m = self.pool.get(model)
        room = m.engine.max_model_len
        budget = self.pool.budget(m)
        if budget is not None:
            room = min(room, budget - budget % self.pool.block(m))
        default = self.tenants.max_tokens.get(app or "", self._default_max_tokens)
        rest = room - prompt_tokens
        return max(1, rest if default is None else min(default, rest))

    # -- what the arbiter provides -------------------------------------------------

    @abc.abstractmethod
    def _submit(
        self, model: str, who: AgentHandle | Agent | str | None, params: GenerationParams,
        prepare: Callable[[Engine], Prompt], *, arrival: float | None = None,
    ) -> Call:
        """Validate, prepare and queue a request."""

    @abc.abstractmethod
    def check_admission(self, model: str, agent: AgentHandle | Agent | str | None) -> None:
        """Raise what submitting a request of ``agent`` to ``model`` now would, before preparing it."""

    @abc.abstractmethod
    def _check_open(self) -> None:
        """Raise :class:`~fairagents.ShutdownError` unless the arbiter is running."""

    @abc.abstractmethod
    def _engine_for_images(self, model: str) -> Engine:
        """The engine of an image model, for a running arbiter (typed errors otherwise)."""

    @abc.abstractmethod
    def _engine_of(self, call: Call) -> Engine:
        """The engine that runs ``call``."""

    @abc.abstractmethod
    def _progress(self, call: Call, new_tokens: int) -> None:
        """``call`` produced ``new_tokens`` output tokens."""

    @abc.abstractmethod
    def _end(self, call: Call, outcome: Outcome) -> None:
        """``call`` ended; never raises."""

    @abc.abstractmethod
    def _fail_model(self, model: str, err: EngineError) -> None:
        """A request on ``model`` failed in its engine (the model goes down if the engine is dead)."""

    # -- running a call -----------------------------------------------------------------

    async def _run(self, call: Call) -> AsyncIterator[Delta]:
        """Wait for the call's dispatch, stream its engine's output, and report progress and its end."""
        r = call.request
        outcome = Outcome.CANCELLED
        try:
            await call.dispatched
            stream = self._engine_of(call).generate(r.id, call.prompt, call.params)
            try:
                async for delta in stream:
                    if delta.new_tokens:
                        self._progress(call, delta.new_tokens)
                    if delta.finish_reason == "abort" and call.shutdown:
                        raise ShutdownError("the arbiter shut down and aborted the request after the drain timeout",
                                            model=r.model, app=r.app, request_id=r.id)
                    yield delta
            finally:
                await stream.aclose()
            outcome = Outcome.FINISHED
        except EngineError as err:
            outcome = Outcome.FAILED
            self._fail_model(r.model, err)
            if err.model is None:  # the engine's own error: say which model and request it is about
                raise EngineError(str(err), model=r.model, app=r.app, agent=r.agent.name, request_id=r.id) from err
            raise
        except (asyncio.CancelledError, GeneratorExit):
            outcome = Outcome.FAILED if call.shutdown else Outcome.CANCELLED
            raise
        except FairAgentsError:  # shut down, or rejected by the engine after dispatch
            outcome = Outcome.FAILED
            raise
        except Exception as err:  # an engine bug in this request's stream: surface it typed
            outcome = Outcome.FAILED
            failure = EngineError(f"model {r.model!r} failed: {err!r}", model=r.model, app=r.app, request_id=r.id)
            self._fail_model(r.model, failure)
            raise failure from err
        finally:
            self._end(call, outcome)

    # -- replies --------------------------------------------------------------------

    async def _collect(self, call: Call) -> Reply:
        texts, finish, logprobs = [], "stop", []
        async with contextlib.aclosing(self._run(call)) as run:
            async for delta in run:
                texts.append(delta.text)
                logprobs.extend(delta.logprobs)
                finish = delta.finish_reason or finish
        text = "".join(texts)
        tokens = None if call.params.logprobs is None else tuple(logprobs)
        if call.reader is None:
            return self._reply(call, text, finish, logprobs=tokens)
        content, calls = call.reader.finish(text)
        if calls and finish == "stop":
            finish = "tool_calls"
        return self._reply(call, content or "", finish, tuple(calls), logprobs=tokens)

    def _reply(self, call: Call, text: str, finish: str, tool_calls: tuple[ToolCall, ...] = (), *,
               logprobs: tuple[TokenLogprob, ...] | None = None) -> Reply:
        r = call.request
        t = call.ticket
        assert t is not None  # set when it was queued
        end = self.clock()
        dispatched = end if t.dispatched is None else t.dispatched
        return Reply(
            text=text,
            finish_reason=finish,
            model=r.model,
            request_id=r.id,
            usage=Usage(r.prompt_tokens, t.produced, t.charged),
            timing=Timing(
                queue_wait=dispatched - r.arrival,
                ttft=None if t.first_token is None else t.first_token - r.arrival,
                e2e=end - r.arrival,
            ),
            tool_calls=tool_calls,
            logprobs=logprobs,
        )


def _params(
    max_tokens: int | None, temperature: float, top_p: float, seed: int | None, stop: Sequence[str],
    ignore_eos: bool, presence_penalty: float, frequency_penalty: float, logit_bias: Mapping[int, float] | None,
    logprobs: bool, top_logprobs: int | None,
) -> GenerationParams:
    """A call's sampling parameters, checked; ``max_tokens=None`` stands as 1 until the prompt is known."""
    if not isinstance(logprobs, bool):
        raise InvalidParameterError(f"logprobs must be true or false, got {logprobs!r}", param="logprobs")
    if top_logprobs is not None and not logprobs:
        raise InvalidParameterError("top_logprobs needs logprobs=True", param="top_logprobs")
    if top_logprobs is not None and (isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int)
                                     or not 0 <= top_logprobs <= MAX_TOP_LOGPROBS):
        raise InvalidParameterError(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top_logprobs!r}",
                                    param="top_logprobs")
    return GenerationParams(
        1 if max_tokens is None else max_tokens, temperature, top_p, seed, tuple(stop), ignore_eos,
        presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, logit_bias=logit_bias or (),
        logprobs=(top_logprobs or 0) if logprobs else None,
    )


def _chat_params(spec: OutputSpec, params: GenerationParams) -> GenerationParams:
    """A chat call's sampling parameters, with its output constraint."""
    return dataclasses.replace(params, structured=spec.constraint(), skip_special_tokens=not spec.calls_tools)


def _engine_checks(params: GenerationParams) -> bool:
    """Whether the engine checks ``params`` before the call is queued: whether they ask what only it can judge.

    That is an output constraint to compile, log probabilities (it bounds how many), or a
    logit bias (its token ids must be in the vocabulary).
    """
    return params.structured is not None or params.logprobs is not None or bool(params.logit_bias)
