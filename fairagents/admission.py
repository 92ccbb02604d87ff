"""Statera admission (H-MAS Alg. 2): a conformal length bound and a two-loop controller steer the dispatcher.

Without it the dispatcher reserves every request's worst case, ``prompt + max_tokens``
KV tokens, under a fixed in-flight limit and token budget, and a model whose callers
ask for far more ``max_tokens`` than they use runs far fewer requests than its KV cache
could hold. :class:`Statera` (H-MAS §3.4.2, Appendix E.2) reserves ``prompt + l_upper``
instead, where ``l_upper = l_pred + q₁₋ε`` bounds the request's output by its predicted
length plus a split-conformal quantile of past prediction errors (:class:`ConformalBound`),
and two loops tighten each model's token budget and in-flight limit when it runs hot.
It works under any policy, in the arbiter and the simulator (``admission="statera"``).
The algorithm, and what is chosen where the paper leaves it open, are explained in
[Capacity and admission](../concepts/capacity.md#the-algorithm-and-what-is-chosen-where-the-paper-leaves-it-open).

Examples:
    >>> import fairagents as fa
    >>> from fairagents.admission import Statera
    >>> from fairagents.dispatcher import Dispatcher
    >>> cost = fa.UnifiedTokenCost()
    >>> d = Dispatcher(fa.policies.FCFS(), cost, admission=Statera(epsilon=0.1, frag=0.0))
    >>> _ = d.add_model("chat", fa.ModelProfile(d_model=4096, n_layers=1), slots=8, token_budget=400, max_model_len=400)
    >>> who = fa.Agent("bot", fa.App("a"))
    >>> def serve(i, out):   # a request asking max_tokens=200 that produces ``out`` tokens; what it reserved
    ...     now = float(i)
    ...     _ = d.arrive(fa.Request(f"r{i}", who, "chat", prompt_tokens=10, max_tokens=200, arrival=now), now)
    ...     reserved = d.ticket(f"r{i}").reserved
    ...     _ = d.progress(f"r{i}", out, now), d.finish(f"r{i}", now)
    ...     return reserved
    >>> serve(0, 20)        # nothing learned yet: the worst case, prompt + max_tokens
    210
    >>> [serve(i, 20) for i in range(1, 30)][-1]   # learned: 20 tokens of output, and the conformal margin (0 here)
    30
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fairagents.errors import InvalidParameterError
from fairagents.policies._predicted import check_positive, modality_of
from fairagents.policies.predict import LengthPredictor

if TYPE_CHECKING:
    from fairagents.cost import CostModel
    from fairagents.records import ModelState, Ticket
    from fairagents.request import Request

__all__ = ["ConformalBound", "Statera", "StateraState", "make_admission"]


class ConformalBound:
    """Split-conformal upper quantiles of length-prediction errors, per prompt-length bucket (H-MAS eq. 4, Alg. 2 (A)).

    Args:
        epsilon: the miss rate ``ε``: a new error exceeds the quantile with probability ≤ ε.
        history: errors kept per bucket (the most recent).

    Examples:
        >>> from fairagents.admission import ConformalBound
        >>> bound = ConformalBound(epsilon=0.1)
        >>> for e in range(-5, 15):            # errors −5 … 14 on prompts of 100 tokens
        ...     bound.observe(100, e)
        >>> bound.quantile(100)                # ⌈21 · 0.9⌉ = 19th smallest of 20
        13
        >>> bound.quantile(5000) == bound.quantile(100)   # an empty bucket borrows every bucket's errors
        True
        >>> ConformalBound(epsilon=0.1).quantile(100) is None   # nothing to go on
        True
    """

    def __init__(self, *, epsilon: float = 0.05, history: int = 1000) -> None:
        if not (isinstance(epsilon, int | float) and 0 < epsilon < 1):
            raise InvalidParameterError(f"epsilon must be in (0, 1), got {epsilon!r}")
        if isinstance(history, bool) or not isinstance(history, int) or history < 1:
            raise InvalidParameterError(f"history must be an integer ≥ 1, got {history!r}")
        self.epsilon = float(epsilon)
        self.history = history
        self.needed = math.ceil((1 - self.epsilon) / self.epsilon)
        """Errors a buffer needs before its quantile is finite: ``⌈(n + 1)(1 − ε)⌉ ≤ n``."""
        self._recent: dict[int | None, deque[int]] = {}  # bucket (None: all) -> errors in arrival order
        self._sorted: dict[int | None, list[int]] = {}  # the same errors, sorted

    @staticmethod
    def bucket(prompt_tokens: int) -> int:
        """The bucket of a prompt length: ``⌊log₂ prompt⌋`` (0 for an empty prompt)."""
        return max(prompt_tokens, 1).bit_length() - 1

    def observe(self, prompt_tokens: int, error: int) -> None:
        """Record ``error = l_real − l_pred`` of a finished request (Alg. 2 lines 1–4)."""
        for key in (self.bucket(prompt_tokens), None):
            recent = self._recent.setdefault(key, deque())
            ordered = self._sorted.setdefault(key, [])
            if len(recent) == self.history:
                ordered.pop(bisect.bisect_left(ordered, recent.popleft()))
            recent.append(error)
            bisect.insort(ordered, error)

    def quantile(self, prompt_tokens: int) -> int | None:
        """``q₁₋ε(D_b)`` for a prompt of this length (Alg. 2 line 7); ``None`` with too few errors."""
        for key in (self.bucket(prompt_tokens), None):
            ordered = self._sorted.get(key)
            if ordered is not None and len(ordered) >= self.needed:
                rank = math.ceil((len(ordered) + 1) * (1 - self.epsilon))
                return ordered[min(rank, len(ordered)) - 1]
        return None

    def upper(self, prompt_tokens: int, predicted: int, max_tokens: int) -> int:
        """``l_upper = l_pred + q`` (eq. 4), in ``[1, max_tokens]``; ``max_tokens`` while the quantile is unknown."""
        q = self.quantile(prompt_tokens)
        if q is None:
            return max_tokens
        return max(1, min(max_tokens, predicted + q))


@dataclass(slots=True)
class StateraState:
    """One model's controls and the measurements they are steered by."""

    budget_max: int | None
    """``B_max = M_cap · (1 − δ_frag)`` (tokens), or ``None`` for a model without a token budget."""
    slots_max: int
    """``N_max``: the model's configured in-flight limit."""
    budget: float | None = None
    """``B_token`` now (tokens)."""
    slots: float = 0.0
    """``N_run`` now (requests; the dispatcher uses it rounded)."""
    cycle_start: float | None = None
    area: float = 0.0
    """∫ KV occupancy dt over the cycle so far (token·seconds)."""
    last: float | None = None
    """When occupancy was last integrated (seconds)."""
    tpot_ratio: float | None = None
    """Measured time per output token over the request's TPOT objective, averaged over the last cycle
    (``None`` when no request with a TPOT objective decoded in it: a stale slowdown must not throttle)."""
    tpot_sum: float = 0.0
    tpot_samples: int = 0
    utilisation: float | None = None
    """``ū`` of the last cycle."""
    errors: list[float] = field(default_factory=list)
    """``e`` of the last ``W`` cycles, newest last."""


class Statera:
    """H-MAS's Statera agent as admission control for the dispatcher (Alg. 2; see the module docs).

    Args:
        epsilon: ``ε``, the chance a request outgrows its bound (eq. 4).
        frag: ``δ_frag``, the share of KV capacity kept free (eq. 2).
        band: ``(u_low, u_high)``, the utilisation band the loops keep ``ū`` in.
        eta_budget: ``η_B`` as a share of ``B_max`` per unit of error.
        eta_slots: ``η_N`` as a share of ``N_max`` per unit of error.
        min_budget: ``B_min`` as a share of ``B_max``.
        min_slots: ``N_min``.
        window: ``W``, cycles averaged by the outer loop.
        period: seconds per control cycle.
        history: errors kept per prompt-length bucket.
        predictor: the output-length predictor (a new one by default).

    Examples:
        >>> from fairagents.admission import Statera
        >>> Statera(band=(0.9, 0.5))
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: band must be (u_low, u_high) with 0 < u_low ≤ u_high ≤ 1, got (0.9, 0.5)
    """

    name = "statera"

    def __init__(
        self,
        *,
        epsilon: float = 0.05,
        frag: float = 0.05,
        band: tuple[float, float] = (0.8, 0.95),
        eta_budget: float = 0.5,
        eta_slots: float = 0.5,
        min_budget: float = 0.1,
        min_slots: int = 1,
        window: int = 10,
        period: float = 0.05,
        history: int = 1000,
        predictor: LengthPredictor | None = None,
    ) -> None:
        if not 0 <= frag < 1:
            raise InvalidParameterError(f"frag must be in [0, 1), got {frag!r}")
        low, high = band
        if not 0 < low <= high <= 1:
            raise InvalidParameterError(f"band must be (u_low, u_high) with 0 < u_low ≤ u_high ≤ 1, got {band!r}")
        if not 0 < min_budget <= 1:
            raise InvalidParameterError(f"min_budget must be in (0, 1], got {min_budget!r}")
        for what, value in (("min_slots", min_slots), ("window", window)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameterError(f"{what} must be an integer ≥ 1, got {value!r}")
        self.conformal = ConformalBound(epsilon=epsilon, history=history)
        self.frag = float(frag)
        self.band = (float(low), float(high))
        self.eta_budget = check_positive(eta_budget, "eta_budget")
        self.eta_slots = check_positive(eta_slots, "eta_slots")
        self.min_budget = float(min_budget)
        self.min_slots = min_slots
        self.window = window
        self.period = check_positive(period, "period")
        self.predictor = predictor if predictor is not None else LengthPredictor()
        self.states: dict[str, StateraState] = {}
        """Each model's controls, by name."""
        self.covered = 0
        """Finished requests whose output stayed within their bound."""
        self.calibrated = 0
        """Finished requests with a prediction, measured against their bound (their errors calibrate it)."""
        self._last_token: dict[str, float] = {}  # running request id -> when its last output arrived

    @property
    def epsilon(self) -> float:
        """``ε``."""
        return self.conformal.epsilon

    # -- what the dispatcher calls --------------------------------------------------

    def add_model(self, m: ModelState) -> None:
        """Start steering ``m``: its controls open at ``B_max`` and ``N_max`` (Alg. 1 line 1)."""
        budget_max = None if m.token_budget is None else max(1, math.floor(m.token_budget * (1 - self.frag)))
        state = self.states[m.name] = StateraState(budget_max, m.slots, budget_max, float(m.slots))
        self._apply(m, state)

    def admit(self, request: Request, cost: CostModel) -> tuple[int | None, int]:
        """``(l_pred, l_upper)`` of an arriving request (output tokens).

        ``l_pred`` is ``None`` and ``l_upper`` is ``max_tokens`` while the predictor has
        learned nothing for the request's agent and modality: its guess then is not the
        predictor whose errors calibrate the bound, and its error is not recorded.
        """
        modality = modality_of(cost, request.model)
        if not self.predictor.informed(request.agent, modality):
            return None, request.max_tokens
        predicted = self.predictor.predict(request.agent, modality, request.prompt_tokens, request.max_tokens)
        return predicted, self.conformal.upper(request.prompt_tokens, predicted, request.max_tokens)

    def on_progress(self, m: ModelState, ticket: Ticket, new_tokens: int, now: float) -> None:
        """A running request produced ``new_tokens``: measure its decode speed, integrate occupancy."""
        r = ticket.request
        last = self._last_token.get(r.id)
        self._last_token[r.id] = now
        slo = r.agent.effective_slo
        if last is not None and slo is not None and slo.tpot:
            state = self.states[m.name]
            state.tpot_sum += (now - last) / new_tokens / slo.tpot
            state.tpot_samples += 1
        self.tick(m, now)

    def on_end(self, ticket: Ticket, finished: bool, cost: CostModel) -> None:
        """A request ended: a finished one calibrates the bound with its real length (Alg. 2 lines 1–4)."""
        r = ticket.request
        self._last_token.pop(r.id, None)
        if not finished:
            return
        if ticket.predicted is not None and ticket.bound is not None:
            self.calibrated += 1
            self.covered += ticket.produced <= ticket.bound
            self.conformal.observe(r.prompt_tokens, ticket.produced - ticket.predicted)
        self.predictor.observe(r.agent, modality_of(cost, r.model), r.prompt_tokens, ticket.produced, r.max_tokens)

    def tick(self, m: ModelState, now: float) -> None:
        """Integrate ``m``'s occupancy up to ``now``; at the end of a cycle, run the two loops."""
        state = self.states[m.name]
        if state.last is not None and state.budget_max is not None:
            state.area += m.used * (now - state.last)
        state.last = now
        if state.cycle_start is None:
            state.cycle_start = now
            return
        elapsed = now - state.cycle_start
        if elapsed < self.period:
            return
        occupancy = None if state.budget_max is None else state.area / elapsed / state.budget_max
        state.tpot_ratio = state.tpot_sum / state.tpot_samples if state.tpot_samples else None
        state.area, state.cycle_start, state.tpot_sum, state.tpot_samples = 0.0, now, 0.0, 0
        self._control(state, occupancy)
        self._apply(m, state)

    # -- the two loops -----------------------------------------------------------------

    def _control(self, state: StateraState, occupancy: float | None) -> None:
        """One cycle of Alg. 2 lines 9–13."""
        low, high = self.band
        signals = [x for x in (occupancy, None if state.tpot_ratio is None else high * state.tpot_ratio)
                   if x is not None]
        if not signals:
            return  # nothing measured: the controls stay where they are
        u = state.utilisation = max(signals)
        e = u - min(max(u, low), high)
        if state.budget is not None and state.budget_max is not None:
            b_min = self.min_budget * state.budget_max
            state.budget = min(max(state.budget - self.eta_budget * state.budget_max * e, b_min), state.budget_max)
        state.errors.append(e)
        del state.errors[:-self.window]
        mean = sum(state.errors) / len(state.errors)
        n_min = min(self.min_slots, state.slots_max)
        state.slots = min(max(state.slots - self.eta_slots * state.slots_max * mean, n_min), state.slots_max)

    @staticmethod
    def _apply(m: ModelState, state: StateraState) -> None:
        m.slot_limit = max(1, round(state.slots))
        m.budget_limit = None if state.budget is None else max(1, math.floor(state.budget))


def make_admission(spec: str | Statera | None) -> Statera | None:
    """An admission controller from a name (``"statera"``; ``"off"`` or ``None``: none) or an object.

    Examples:
        >>> from fairagents.admission import make_admission
        >>> make_admission("statera").name, make_admission("off")
        ('statera', None)
        >>> make_admission("magic")
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: unknown admission 'magic'; known: 'statera', 'off'
    """
    if spec is None or spec == "off":
        return None
    if isinstance(spec, Statera):
        return spec
    if spec == "statera":
        return Statera()
    raise InvalidParameterError(f"unknown admission {spec!r}; known: 'statera', 'off'")
