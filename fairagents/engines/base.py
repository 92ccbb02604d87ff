"""The engine interface: what the arbiter needs from anything that runs a model.

An engine turns a prepared prompt into a stream of :class:`Delta` events. The
arbiter owns the queue and the order; the engine only runs what it is handed, so
its own (FCFS) waiting queue stays short. :class:`Engine` is the contract;
:class:`EngineBase` gives the optional capabilities (batch and KV capacity, tools,
output constraints ...) their defaults, and :func:`capabilities` reads them from any
engine.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from fairagents.cost import ModelProfile
from fairagents.errors import InvalidParameterError, shown
from fairagents.identity import Agent, identity_args
from fairagents.reply import TokenLogprob
from fairagents.tools import OutputSpec, ToolCallDelta

if TYPE_CHECKING:
    from fairagents.policies.pooled import PoolPolicy

__all__ = ["Delta", "Engine", "EngineBase", "GenerationParams", "ImageEngine", "Prompt", "capabilities"]

COMPACT_JSON: dict[str, Any] = {"backend": "xgrammar", "disable_any_whitespace": True}
"""vLLM's ``StructuredOutputsConfig`` for compact constrained JSON, which engines use unless told
``compact_json=False`` (vLLM takes the whitespace rule per engine, and only with a named backend). A
replica started with ``vllm serve`` takes it as ``--structured-outputs-config.backend xgrammar
--structured-outputs-config.disable_any_whitespace true``."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """A request made ready for an engine: its prompt tokens, and engine-specific data.

    Examples:
        >>> from fairagents.engines import Prompt
        >>> Prompt(token_ids=(1, 2, 3)).n_tokens
        3
    """

    token_ids: Sequence[int]
    """The prompt as the model's token ids (image tokens included)."""
    data: Any = field(default=None, compare=False)
    """Whatever else the engine needs (multimodal inputs); opaque to the arbiter."""

    @property
    def n_tokens(self) -> int:
        """Prompt length in the model's raw tokens."""
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """Sampling parameters of one request.

    Examples:
        >>> from fairagents.engines import GenerationParams
        >>> GenerationParams(max_tokens=0)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: max_tokens must be an integer ≥ 1, got 0
        >>> GenerationParams(max_tokens=8, logit_bias={"42": 100}).logit_bias
        ((42, 100.0),)
        >>> GenerationParams(max_tokens=8, presence_penalty=3)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: presence_penalty must be a number in [-2, 2], got 3
    """

    max_tokens: int
    """Most tokens to generate (≥ 1)."""
    temperature: float = 1.0
    """Sampling temperature, in [0, 2] as OpenAI's and vLLM's (0 is greedy)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    seed: int | None = None
    """Seed of the request's sampler, for reproducible output (a 64-bit signed integer)."""
    stop: tuple[str, ...] = ()
    """Strings that end generation."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token (benchmarks)."""
    structured: dict[str, Any] | None = field(default=None, compare=False)
    """A constraint the output must meet, enforced in decoding: the fields of vLLM's
    ``StructuredOutputsParams`` (``{"json": schema}``, ``{"json_object": True}``); see
    :meth:`fairagents.tools.OutputSpec.constraint`. Engines without ``structured_outputs``
    refuse it."""
    skip_special_tokens: bool = True
    """Leave special tokens out of the output's text (tool parsers of some models need them kept)."""
    logprobs: int | None = None
    """Report each output token's log probability with this many most likely alternatives
    (``0``: the sampled token's alone) in :attr:`Delta.logprobs`; ``None``: none. Engines
    bound it (vLLM: its ``max_logprobs``, 20 by default)."""
    presence_penalty: float = 0.0
    """Penalty in [-2, 2] on tokens that already appeared in the output (positive: new topics)."""
    frequency_penalty: float = 0.0
    """Penalty in [-2, 2] on tokens by how often they appeared in the output (positive: less repetition)."""
    repetition_penalty: float = 1.0
    """vLLM's multiplicative penalty in (0, 2] on tokens already in the prompt or output (1: none; above 1: less repetition)."""
    top_k: int = 0
    """Sample among the ``top_k`` most likely tokens only (0: all of them), as vLLM's and Anthropic's ``top_k``."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """Bias in [-100, 100] added to the logits of token ids, as ``(token_id, bias)`` pairs sorted by id;
    a mapping (keys ints or their decimal strings, as in OpenAI's API) is taken too. ``±100``
    in effect bans or forces a token. Ids must be in the model's vocabulary."""
    agent: Agent | None = field(default=None, compare=False)
    """Who asks, set by the arbiter: an engine that schedules by identity passes it on
    (``VLLMEngine(scheduler="fair")`` as ``SamplingParams.extra_args``)."""
    run: str | None = field(default=None, compare=False)
    """The run the request belongs to, set by the arbiter with :attr:`agent` and passed on with it."""

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidParameterError(f"max_tokens must be an integer ≥ 1, got {_clip(self.max_tokens)}",
                                        param="max_tokens")
        if not isinstance(self.temperature, int | float) or not 0 <= self.temperature <= 2:
            raise InvalidParameterError(f"temperature must be a number in [0, 2], got {_clip(self.temperature)}",
                                        param="temperature")
        if not isinstance(self.top_p, int | float) or not 0 < self.top_p <= 1:
            raise InvalidParameterError(f"top_p must be in (0, 1], got {_clip(self.top_p)}", param="top_p")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not -(2**63) <= self.seed < 2**63):
            # Samplers seed a 64-bit generator: a larger seed overflows inside the engine's step.
            raise InvalidParameterError(f"seed must be a 64-bit signed integer, got {_clip(self.seed)}", param="seed")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidParameterError(f"stop must be a sequence of non-empty strings, got {_clip(self.stop)}",
                                        param="stop")
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or self.logprobs < 0):
            raise InvalidParameterError(f"logprobs must be an integer ≥ 0 (alternatives per token) or None, "
                                        f"got {_clip(self.logprobs)}", param="logprobs")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not -2 <= value <= 2:
                raise InvalidParameterError(f"{name} must be a number in [-2, 2], got {_clip(value)}", param=name)
        penalty = self.repetition_penalty
        if isinstance(penalty, bool) or not isinstance(penalty, int | float) or not 0 < penalty <= 2:
            raise InvalidParameterError(f"repetition_penalty must be a number in (0, 2], got {_clip(penalty)}",
                                        param="repetition_penalty")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidParameterError(f"top_k must be an integer ≥ 0 (0: all tokens), got {_clip(self.top_k)}",
                                        param="top_k")
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))

    def sampling_fields(self) -> dict[str, Any]:
        """These parameters as vLLM's ``SamplingParams`` fields, but for the constraint and the logit bias.

        Those two take a form that depends on where the parameters go: vLLM's objects in
        this process, JSON to a replica.

        Examples:
            >>> from fairagents.engines import GenerationParams
            >>> GenerationParams(max_tokens=8, stop=["\\n"]).sampling_fields()["stop"]
            ['\\n']
        """
        return {
            "max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
            "stop": list(self.stop) or None, "ignore_eos": self.ignore_eos,
            "skip_special_tokens": self.skip_special_tokens, "logprobs": self.logprobs,
            "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty, "top_k": self.top_k,
            "extra_args": None if self.agent is None else identity_args(self.agent, self.run),
        }


@dataclass(frozen=True, slots=True)
class Delta:
    """What a request produced since the last event.

    Examples:
        >>> from fairagents.engines import Delta
        >>> stream = [Delta(1, "Hel"), Delta(1, "lo", "stop")]
        >>> "".join(d.text for d in stream), sum(d.new_tokens for d in stream), stream[-1].finish_reason
        ('Hello', 2, 'stop')
    """

    new_tokens: int
    """Output tokens generated since the last event (raw tokens, ≥ 0)."""
    text: str = ""
    """Text of those tokens."""
    finish_reason: str | None = None
    """Set on the last event: ``"stop"``, ``"length"`` or ``"abort"``."""
    images: tuple[Any, ...] = ()
    """Images made (``PIL.Image.Image``), on the last event of an image-generation request."""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    """Pieces of tool calls, on a chat stream with tools (``finish_reason`` is then ``"tool_calls"``)."""
    logprobs: tuple[TokenLogprob, ...] = ()
    """Log probabilities of the tokens generated since the last event, one per token, when
    the request asked for them (:attr:`GenerationParams.logprobs`)."""
    cached_tokens: int | None = None
    """Prompt tokens the engine read from its prefix cache rather than computed, on events
    from the first token on (``None``: the engine does not say); charged at ``w_cached``."""


# Most digits of a token id in ``logit_bias``: engines keep ids in 64 bits (below 2**63, 19 digits).
_MAX_TOKEN_DIGITS = 19


def _logit_bias(bias: Any) -> tuple[tuple[int, float], ...]:
    """``bias`` as sorted ``(token_id, bias)`` pairs, checked: ids ≥ 0, biases finite in [-100, 100]."""
    pairs = list(bias.items()) if isinstance(bias, Mapping) else bias
    if isinstance(pairs, str | bytes) or not isinstance(pairs, Sequence):
        raise InvalidParameterError(f"logit_bias must map token ids to biases, got {_clip(bias)}", param="logit_bias")
    out: dict[int, float] = {}
    for item in pairs:
        if not isinstance(item, Sequence) or isinstance(item, str | bytes) or len(item) != 2:
            raise InvalidParameterError(f"logit_bias must map token ids to biases, got {_clip(bias)}",
                                        param="logit_bias")
        token, value = item
        if isinstance(token, str) and token.isascii() and token.isdigit():
            token = token.lstrip("0") or "0"
            if len(token) > _MAX_TOKEN_DIGITS:  # past any vocabulary; past 4,300 digits int() cannot read it
                raise InvalidParameterError(f"logit_bias: token id {_clip(token)} is past any vocabulary",
                                            param="logit_bias")
            token = int(token)
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise InvalidParameterError(f"logit_bias: {_clip(token)} is not a token id (an integer ≥ 0)",
                                        param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:  # NaN too
            raise InvalidParameterError(f"logit_bias: the bias of token {token} must be a number in [-100, 100], "
                                        f"got {_clip(value)}", param="logit_bias")
        out[token] = float(value)
    return tuple(sorted(out.items()))


def _clip(value: Any, limit: int = 80) -> str:
    """``value``'s repr, cut to ``limit`` characters (:func:`fairagents.errors.shown`).

    Examples:
        >>> from fairagents.engines.base import _clip
        >>> _clip(2**64), _clip(-(10**5000))
        ('18446744073709551616', 'an integer of about 5001 digits')
    """
    return shown(value, limit)


@runtime_checkable
class Engine(Protocol):
    """Runs one model. The contract the arbiter relies on:

    - ``profile`` and ``max_model_len`` are valid after ``await start()``.
    - ``prepare_chat`` turns OpenAI-style messages into a :class:`Prompt`, and
      ``prepare_text`` a plain prompt (completions: no chat template), raising a
      :class:`~fairagents.BadInputError` for input they cannot take. Both are
      synchronous and may run in a worker thread.
    - ``generate`` yields :class:`Delta` events for one request, the last with a
      ``finish_reason``; it starts the request at once (no queueing of its own beyond
      the engine's batch). It is an async generator: the arbiter always closes it
      (``aclose()``), and closing it early aborts the request in the engine.
    - ``abort`` ends a running request; its stream then ends with ``"abort"``.
    - A failure of the engine itself raises :class:`~fairagents.EngineError` from
      ``generate``; after that ``healthy`` is false.
    - ``profile.modality`` says what the model takes and gives. A vision engine's
      ``prepare_chat`` also takes image parts (it decodes and resizes them: the
      arbiter runs it in its preprocessing pool when a request carries images). An
      image engine (:class:`ImageEngine`) makes a request's :class:`Prompt` with
      ``prepare_image``; its ``Delta.new_tokens`` count latent tokens per denoising
      step, and its last event carries the images in ``Delta.images``.
    - Optional capabilities are :class:`EngineBase`'s attributes: an engine declares
      those it has (subclassing :class:`EngineBase`, or as attributes of its own).

    Examples:
        >>> from fairagents.engines import Engine
        >>> from fairagents.testing import FakeEngine
        >>> isinstance(FakeEngine(), Engine), isinstance(object(), Engine)
        (True, False)
    """

    profile: ModelProfile
    max_model_len: int
    healthy: bool

    async def start(self) -> None:
        """Load the model; idempotent."""
        ...

    async def stop(self) -> None:
        """Release the model; idempotent."""
        ...

    def prepare_chat(self, messages: Sequence[dict[str, Any]]) -> Prompt:
        """Apply the chat template and tokenize."""
        ...

    def prepare_text(self, text: str) -> Prompt:
        """Tokenize a plain prompt as the model reads it (special tokens such as BOS included)."""
        ...

    def generate(self, request_id: str, prompt: Prompt, params: GenerationParams) -> AsyncGenerator[Delta, None]:
        """Run one request, streaming what it produces."""
        ...

    async def abort(self, request_id: str) -> None:
        """End a running request early."""
        ...


class EngineBase:
    """The optional capabilities of an engine, with their defaults: subclass it and set those yours has.

    Capacities are read after ``start()``. An engine written against :class:`Engine`
    alone may declare any of them as attributes of its own; :func:`capabilities`
    reads them with these defaults.

    Examples:
        >>> from fairagents.engines import EngineBase
        >>> class Batched(EngineBase):   # plus Engine's members: profile, start(), generate() ...
        ...     max_num_seqs = 8
        >>> engine = Batched()
        >>> engine.max_num_seqs, engine.token_capacity, engine.kv_block_size, engine.tool_parser
        (8, None, 1, None)
    """

    max_num_seqs: int | None = None
    """Batch capacity: the arbiter's default in-flight limit for the model (``None``: the arbiter's own)."""
    token_capacity: int | None = None
    """KV tokens the running requests can hold at once: the arbiter's default token budget (``None``: none)."""
    kv_block_size: int = 1
    """Tokens per KV block: the arbiter rounds each request's reservation up to whole blocks."""
    vocab_size: int | None = None
    """The model's vocabulary size: a ready prompt's token ids must be below it (``None``: not checked)."""
    max_token_bytes: int | None = None
    """The most UTF-8 bytes one token stands for: a prompt of more than ``max_model_len × max_token_bytes``
    characters is refused without tokenizing it (``None``: no such check)."""
    structured_outputs: bool = False
    """``generate`` enforces ``GenerationParams.structured``; without it, output constraints are refused."""
    tool_parser: Callable[[OutputSpec], Any] | None = None
    """``tool_parser(spec)``: the model's tool parser (vLLM's ``ToolParser``) for one call's tools, raising
    :class:`~fairagents.InvalidParameterError` when it has none; ``prepare_chat`` then takes ``tools=``
    (rendered by the chat template). ``None``: the model takes no tools."""
    check_params: Callable[[GenerationParams], None] | None = None
    """``check_params(params)``: refuse, with :class:`~fairagents.InvalidParameterError`, parameters the
    engine would reject; the arbiter runs it off the event loop before a call is queued."""
    shared_capacity: bool = False
    """Other arbiters may send to the same capacity (remote replicas): arbiters that share counters
    draw on it as one (:mod:`fairagents.shared`)."""
    scheduler: str | None = None
    """``"fair"``: the engine orders its queue and preempts by the pool's policy itself, so the arbiter
    hands it each request at once and shares its policy with it (``share_policy``); else it runs
    what it is handed."""
    pool_policy: PoolPolicy | None = None
    """With ``scheduler="fair"``: the pool's policy the engine schedules by (``None`` until bound or started)."""
    share_policy: Callable[[PoolPolicy, str, int | None], None] | None = None
    """With ``scheduler="fair"``: ``share_policy(policy, name, max_running)`` makes the engine schedule
    by a pool's policy as model ``name``, running at most ``max_running`` requests at once (``None``:
    its own batch capacity); it raises :class:`~fairagents.errors.ProtocolError` while it serves
    requests under another policy."""


_CAPABILITIES = tuple(EngineBase.__annotations__)


def capabilities(engine: object) -> EngineBase:
    """``engine``'s optional capabilities: the engine itself if it is an :class:`EngineBase`, else what
    it declares over :class:`EngineBase`'s defaults (read now: capacities may change on ``start()``).

    Examples:
        >>> from fairagents.engines import capabilities
        >>> class Bare:   # an engine written against the Engine protocol alone
        ...     max_num_seqs = 4
        >>> caps = capabilities(Bare())
        >>> caps.max_num_seqs, caps.kv_block_size, caps.structured_outputs
        (4, 1, False)
    """
    if isinstance(engine, EngineBase):
        return engine
    view = EngineBase()
    for name in _CAPABILITIES:
        if hasattr(engine, name):
            setattr(view, name, getattr(engine, name))
    return view


@runtime_checkable
class ImageEngine(Engine, Protocol):
    """An engine that makes images from text. Beyond :class:`Engine`'s contract:

    - ``latent_tokens(size, steps, n)`` is the raw-token count of making ``n`` images
      of ``size`` in ``steps`` denoising steps, raising
      :class:`~fairagents.InvalidParameterError` for what the model cannot make;
      ``generate`` yields exactly that many ``new_tokens`` in all, step by step, when
      it runs to the end (the arbiter passes it as ``max_tokens``).
    - ``prepare_image`` tokenizes the text prompt and carries the request's settings
      in ``Prompt.data``; ``prepare_chat`` and ``prepare_text`` raise
      :class:`~fairagents.errors.ModalityError`.
    - The last :class:`Delta` has ``finish_reason="stop"`` and the images.

    Examples:
        >>> from fairagents.engines import ImageEngine
        >>> from fairagents.testing import FakeEngine
        >>> isinstance(FakeEngine(), ImageEngine)
        False
    """

    default_size: tuple[int, int]
    default_steps: int

    def latent_tokens(self, size: tuple[int, int], steps: int, n: int) -> int:
        """Latent tokens the denoiser processes for ``n`` images of ``size`` (width, height) in ``steps`` steps."""
        ...

    def prepare_image(
        self, prompt: str, *, size: tuple[int, int], steps: int, n: int, guidance: float | None = None
    ) -> Prompt:
        """Validate and tokenize an image-generation request."""
        ...
