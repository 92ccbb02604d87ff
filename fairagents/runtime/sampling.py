"""The sampling arguments of a call, defined once: the keywords of ``chat``, ``complete`` and their streams.

:class:`SamplingArgs` types the keywords every text call takes, :class:`ChatArgs` adds a
chat's tools and output format; the calls of :class:`~fairagents.Arbiter` and of an
agent's handle take them as ``**sampling``, and :func:`generation_params` turns them into
the engine's :class:`~fairagents.engines.GenerationParams`, checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from fairagents.engines.base import GenerationParams
from fairagents.errors import InvalidParameterError, shown
from fairagents.limits import MAX_TOP_LOGPROBS, RequestLimits
from fairagents.tools import OutputSpec

__all__ = ["OUTPUT_PARAMS", "SAMPLING_PARAMS", "ChatArgs", "SamplingArgs", "chat_params", "engine_checks",
           "generation_params"]


class SamplingArgs(TypedDict, total=False):
    """Sampling keywords of a text call (``complete``, ``chat`` and their streams), as in OpenAI's API.

    ``max_tokens`` left unset (or ``None``) is the app's or the arbiter's
    ``default_max_tokens``, else the rest of the model's context
    (:meth:`~fairagents.Arbiter.default_max_tokens`). ``presence_penalty`` and
    ``frequency_penalty`` are in [-2, 2], vLLM's ``repetition_penalty`` in (0, 2] (1: none), ``top_k`` ≥ 0 (0: all tokens), ``logit_bias`` maps token ids to a bias in
    [-100, 100]; ``logprobs=True`` returns each output token's log probability with
    ``top_logprobs`` (at most 20) alternatives.

    Examples:
        >>> from fairagents.runtime.sampling import SamplingArgs, generation_params
        >>> args: SamplingArgs = {"max_tokens": 64, "temperature": 0.2, "stop": ["\\n"]}
        >>> params = generation_params(args)
        >>> params.max_tokens, params.temperature, params.stop
        (64, 0.2, ('\\n',))
    """

    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: Sequence[str]
    ignore_eos: bool
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    top_k: int
    logit_bias: Mapping[int, float] | None
    logprobs: bool
    top_logprobs: int | None


class ChatArgs(SamplingArgs, total=False):
    """:class:`SamplingArgs` and a chat's tools and output format (see :mod:`fairagents.tools`).

    ``tools`` are OpenAI function tools; ``tool_choice`` is ``"auto"``, ``"none"``,
    ``"required"`` or ``{"type": "function", "function": {"name": ...}}``;
    ``response_format`` is ``{"type": "json_object"}`` or ``{"type": "json_schema",
    "json_schema": {"name", "schema"}}``.
    """

    tools: Sequence[dict[str, Any]] | None
    tool_choice: str | dict[str, Any] | None
    parallel_tool_calls: bool | None
    response_format: dict[str, Any] | None


#: The sampling keywords of every text call, in order (:class:`SamplingArgs`).
SAMPLING_PARAMS: tuple[str, ...] = tuple(SamplingArgs.__annotations__)
#: The keywords a chat takes besides: its tools and output format (:class:`ChatArgs`).
OUTPUT_PARAMS: tuple[str, ...] = tuple(k for k in ChatArgs.__annotations__ if k not in SAMPLING_PARAMS)
_SAMPLING = frozenset(SAMPLING_PARAMS)
_OUTPUT = frozenset(OUTPUT_PARAMS)


def generation_params(args: Mapping[str, Any], *, call: str = "complete") -> GenerationParams:
    """``args`` (:class:`SamplingArgs`) checked and made the engine's parameters.

    ``max_tokens`` unset stands as 1 until the prompt is known (the caller fills it).
    A keyword that is not a sampling argument is a :class:`TypeError`, as for any call.
    """
    unknown = sorted(set(args) - _SAMPLING)
    if unknown:
        raise TypeError(f"{call}() got an unexpected keyword argument {unknown[0]!r}")
    logprobs, top = args.get("logprobs", False), args.get("top_logprobs")
    if not isinstance(logprobs, bool):
        raise InvalidParameterError(f"logprobs must be true or false, got {shown(logprobs)}", param="logprobs")
    if top is not None and not logprobs:
        raise InvalidParameterError("top_logprobs needs logprobs=True", param="top_logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise InvalidParameterError(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {shown(top)}",
                                    param="top_logprobs")
    max_tokens = args.get("max_tokens")
    return GenerationParams(
        1 if max_tokens is None else max_tokens, args.get("temperature", 1.0), args.get("top_p", 1.0),
        args.get("seed"), tuple(args.get("stop", ())), args.get("ignore_eos", False),
        presence_penalty=args.get("presence_penalty", 0.0), frequency_penalty=args.get("frequency_penalty", 0.0),
        repetition_penalty=args.get("repetition_penalty", 1.0), top_k=args.get("top_k", 0),
        logit_bias=args.get("logit_bias") or (), logprobs=(top or 0) if logprobs else None,
    )


def chat_params(args: Mapping[str, Any], limits: RequestLimits) -> tuple[GenerationParams, OutputSpec]:
    """A chat call's parameters (``args``: :class:`ChatArgs`), with its output constraint, and its output spec."""
    output = {k: v for k, v in args.items() if k in _OUTPUT}
    sampling = {k: v for k, v in args.items() if k not in _OUTPUT}
    spec = OutputSpec.of(**output, limits=limits)
    params = generation_params(sampling, call="chat")
    return dataclasses.replace(params, structured=spec.constraint(), skip_special_tokens=not spec.calls_tools), spec


def engine_checks(params: GenerationParams) -> bool:
    """Whether the engine checks ``params`` before the call is queued: they ask what only it can judge.

    That is an output constraint to compile, log probabilities (it bounds how many), or a
    logit bias (its token ids must be in the vocabulary).
    """
    return params.structured is not None or params.logprobs is not None or bool(params.logit_bias)
