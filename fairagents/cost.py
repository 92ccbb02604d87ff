"""The cost model: unified tokens and the service an app or agent is charged.

HMFS (eq. 1) makes tokens of different models comparable by scaling them with the
model's embedding width and depth::

    T(n, m) = n · d_model(m) / d_base · n_layers(m)

and charges a request ``w_input · T(prompt) + w_output · T(generated)`` (VTC's 1:2
weighting by default): the input when the request is dispatched, the output as it
is generated. Prompt tokens an engine reads from its prefix cache instead of
computing (an agent resending its history every turn) are charged at their own
weight, ``w_cached`` (0.1 by default), where the engine reports them
(:func:`prompt_cost`).

Examples:
    >>> import fairagents as fa
    >>> cost = fa.UnifiedTokenCost({
    ...     "chat": fa.ModelProfile(d_model=4096, n_layers=32),
    ...     "vlm": fa.ModelProfile(d_model=2048, n_layers=24, modality=fa.Modality.VISION),
    ... })
    >>> cost.unified_tokens("chat", 10), cost.unified_tokens("vlm", 10)
    (320.0, 120.0)
    >>> cost.input_cost("chat", 10), cost.output_cost("chat", 10)
    (320.0, 640.0)
    >>> fa.prompt_cost(cost, "chat", 10, cached=8)   # 2 computed, 8 read from the prefix cache
    89.6
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from fairagents.constants import DEFAULT_D_BASE, MAX_MODEL_DEPTH, MAX_MODEL_WIDTH, MAX_TOKEN_COUNT, MAX_TOKEN_PRICE
from fairagents.errors import InvalidParameterError, UnknownModelError, shown
from fairagents.identity import Modality

__all__ = ["DEFAULT_W_CACHED", "CostModel", "ModelProfile", "RawTokenCost", "UnifiedTokenCost", "prompt_cost",
           "service_bound"]

#: Default weight of a prompt token read from the prefix cache (``w_cached``): a tenth of a
#: computed one at the default ``w_input``, as hosted APIs price cache reads. It holds KV cache
#: and is attended to, but costs no prefill.
DEFAULT_W_CACHED = 0.1


def _check_count(n: int, what: str) -> None:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 0 <= n <= MAX_TOKEN_COUNT:
        raise InvalidParameterError(f"{what} must be an integer in [0, 2**40], got {shown(n)}")


def _check_weight(value: float, what: str, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_PRICE  # NaN fails
    if not ok or (value == 0 and not allow_zero):
        bound = "≥ 0" if allow_zero else "> 0"
        raise InvalidParameterError(f"{what} must be a finite number {bound} and ≤ {MAX_TOKEN_PRICE:g}, "
                                    f"got {shown(value)}")


def _check_size(value: object, what: str, largest: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= largest:
        raise InvalidParameterError(f"{what} must be an integer in [1, {largest}], got {shown(value)}")


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """What the cost model knows of a model: its width, depth and modality.

    Engines read these from the model's own config (``hidden_size``,
    ``num_hidden_layers``); for a diffusion model they describe the denoiser.

    Examples:
        >>> import fairagents as fa
        >>> fa.ModelProfile(d_model=2048, n_layers=16).scale(d_base=4096)
        8.0
    """

    d_model: int
    """Embedding (hidden) width of the model."""
    n_layers: int
    """Number of transformer layers."""
    modality: Modality = Modality.TEXT
    """What the model takes and gives."""

    def __post_init__(self) -> None:
        _check_size(self.d_model, "ModelProfile d_model", MAX_MODEL_WIDTH)
        _check_size(self.n_layers, "ModelProfile n_layers", MAX_MODEL_DEPTH)
        object.__setattr__(self, "modality", Modality(self.modality))

    def scale(self, d_base: int = DEFAULT_D_BASE) -> float:
        """Unified tokens per raw token: ``d_model / d_base · n_layers``."""
        return self.d_model / d_base * self.n_layers

    @classmethod
    def of_text_config(cls, config: Any, modality: Modality | str = Modality.TEXT) -> ModelProfile:
        """The profile of a model from its (text) Hugging Face config: ``hidden_size`` and ``num_hidden_layers``.

        Examples:
            >>> from types import SimpleNamespace
            >>> from fairagents import ModelProfile
            >>> ModelProfile.of_text_config(SimpleNamespace(hidden_size=896, num_hidden_layers=24)).d_model
            896
        """
        return cls(d_model=int(config.hidden_size), n_layers=int(config.num_hidden_layers), modality=modality)


@runtime_checkable
class CostModel(Protocol):
    """What a policy charges for a request's tokens.

    Contract: both methods are pure, return a finite float ≥ 0 that is
    non-decreasing in ``n``, and raise :class:`~fairagents.UnknownModelError`
    for a model they cannot price and :class:`~fairagents.InvalidParameterError`
    for ``n < 0``. Policies rely on charges never being negative: their virtual
    counters only grow.

    Examples:
        Anything that prices service takes a cost model:

        >>> import fairagents as fa
        >>> def charge(cost: fa.CostModel, model: str, prompt: int, output: int) -> float:
        ...     return cost.input_cost(model, prompt) + cost.output_cost(model, output)
        >>> charge(fa.RawTokenCost(), "chat", 10, 5)
        20.0
    """

    def input_cost(self, model: str, n: int) -> float:
        """Charge for ``n`` prompt tokens on ``model``."""
        ...

    def output_cost(self, model: str, n: int) -> float:
        """Charge for ``n`` generated tokens on ``model``."""
        ...


class UnifiedTokenCost:
    """HMFS's cost: raw tokens scaled into unified tokens by each model's profile.

    Args:
        profiles: model name → :class:`ModelProfile`; more can be added with
            :meth:`register` as models join the pool.
        d_base: reference embedding width (HMFS's ``d_base``).
        w_input: weight of a prompt token.
        w_output: weight of a generated token.
        w_cached: weight of a prompt token read from the prefix cache (:func:`prompt_cost`);
            set it to ``w_input`` to charge cache hits as computed prompt.

    Examples:
        >>> import fairagents as fa
        >>> cost = fa.UnifiedTokenCost(d_base=128)
        >>> cost.register("tiny", fa.ModelProfile(d_model=128, n_layers=2))
        >>> cost.unified_tokens("tiny", 5), cost.output_cost("tiny", 5)
        (10.0, 20.0)
    """

    __slots__ = ("_scale", "d_base", "profiles", "w_cached", "w_input", "w_output")

    def __init__(
        self,
        profiles: Mapping[str, ModelProfile] | None = None,
        *,
        d_base: int = DEFAULT_D_BASE,
        w_input: float = 1.0,
        w_output: float = 2.0,
        w_cached: float = DEFAULT_W_CACHED,
    ) -> None:
        _check_size(d_base, "d_base", MAX_MODEL_WIDTH)
        _check_weight(w_input, "w_input", allow_zero=True)
        _check_weight(w_output, "w_output", allow_zero=True)
        _check_weight(w_cached, "w_cached", allow_zero=True)
        self.d_base = d_base
        self.w_input = float(w_input)
        self.w_output = float(w_output)
        self.w_cached = float(w_cached)
        self.profiles: dict[str, ModelProfile] = {}
        self._scale: dict[str, float] = {}
        for name, profile in (profiles or {}).items():
            self.register(name, profile)

    def register(self, model: str, profile: ModelProfile) -> None:
        """Add (or replace) the profile of ``model``."""
        if not isinstance(profile, ModelProfile):
            raise InvalidParameterError(f"profile of {model!r} must be a ModelProfile, got {profile!r}")
        self.profiles[model] = profile
        self._scale[model] = profile.scale(self.d_base)

    def scale(self, model: str) -> float:
        """Unified tokens per raw token of ``model``."""
        try:
            return self._scale[model]
        except KeyError:
            raise UnknownModelError.among(model, self._scale) from None

    def unified_tokens(self, model: str, n: int) -> float:
        """``T(n, model)``: ``n`` raw tokens of ``model`` in unified tokens."""
        if type(n) is not int or not 0 <= n <= MAX_TOKEN_COUNT:  # the exact-type test keeps the hot path cheap
            _check_count(n, "token count")
        scale = self._scale.get(model)
        return n * (scale if scale is not None else self.scale(model))

    def input_cost(self, model: str, n: int) -> float:
        """``w_input · T(n, model)``."""
        return self.w_input * self.unified_tokens(model, n)

    def cached_cost(self, model: str, n: int) -> float:
        """``w_cached · T(n, model)``: ``n`` prompt tokens read from the prefix cache."""
        return self.w_cached * self.unified_tokens(model, n)

    def output_cost(self, model: str, n: int) -> float:
        """``w_output · T(n, model)``."""
        # unified_tokens inlined: this runs for every streamed chunk of every request.
        if type(n) is not int or not 0 <= n <= MAX_TOKEN_COUNT:
            _check_count(n, "token count")
        scale = self._scale.get(model)
        return self.w_output * n * (scale if scale is not None else self.scale(model))


class RawTokenCost:
    """VTC's cost: raw tokens, whatever the model (every model's scale is 1).

    Examples:
        >>> import fairagents as fa
        >>> fa.RawTokenCost().output_cost("any-model", 3)
        6.0
    """

    __slots__ = ("w_cached", "w_input", "w_output")

    def __init__(self, *, w_input: float = 1.0, w_output: float = 2.0, w_cached: float = DEFAULT_W_CACHED) -> None:
        _check_weight(w_input, "w_input", allow_zero=True)
        _check_weight(w_output, "w_output", allow_zero=True)
        _check_weight(w_cached, "w_cached", allow_zero=True)
        self.w_input = float(w_input)
        self.w_output = float(w_output)
        self.w_cached = float(w_cached)

    def input_cost(self, model: str, n: int) -> float:
        """``w_input · n``."""
        if type(n) is not int or not 0 <= n <= MAX_TOKEN_COUNT:
            _check_count(n, "token count")
        return self.w_input * n

    def cached_cost(self, model: str, n: int) -> float:
        """``w_cached · n``."""
        if type(n) is not int or not 0 <= n <= MAX_TOKEN_COUNT:
            _check_count(n, "token count")
        return self.w_cached * n

    def output_cost(self, model: str, n: int) -> float:
        """``w_output · n``."""
        if type(n) is not int or not 0 <= n <= MAX_TOKEN_COUNT:
            _check_count(n, "token count")
        return self.w_output * n


def prompt_cost(cost: CostModel, model: str, tokens: int, cached: int = 0) -> float:
    """The charge for a prompt of ``tokens``, of which the engine read ``cached`` from its prefix cache.

    ``input_cost`` of the computed part plus ``cached_cost`` of the rest; a cost model
    without ``cached_cost`` (one of your own) charges the whole prompt as computed.

    Raises:
        InvalidParameterError: ``cached`` is not an integer in ``[0, tokens]``.

    Examples:
        >>> import fairagents as fa
        >>> fa.prompt_cost(fa.RawTokenCost(), "m", 100, cached=90), fa.prompt_cost(fa.RawTokenCost(), "m", 100)
        (19.0, 100.0)
    """
    if not cached:
        return cost.input_cost(model, tokens)
    if isinstance(cached, bool) or not isinstance(cached, numbers.Integral) or not 0 <= cached <= tokens:
        raise InvalidParameterError(f"cached prompt tokens must be an integer in [0, {shown(tokens)}], "
                                    f"got {shown(cached)}")
    price = getattr(cost, "cached_cost", None)
    if price is None:
        return cost.input_cost(model, tokens)
    return cost.input_cost(model, tokens - cached) + float(price(model, cached))


def service_bound(
    cost: CostModel, held: Mapping[str, int], *, pool: int | None = None, longest: Mapping[str, int] | None = None
) -> float:
    """``U``, the unit of the fairness bound, in the cost model's units.

    ``held`` maps each model to ``M``: the most tokens (prompts and outputs) it holds
    in its running batch, i.e. its KV capacity in tokens, or the arbiter's in-flight
    limit × the longest ``prompt + max_tokens`` if that is smaller.

    ``pool`` is a limit on requests in flight across all the models (models sharing
    hardware), with ``longest`` the longest request (``prompt + max_tokens``) on each
    model: the pool then holds at most ``pool`` requests in all, so ``U`` is also at
    most ``pool × max_m max(w_input, w_output) · T(longest_m, m)``.

    Why this ``U``. A client is dispatched on a model only while its counter is the
    lowest among the clients waiting for that model. Take two clients that stay
    backlogged on the pool's models. From a client's last dispatch on, its counter can
    still grow by that dispatch's input charge and by the output of its requests in
    flight; on model ``m`` those requests hold at most ``M_m`` tokens, each charged at
    most ``max(w_input, w_output)``. The arbiter runs models side by side, so a client
    can have a batch in flight on each at once, and the bound sums over models::

        U = Σ_m max(w_input, w_output, w_cached) · T(M_m, m)

    On one model with VTC's weights (``w_input ≤ w_output``) this is VTC's
    ``max(w_input·L_input, w_output·M)`` (Sheng et al., OSDI'24, Thm. 4.4), since a
    prompt never exceeds ``M``. Counters of backlogged clients then stay within
    ``U / weight`` of each other, so the weight-normalised service two of them
    receive over any interval differs by at most ``2U / min(weight)`` (``2U`` at
    weight 1). The same holds between two agents of one app.

    Examples:
        >>> import fairagents as fa
        >>> cost = fa.UnifiedTokenCost({"chat": fa.ModelProfile(d_model=4096, n_layers=1)})
        >>> fa.service_bound(cost, {"chat": 1000})
        2000.0
        >>> fa.service_bound(cost, {"chat": 1000}, pool=2, longest={"chat": 100})
        400.0
    """

    def dearest(tokens: int, model: str) -> float:
        _check_count(tokens, "M")
        cached = getattr(cost, "cached_cost", None)
        return max(cost.input_cost(model, tokens), cost.output_cost(model, tokens),
                   0.0 if cached is None else cached(model, tokens))

    total = sum(dearest(tokens, model) for model, tokens in held.items())
    if pool is not None and longest:
        total = min(total, pool * max(dearest(tokens, model) for model, tokens in longest.items()))
    return total
