"""What the H-MAS policies predict of a request: output length, service time and deadline.

Shared by :class:`~fairagents.policies.edf.EDF`, :class:`~fairagents.policies.sjf.SJF`,
:class:`~fairagents.policies.wfq.WFQ` and :class:`~fairagents.policies.two_lane.TwoLane`,
the policy pool Ω of H-MAS (Appendix C.2):

- ``l_pred``: the shared online :class:`~fairagents.policies.predict.LengthPredictor`,
  keyed by the request's agent and the modality of its model;
- ``t̂_ttft`` and ``t̂_tpot``: per model, learned online from the requests the policy
  dispatched (:class:`ServiceTimes`);
- ``T_tot = t̂_ttft + t̂_tpot · l_pred`` (§3.2; Algorithm 1, line 6), in seconds;
- ``D_r = a_r + SLO_ttft + SLO_tpot · l_pred`` (§3.5, under Eq. 5).

Everything is computed once, when a request arrives, and kept until it ends, as in
Algorithm 1; later learning changes only later requests. Ordering keys therefore never
change while a request waits, and every policy keeps plain heaps: O(log n) a decision.
See the policies page in the docs (*Choosing a policy*, the H-MAS pool).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, ClassVar

from fairagents.cost import CostModel, UnifiedTokenCost
from fairagents.errors import InvalidParameterError
from fairagents.identity import Modality
from fairagents.policies.base import BasePolicy
from fairagents.policies.predict import LengthPredictor, PredictionError, _Line
from fairagents.request import Outcome, Request

#: TTFT objective (seconds) of a request whose agent states none: the loosest template of H-MAS's Table 6.
DEFAULT_TTFT = 13.0
#: TPOT objective (seconds per token) of a request whose agent states none: the loosest of Table 6 (150 ms).
DEFAULT_TPOT = 0.150
#: Time to first token (seconds) assumed on a model before any of its requests was seen to start.
PRIOR_TTFT = 0.1
#: Time per output token (seconds) assumed on a model before any of its requests was seen to decode.
PRIOR_TPOT = 0.02


def check_positive(value: float, what: str, *, allow_zero: bool = False) -> float:
    """``value`` as a float, or :class:`~fairagents.InvalidParameterError` unless finite and > 0 (≥ 0).

    Examples:
        >>> from fairagents.policies._predicted import check_positive
        >>> check_positive(2, "aging")
        2.0
    """
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = "≥ 0" if allow_zero else "> 0"
        raise InvalidParameterError(f"{what} must be a finite number {bound}, got {value!r}")
    return float(value)


def modality_of(cost: CostModel, model: str) -> Modality:
    """The modality of ``model``: from its profile in a unified cost model, TEXT without one.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.policies._predicted import modality_of
        >>> cost = fa.UnifiedTokenCost({"vlm": fa.ModelProfile(d_model=64, n_layers=1, modality="vision")})
        >>> modality_of(cost, "vlm"), modality_of(cost, "other"), modality_of(fa.RawTokenCost(), "vlm")
        (<Modality.VISION: 'vision'>, <Modality.TEXT: 'text'>, <Modality.TEXT: 'text'>)
    """
    profile = getattr(cost, "profiles", {}).get(model)
    return profile.modality if profile is not None else Modality.TEXT


def deadline(req: Request, length: int, default_ttft: float, default_tpot: float) -> float:
    """``D_r = a_r + SLO_ttft + SLO_tpot · l_pred`` (H-MAS §3.5), capped by ``a_r + SLO_e2e`` if set.

    An objective the agent (or its app) does not state takes its default, whether the
    whole SLO is missing or just that field, so every deadline is finite.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.policies._predicted import deadline
        >>> who = fa.Agent("a", fa.App("x"), slo=fa.SLO(ttft=2.0, tpot=0.05))
        >>> r = fa.Request(id="r", agent=who, model="m", prompt_tokens=5, max_tokens=100, arrival=10.0)
        >>> deadline(r, 40, default_ttft=13.0, default_tpot=0.15)   # 10 + 2 + 0.05 · 40
        14.0
        >>> capped = fa.Agent("b", fa.App("x"), slo=fa.SLO(ttft=2.0, e2e=3.0))
        >>> deadline(fa.Request(id="s", agent=capped, model="m", prompt_tokens=5, max_tokens=100, arrival=10.0),
        ...          40, default_ttft=13.0, default_tpot=0.15)
        13.0
    """
    slo = req.agent.effective_slo
    if slo is None:
        return req.arrival + default_ttft + default_tpot * length
    ttft = slo.ttft if slo.ttft is not None else default_ttft
    tpot = slo.tpot if slo.tpot is not None else default_tpot
    due = req.arrival + ttft + tpot * length
    return due if slo.e2e is None else min(due, req.arrival + slo.e2e)


class ServiceTimes:
    """Per-model estimates of ``t̂_ttft`` and ``t̂_tpot``, learned from what was observed to run.

    ``t̂_ttft(prompt)``: an online least-squares line of the seconds from dispatch to
    the first output token on the prompt length (the prefill grows with the prompt);
    ``t̂_tpot``: the seconds per output token after the first, over every token seen
    on the model. Before a model has been observed, the priors stand in. The error of
    the service-time predictions (``T_tot`` against dispatch → last token) is kept
    in :attr:`error`.

    Examples:
        >>> from fairagents.policies._predicted import ServiceTimes
        >>> times = ServiceTimes(prior_ttft=0.1, prior_tpot=0.02)
        >>> times.observe("chat", prompt_tokens=100, dispatched=0.0, first=0.2, finished=1.2, tokens=11,
        ...               predicted=1.1)
        >>> times.ttft("chat", 100), times.tpot("chat"), round(times.error.mean_absolute, 6)
        (0.2, 0.1, 0.1)
    """

    __slots__ = ("_decode", "_ttft", "error", "prior_tpot", "prior_ttft")

    def __init__(self, *, prior_ttft: float = PRIOR_TTFT, prior_tpot: float = PRIOR_TPOT) -> None:
        self.prior_ttft = check_positive(prior_ttft, "prior_ttft", allow_zero=True)
        self.prior_tpot = check_positive(prior_tpot, "prior_tpot", allow_zero=True)
        self._ttft: dict[str, _Line] = {}
        self._decode: dict[str, list[float]] = {}  # model -> [seconds, tokens] of decoding after the first token
        self.error = PredictionError()

    def ttft(self, model: str, prompt_tokens: int) -> float:
        """``t̂_ttft``: expected seconds from dispatch to the first output token."""
        line = self._ttft.get(model)
        return self.prior_ttft if line is None else max(0.0, line.at(prompt_tokens))

    def tpot(self, model: str) -> float:
        """``t̂_tpot``: expected seconds per output token after the first."""
        decode = self._decode.get(model)
        return self.prior_tpot if decode is None or not decode[1] else decode[0] / decode[1]

    def service(self, model: str, prompt_tokens: int, length: int) -> float:
        """``T_tot = t̂_ttft + t̂_tpot · l_pred`` (H-MAS §3.2; Algorithm 1, line 6)."""
        return self.ttft(model, prompt_tokens) + self.tpot(model) * length

    def observe(self, model: str, prompt_tokens: int, dispatched: float, first: float, finished: float,
                tokens: int, predicted: float) -> None:
        """Learn from a finished request: when it was dispatched, produced its first and its last token."""
        self._ttft.setdefault(model, _Line()).add(prompt_tokens, max(0.0, first - dispatched))
        if tokens > 1:
            decode = self._decode.setdefault(model, [0.0, 0.0])
            decode[0] += max(0.0, finished - first)
            decode[1] += tokens - 1
        took = max(0.0, finished - dispatched)
        self.error.samples += 1
        self.error.absolute += abs(predicted - took)
        self.error.relative += abs(predicted - took) / took if took > 0 else 0.0


class KeyedQueues:
    """Waiting requests in min-heaps by a key fixed at arrival, one heap per queue (a model, a lane).

    Removal is lazy (a removed request is skipped when it reaches the top), so every
    operation is O(log n). Ties go to the request queued first.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.policies._predicted import KeyedQueues
        >>> who = fa.Agent("a", fa.App("x"))
        >>> r1, r2 = (fa.Request(id=i, agent=who, model="m", prompt_tokens=1, max_tokens=1, arrival=0.0)
        ...           for i in ("r1", "r2"))
        >>> q = KeyedQueues(); q.push("m", r1, 5.0); q.push("m", r2, 3.0)
        >>> q.head("m").id, q.key(r2)
        ('r2', 3.0)
        >>> q.remove(r2); q.head("m").id, len(q)
        ('r1', 1)
    """

    __slots__ = ("_entry", "_gone", "_heaps", "_seq")

    def __init__(self) -> None:
        self._heaps: dict[Hashable, list[tuple[Any, int, Request]]] = {}
        self._entry: dict[str, tuple[Hashable, Any, int]] = {}  # request id -> (queue, key, seq)
        self._gone: set[int] = set()  # seqs removed but still in a heap
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entry)

    def push(self, queue: Hashable, req: Request, key: Any) -> None:
        self._seq += 1
        self._entry[req.id] = (queue, key, self._seq)
        heapq.heappush(self._heaps.setdefault(queue, []), (key, self._seq, req))

    def key(self, req: Request) -> Any:
        """The key ``req`` waits under."""
        return self._entry[req.id][1]

    def head(self, queue: Hashable) -> Request | None:
        """The waiting request of least key in ``queue``, or ``None`` (drops removed entries on the way)."""
        heap = self._heaps.get(queue)
        if not heap:
            return None
        gone = self._gone
        while heap and heap[0][1] in gone:
            gone.discard(heapq.heappop(heap)[1])
        return heap[0][2] if heap else None

    def remove(self, req: Request) -> None:
        queue, _, seq = self._entry.pop(req.id)
        heap = self._heaps[queue]
        if heap[0][1] == seq:
            heapq.heappop(heap)
        else:
            self._gone.add(seq)


@dataclass(slots=True)
class Estimate:
    """What was predicted of a request when it arrived."""

    length: int
    """``l_pred``: expected output tokens."""
    service: float
    """``T_tot``: expected seconds from dispatch to the last token."""
    modality: Modality
    """Modality of the request's model (the predictor's key, with the agent)."""


@dataclass(slots=True)
class _Run:
    """What is observed of a dispatched request until it ends."""

    estimate: Estimate
    dispatched: float
    first: float | None = None
    tokens: int = 0


class PredictivePolicy(BasePolicy):
    """The shared machinery of the H-MAS pool: prediction at arrival, learning at finish.

    A subclass says how a request is keyed (:meth:`_key`) and, if it keeps more than
    one heap per model, overrides ``_enqueue``/``_dequeue``/``select``. Requests are
    priced in unified tokens (``charges_unified_tokens``), whose model profiles also
    give each model's modality.
    """

    charges_unified_tokens: ClassVar[bool] = True

    def __init__(
        self,
        cost: CostModel | None,
        *,
        predictor: LengthPredictor | None,
        default_ttft: float = DEFAULT_TTFT,
        default_tpot: float = DEFAULT_TPOT,
        prior_ttft: float = PRIOR_TTFT,
        prior_tpot: float = PRIOR_TPOT,
    ) -> None:
        super().__init__(cost if cost is not None else UnifiedTokenCost())
        self.default_ttft = check_positive(default_ttft, "default_ttft")
        self.default_tpot = check_positive(default_tpot, "default_tpot", allow_zero=True)
        #: The output-length predictor (pass one to share it between policies).
        self.predictor = predictor if predictor is not None else LengthPredictor()
        #: The per-model ``t̂_ttft`` and ``t̂_tpot`` estimates.
        self.times = ServiceTimes(prior_ttft=prior_ttft, prior_tpot=prior_tpot)
        self._queues = KeyedQueues()
        self._estimates: dict[str, Estimate] = {}  # waiting requests
        self._runs: dict[str, _Run] = {}  # running requests

    # -- introspection -----------------------------------------------------

    def estimate(self, req: Request) -> Estimate:
        """What was predicted of a waiting or running request when it arrived (``l_pred``, ``T_tot``).

        Examples:
            >>> import fairagents as fa
            >>> cost = fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)}, d_base=64)
            >>> from fairagents.policies.sjf import SJF
            >>> policy = SJF(cost)
            >>> r = fa.Request(id="r", agent=fa.Agent("a", fa.App("x")), model="m", prompt_tokens=10,
            ...                max_tokens=100, arrival=0.0)
            >>> policy.on_arrival(r, now=0.0)
            >>> e = policy.estimate(r); e.length, round(e.service, 6)  # half of max_tokens before anything is seen
            (50, 1.1)
        """
        est = self._estimates.get(req.id)
        if est is None:
            est = self._runs[req.id].estimate
        return est

    # -- driver-facing -----------------------------------------------------

    def select(self, model: str, now: float) -> Request | None:
        """The waiting request of ``model`` with the least key, or ``None``."""
        return self._queues.head(model)

    def on_progress(self, req: Request, new_output_tokens: int, now: float) -> None:
        """Charge the new output and note when the first token came and how many did.

        Examples:
            >>> import fairagents as fa
            >>> from fairagents.policies.edf import EDF
            >>> policy = EDF(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)}))
            >>> r = fa.Request(id="r", agent=fa.Agent("a", fa.App("x")), model="m", prompt_tokens=1,
            ...                max_tokens=4, arrival=0.0)
            >>> policy.on_arrival(r, 0.0); policy.on_dispatch(r, 0.0); policy.on_progress(r, 2, 0.5)
            >>> policy.running()
            1
        """
        super().on_progress(req, new_output_tokens, now)
        if new_output_tokens:
            run = self._runs[req.id]
            if run.first is None:
                run.first = now
            run.tokens += new_output_tokens

    def on_finish(self, req: Request, outcome: Outcome, now: float) -> None:
        """Forget ``req``; a request that ran to its end teaches the length predictor and the time model.

        Only a request that finished teaches: a cancelled or failed one stopped short of
        its length.

        Examples:
            >>> import fairagents as fa
            >>> from fairagents.policies.edf import EDF
            >>> policy = EDF(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)}))
            >>> r = fa.Request(id="r", agent=fa.Agent("a", fa.App("x")), model="m", prompt_tokens=1,
            ...                max_tokens=40, arrival=0.0)
            >>> policy.on_arrival(r, 0.0); policy.on_dispatch(r, 0.0); policy.on_progress(r, 5, 0.5)
            >>> policy.on_finish(r, fa.Outcome.FINISHED, 1.0)
            >>> policy.predictor.error.mean_absolute   # it predicted 20 tokens (half of 40), 5 came
            15.0
        """
        super().on_finish(req, outcome, now)
        run = self._runs.pop(req.id, None)
        if run is None or outcome is not Outcome.FINISHED or not run.tokens or run.first is None:
            return
        est = run.estimate
        self.predictor.observe(req.agent, est.modality, req.prompt_tokens, run.tokens, req.max_tokens)
        self.times.observe(req.model, req.prompt_tokens, run.dispatched, run.first, now, run.tokens, est.service)

    # -- subclass hooks ----------------------------------------------------

    def _predict(self, req: Request) -> Estimate:
        modality = modality_of(self.cost, req.model)
        length = self.predictor.predict(req.agent, modality, req.prompt_tokens, req.max_tokens)
        return Estimate(length, self.times.service(req.model, req.prompt_tokens, length), modality)

    def _deadline(self, req: Request, est: Estimate) -> float:
        return deadline(req, est.length, self.default_ttft, self.default_tpot)

    def _key(self, req: Request, est: Estimate, now: float) -> float:
        """The request's key, computed once at arrival (lower runs first).

        Subclasses that keep this class's ``_enqueue`` define it (``edf``, ``sjf``,
        ``wfq``); ``two_lane`` orders its lanes in its own ``_enqueue`` and never calls it.
        """
        raise NotImplementedError

    def _enqueue(self, req: Request, now: float) -> None:
        est = self._estimates[req.id] = self._predict(req)
        self._queues.push(req.model, req, self._key(req, est, now))

    def _dequeue(self, req: Request, now: float, dispatched: bool) -> None:
        self._queues.remove(req)
        est = self._estimates.pop(req.id)
        if dispatched:
            self._runs[req.id] = _Run(est, now)

    def _rank(self, req: Request) -> Any:
        return self._queues.key(req)
