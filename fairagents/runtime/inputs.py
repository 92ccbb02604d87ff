"""A call's input made ready: its parameters checked, its prompt prepared, its request queued.

:class:`Inputs` is the path of every call from its arguments to the runner: the checks
that cost nothing first (sampling limits, the one admission check, what the model
cannot do), the work after (the engine's check of the parameters, tokenizing, images
in the preprocessing pool), then :meth:`~fairagents.runtime.runner.Runner.submit`. A
call that is refused is refused before any work on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from fairagents.engines.base import Engine, GenerationParams, ImageEngine, Prompt, capabilities
from fairagents.engines.prompts import Messages, chat_input, text_input
from fairagents.errors import ModalityError
from fairagents.identity import Agent, App, Modality
from fairagents.images import has_images
from fairagents.limits import RequestLimits
from fairagents.runtime.handles import Who
from fairagents.runtime.pool import PoolModel, schedules_fairly
from fairagents.runtime.preprocessing import Preprocessor
from fairagents.runtime.runner import Call, Runner
from fairagents.runtime.sampling import chat_params, engine_checks, generation_params
from fairagents.tools import output_reader

__all__ = ["Inputs"]




class Inputs:
    """Prepares the calls of one arbiter and hands them to its runner.

    Args:
        runner: the arbiter's runner.
        images, text: the preprocessing pools of image requests and of text.
        limits: bounds on a request's shape.
        default_max_tokens: the arbiter's ``max_tokens`` for calls that set none.
    """

    def __init__(self, runner: Runner, *, images: Preprocessor, text: Preprocessor, limits: RequestLimits,
                 default_max_tokens: int | None) -> None:
        self.runner = runner
        self.images = images
        self.text = text
        self.limits = limits
        self.default = default_max_tokens

    # -- calls ------------------------------------------------------------------------

    async def chat(self, model: str, who: Who, messages: Messages | Prompt, arrival: float | None,
                   args: Mapping[str, Any], run: str | None = None) -> Call:
        """Queue a chat call (``args``: :class:`~fairagents.runtime.sampling.ChatArgs`)."""
        arrival = self.runner.clock() if arrival is None else arrival  # before any preparation (DuetInfer)
        params, spec = chat_params(args, self.limits)
        self.limits.check_sampling(stop=params.stop, logit_bias=params.logit_bias)
        m, agent = self._admit(model, who, prepared=isinstance(messages, Prompt))
        reader = output_reader(capabilities(m.engine), spec, model)  # refuses what the model cannot do, before any work
        if engine_checks(params):
            await self._check_params(m.engine, agent.app, params)
        if isinstance(messages, Prompt):
            prompt = text_input(messages)(m.engine)
        elif _with_images(messages):
            prompt = await self._prepare_images(m.engine, model, messages, spec.template_tools, agent.app)
        else:
            prompt = chat_input(messages, spec.template_tools)(m.engine)
        call = self._submit(m, agent, params, prompt, arrival, run, fill=args.get("max_tokens") is None)
        call.reader = reader
        return call

    async def complete(self, model: str, who: Who, prompt: str | Prompt, arrival: float | None,
                       args: Mapping[str, Any], run: str | None = None) -> Call:
        """Queue a completion call (``args``: :class:`~fairagents.runtime.sampling.SamplingArgs`)."""
        arrival = self.runner.clock() if arrival is None else arrival  # before the checks off the loop
        params = generation_params(args)
        self.limits.check_sampling(stop=params.stop, logit_bias=params.logit_bias)
        m, agent = self._admit(model, who, prepared=isinstance(prompt, Prompt))
        if engine_checks(params):
            await self._check_params(m.engine, agent.app, params)
        ready = text_input(prompt)(m.engine)
        return self._submit(m, agent, params, ready, arrival, run, fill=args.get("max_tokens") is None)

    def image(self, model: str, who: Who, prompt: str, *, size: tuple[int, int] | None, steps: int | None, n: int,
              guidance: float | None, seed: int | None, run: str | None = None) -> Call:
        """Queue an image call; ``size`` and ``steps`` default to the model's own."""
        engine = self.runner.pool.get(model).engine
        self.runner.check_open()
        if engine.profile.modality is not Modality.IMAGE or not isinstance(engine, ImageEngine):
            raise ModalityError(f"model {model!r} makes no images (it is a {engine.profile.modality.value} model)",
                                model=model, param="model")
        size = engine.default_size if size is None else size
        steps = engine.default_steps if steps is None else steps
        params = GenerationParams(engine.latent_tokens(size, steps, n), seed=seed)
        m, agent = self.runner.admit(model, who)
        ready = engine.prepare_image(prompt, size=size, steps=steps, n=n, guidance=guidance)
        return self.runner.submit(m, agent, params, ready, self.runner.clock(), run)

    # -- preparing ----------------------------------------------------------------------

    async def prepare_chat(self, model: str, messages: Messages, who: Who,
                           tools: Sequence[dict[str, Any]] | None) -> Prompt:
        """``messages`` made ready for ``model`` in a preprocessing pool (:meth:`fairagents.Arbiter.prepare_chat`)."""
        engine = self.runner.pool.get(model).engine
        app = self._app(who)
        if _with_images(messages):
            return await self._prepare_images(engine, model, messages, tools, app)
        return await self.text.run(chat_input(messages, tools), engine, **_fair(app))

    async def prepare_text(self, model: str, prompt: str | Prompt, who: Who) -> Prompt:
        """A plain prompt tokenized for ``model`` in the text pool (see :meth:`fairagents.Arbiter.prepare_text`)."""
        engine = self.runner.pool.get(model).engine
        return await self.text.run(text_input(prompt), engine, **_fair(self._app(who)))

    def default_max_tokens(self, model: str, prompt_tokens: int, app: str | None) -> int:
        """``max_tokens`` of a call that sets none (see :meth:`fairagents.Arbiter.default_max_tokens`)."""
        pool = self.runner.pool
        m = pool.get(model)
        room = m.engine.max_model_len
        budget = pool.budget(m)
        if budget is None and schedules_fairly(m.engine):  # what the engine's KV holds, the most one request may
            capacity = capabilities(m.engine).token_capacity
            budget = capacity if isinstance(capacity, int) and capacity > 0 else None
        if budget is not None:
            room = min(room, budget - budget % pool.block(m))
        default = self.runner.tenants.max_tokens.get(app or "", self.default)
        rest = room - prompt_tokens
        return max(1, rest if default is None else min(default, rest))

    # -- internals ----------------------------------------------------------------------

    def _admit(self, model: str, who: Who, *, prepared: bool) -> tuple[PoolModel, Agent]:
        """The model and the agent of a call, admitted once before any work on it.

        A ``prepared`` prompt was admitted before its preparation (:meth:`fairagents.Arbiter.check_admission`):
        it is only looked up here, and the dispatcher refuses it if the model went down or
        the app's queue filled since.
        """
        if not prepared:
            return self.runner.admit(model, who)
        self.runner.check_open()
        return self.runner.pool.get(model), self.runner.tenants.resolve(who)

    def _app(self, who: Who) -> App | None:
        return None if who is None else self.runner.tenants.resolve(who).app

    def _submit(self, m: PoolModel, agent: Agent, params: GenerationParams, prompt: Prompt, arrival: float,
                run: str | None, *,
                fill: bool) -> Call:
        """Submit; with ``fill``, ``max_tokens`` is :meth:`default_max_tokens` for the prompt and the app."""
        if fill:
            max_tokens = self.default_max_tokens(m.name, prompt.n_tokens, agent.app.name)
            params = dataclasses.replace(params, max_tokens=max_tokens)
        return self.runner.submit(m, agent, params, prompt, arrival, run)

    async def _prepare_images(self, engine: Engine, model: str, messages: Messages,
                              tools: Sequence[dict[str, Any]] | None, app: App | None) -> Prompt:
        if engine.profile.modality is not Modality.VISION:
            raise ModalityError(f"model {model!r} takes no images (it is a {engine.profile.modality.value} model)",
                                model=model, param="messages")
        return await self.images.run(chat_input(messages, tools), engine, **_fair(app))

    async def _check_params(self, engine: Engine, app: App, params: GenerationParams) -> None:
        """The engine's own check of ``params`` (vLLM's ``SamplingParams.verify``), off the event loop.

        It converts an output constraint into a grammar, so it runs in the text
        preprocessing pool: queued fairly by app, and its time charged to the app that
        asked. The request limits bound how long it can take.
        """
        check = capabilities(engine).check_params
        if check is not None:
            await self.text.run(check, params, **_fair(app))


def _with_images(messages: object) -> bool:
    """Whether ``messages`` is a list of messages with an image part (anything else is checked as text)."""
    return isinstance(messages, Sequence) and not isinstance(messages, str | bytes) and has_images(messages)


def _fair(app: App | None) -> dict[str, Any]:
    """The share of a preprocessing pool a preparation uses: its app's, by the app's weight."""
    return {"app": "", "weight": 1.0} if app is None else {"app": app.name, "weight": app.weight}

