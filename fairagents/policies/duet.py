"""DuetInfer's fairness-aware scheduler (Yang et al., "Toward Parallel Serving for Vision-Language
Models via Modal Decoupling and Scheduling", §III-D and Formula 1).

Vision encoding runs apart from the language model, so an image request reaches the
model's queue later than a text request that arrived after it. This policy restores
arrival order: requests are ranked by ``(arrival_time, cost_estimate)``, compared
element by element, ties in the order they entered the queue. ``arrival_time`` is the
system arrival (:attr:`Request.arrival`); the cost is Formula 1,
``α · L_prefill + β · L̂_decode``, with the decode length predicted per modality by a
:class:`~fairagents.policies.predict.LengthPredictor`, fixed when the request enters the
queue. A request that has waited in the queue longer than the ``percentile`` of the
model's last ``history`` waits ages: its arrival time moves ``aging_step`` seconds
earlier at every tick of an aging clock of that period (``aging_step=0`` ages
continuously). Later arrivals never pass a waiting request, so none starves.

See the policies page in the docs (*Choosing a policy*, DuetInfer) for the parameters,
the guarantee, the costs, and where the paper is ambiguous and what was chosen.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from typing import ClassVar

from fairagents.cost import CostModel, UnifiedTokenCost
from fairagents.errors import InvalidParameterError, ProtocolError
from fairagents.identity import Agent, App, Modality
from fairagents.policies.base import BasePolicy
from fairagents.policies.predict import LengthPredictor
from fairagents.request import Outcome, Request

__all__ = ["Duet"]

#: A request's place in a range-minimum tree: (arrival key, cost, entry sequence, request).
_Key = tuple[float, float, float, "Request | None"]
_EMPTY: _Key = (math.inf, math.inf, math.inf, None)

#: The one "agent" the predictor is asked about: DuetInfer's lines are per modality only.
_EVERYONE = Agent("duet", App("duet"))


class _MinTree:
    """Minimum over a range of slots, with point updates: an iterative segment tree."""

    __slots__ = ("size", "tree")

    def __init__(self, leaves: list[_Key], size: int) -> None:
        self.size = size
        tree = [_EMPTY] * (2 * size)
        tree[size : size + len(leaves)] = leaves
        for i in range(size - 1, 0, -1):
            left, right = tree[2 * i], tree[2 * i + 1]
            tree[i] = min(left, right)
        self.tree = tree

    def leaf(self, i: int) -> _Key:
        return self.tree[self.size + i]

    def set(self, i: int, key: _Key) -> None:
        tree = self.tree
        i += self.size
        tree[i] = key
        i >>= 1
        while i:
            left, right = tree[2 * i], tree[2 * i + 1]
            best = min(left, right)
            if tree[i] is best:  # unchanged: so are its ancestors
                return
            tree[i] = best
            i >>= 1

    def min(self, lo: int, hi: int) -> _Key:
        """The least key in slots ``[lo, hi)``."""
        tree = self.tree
        best = _EMPTY
        lo += self.size
        hi += self.size
        while lo < hi:
            if lo & 1:
                best = min(best, tree[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                best = min(best, tree[hi])
            lo >>= 1
            hi >>= 1
        return best


class _ModelQueue:
    """One model's waiting requests in order of entry, with the keys of both cases of aging.

    Aged requests are those that entered before the aging cut, a prefix of entry order;
    ``aged`` keys them by ``arrival + snapped entry`` (their order once promoted), ``fresh``
    by arrival. Removal blanks a slot; slots are compacted when the arrays fill up.
    """

    __slots__ = ("aged", "count", "entered", "fresh", "ids", "slot")

    def __init__(self) -> None:
        self._build([], [], [], [])

    def _build(self, ids: list[str], entered: list[float], aged: list[_Key], fresh: list[_Key]) -> None:
        size = 16
        while size < 2 * len(ids):
            size *= 2
        self.ids: list[str | None] = list(ids)
        self.entered = entered
        self.slot = {rid: i for i, rid in enumerate(ids)}
        self.aged = _MinTree(aged, size)
        self.fresh = _MinTree(fresh, size)
        self.count = len(ids)

    def __len__(self) -> int:
        return len(self.slot)

    def last_entered(self) -> float:
        return self.entered[-1] if self.count else -math.inf

    def push(self, rid: str, entered: float, aged: _Key, fresh: _Key) -> None:
        if self.count == self.aged.size:
            live = [i for i, rid_ in enumerate(self.ids) if rid_ is not None]
            ids: list[str] = [self.ids[i] for i in live]  # type: ignore[misc]
            times = [self.entered[i] for i in live]
            self._build(ids, times, [self.aged.leaf(i) for i in live], [self.fresh.leaf(i) for i in live])
        i = self.count
        self.count += 1
        self.ids.append(rid)
        self.entered.append(entered)
        self.slot[rid] = i
        self.aged.set(i, aged)
        self.fresh.set(i, fresh)

    def remove(self, rid: str) -> None:
        i = self.slot.pop(rid)
        if not self.slot:
            self._build([], [], [], [])
            return
        self.ids[i] = None
        self.aged.set(i, _EMPTY)
        self.fresh.set(i, _EMPTY)

    def best(self, cut: float) -> tuple[_Key, _Key]:
        """The least aged key (entered before ``cut``) and the least fresh key (the others)."""
        split = bisect.bisect_left(self.entered, cut)
        return self.aged.min(0, split), self.fresh.min(split, self.count)


class _WaitHistory:
    """The last ``limit`` waits, kept sorted for percentiles."""

    __slots__ = ("limit", "ordered", "recent")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.recent: deque[float] = deque()
        self.ordered: list[float] = []

    def add(self, wait: float) -> None:
        if len(self.recent) == self.limit:
            old = self.recent.popleft()
            del self.ordered[bisect.bisect_left(self.ordered, old)]
        self.recent.append(wait)
        bisect.insort(self.ordered, wait)

    def percentile(self, q: float) -> float:
        """Nearest rank: the least wait with at least ``q`` of the waits at or below it."""
        return self.ordered[max(0, math.ceil(q * len(self.ordered) - 1e-9) - 1)]


def _check(value: object, what: str, *, low: float = 0.0, integer: bool = False) -> None:
    """Raise unless ``value`` is a finite number (an integer if ``integer``) ≥ ``low``."""
    kind = "an integer" if integer else "a finite number"
    ok = not isinstance(value, bool) and isinstance(value, int if integer else int | float)
    if not ok or not math.isfinite(value) or value < low:  # type: ignore[arg-type,operator]
        raise InvalidParameterError(f"{what} must be {kind} ≥ {low:g}, got {value!r}")


class Duet(BasePolicy):
    """DuetInfer: system arrival first, then Formula 1's cost estimate; aging past the p90 wait.

    Args:
        cost: the pool's :class:`~fairagents.UnifiedTokenCost`, where a model's profile
            gives its modality (text when the model has none); it also rejects requests
            for unknown models. Empty by default.
        alpha: ``α`` of Formula 1, per prompt token; the cost model's ``w_input`` by default.
        beta: ``β`` of Formula 1, per predicted output token; the cost model's ``w_output``
            by default.
        predictor: the output-length predictor, asked per modality only (one predictor
            may be shared); a new :class:`~fairagents.policies.predict.LengthPredictor`
            by default.
        percentile: the share of historical waits below the aging threshold (the paper's
            90th percentile: 0.9).
        history: how many recent waits per model the threshold is drawn from.
        min_history: waits a model must have seen before its requests age.
        aging_step: seconds of the aging clock's period and of one promotion step;
            0 ages continuously.

    Examples:
        >>> import fairagents as fa
        >>> cost = fa.UnifiedTokenCost({"vlm": fa.ModelProfile(d_model=64, n_layers=1, modality=fa.Modality.VISION)},
        ...                            d_base=64)
        >>> policy = fa.policies.duet.Duet(cost)
        >>> who = fa.Agent("a", fa.App("x"))
        >>> text = fa.Request(id="text", agent=who, model="vlm", prompt_tokens=8, max_tokens=8, arrival=1.0)
        >>> image = fa.Request(id="image", agent=who, model="vlm", prompt_tokens=600, max_tokens=8, arrival=0.5)
        >>> policy.on_arrival(text, now=1.0)
        >>> policy.on_arrival(image, now=1.8)   # arrived first, entered after its vision encoding
        >>> policy.select("vlm", now=1.8).id
        'image'

        >>> fa.policies.duet.Duet(percentile=1.5)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: percentile must be a finite number in (0, 1], got 1.5
    """

    name: ClassVar[str] = "duet"
    charges_unified_tokens: ClassVar[bool] = True

    def __init__(
        self,
        cost: CostModel | None = None,
        *,
        alpha: float | None = None,
        beta: float | None = None,
        predictor: LengthPredictor | None = None,
        percentile: float = 0.9,
        history: int = 1000,
        min_history: int = 10,
        aging_step: float = 0.1,
    ) -> None:
        super().__init__(cost if cost is not None else UnifiedTokenCost())
        alpha = getattr(self.cost, "w_input", 1.0) if alpha is None else alpha
        beta = getattr(self.cost, "w_output", 2.0) if beta is None else beta
        _check(alpha, "alpha")
        _check(beta, "beta")
        if isinstance(percentile, bool) or not isinstance(percentile, int | float) or not 0 < percentile <= 1:
            raise InvalidParameterError(f"percentile must be a finite number in (0, 1], got {percentile!r}")
        _check(history, "history", low=1, integer=True)
        _check(min_history, "min_history", low=1, integer=True)
        if min_history > history:
            raise InvalidParameterError(f"min_history ({min_history}) cannot exceed history ({history})")
        _check(aging_step, "aging_step")
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.predictor = predictor if predictor is not None else LengthPredictor()
        self.percentile = float(percentile)
        self.history = history
        self.min_history = min_history
        self.aging_step = float(aging_step)
        self._queues: dict[str, _ModelQueue] = {}
        self._waits: dict[str, _WaitHistory] = {}
        self._waiting_meta: dict[str, tuple[float, float]] = {}  # id -> (entered, cost) while waiting
        self._produced: dict[str, int] = {}  # id -> output tokens so far, while running
        self._seq = 0

    # -- public queries ------------------------------------------------------

    def estimate_cost(self, req: Request) -> float:
        """Formula 1 for ``req`` now: ``α · prompt_tokens + β · predicted output tokens``.

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.duet.Duet(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)}))
            >>> who = fa.Agent("a", fa.App("x"))
            >>> r = fa.Request(id="r", agent=who, model="m", prompt_tokens=100, max_tokens=64, arrival=0.0)
            >>> policy.estimate_cost(r)   # nothing learned yet: half of max_tokens, 1·100 + 2·32
            164.0
        """
        predicted = self.predictor.predict(_EVERYONE, self.modality(req.model), req.prompt_tokens, req.max_tokens)
        return self.alpha * req.prompt_tokens + self.beta * predicted

    def modality(self, model: str) -> Modality:
        """The modality of ``model`` from its profile in the cost model; text if it has none.

        Examples:
            >>> import fairagents as fa
            >>> vlm = fa.ModelProfile(d_model=64, n_layers=1, modality=fa.Modality.VISION)
            >>> policy = fa.policies.duet.Duet(fa.UnifiedTokenCost({"vlm": vlm}))
            >>> policy.modality("vlm"), policy.modality("other")
            (<Modality.VISION: 'vision'>, <Modality.TEXT: 'text'>)
        """
        profile = getattr(self.cost, "profiles", {}).get(model)
        return profile.modality if profile is not None else Modality.TEXT

    def threshold(self, model: str) -> float | None:
        """The aging threshold ``θ`` of ``model``: the ``percentile`` of its recent waits.

        ``None`` until ``min_history`` requests of ``model`` were dispatched (no aging yet).

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.duet.Duet(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)}),
            ...                                min_history=10)
            >>> who = fa.Agent("a", fa.App("x"))
            >>> print(policy.threshold("m"))
            None
            >>> for i in range(1, 11):   # waits of 1, 2, ..., 10 seconds
            ...     r = fa.Request(id=f"h{i}", agent=who, model="m", prompt_tokens=1, max_tokens=1, arrival=0.0)
            ...     policy.on_arrival(r, now=0.0); policy.on_dispatch(r, now=float(i))
            >>> policy.threshold("m")
            9.0
        """
        waits = self._waits.get(model)
        if waits is None or len(waits.recent) < self.min_history:
            return None
        return waits.percentile(self.percentile)

    def priority(self, req: Request, now: float) -> tuple[float, float]:
        """The key ``req`` is ranked by at ``now``: ``(arrival time after aging, cost estimate)``.

        Raises:
            ProtocolError: ``req`` is not waiting.

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.duet.Duet(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)}))
            >>> r = fa.Request(id="r", agent=fa.Agent("a", fa.App("x")), model="m", prompt_tokens=10,
            ...                max_tokens=8, arrival=2.0)
            >>> policy.on_arrival(r, now=2.5)
            >>> policy.priority(r, now=3.0)   # no history yet: no aging
            (2.0, 18.0)
        """
        meta = self._waiting_meta.get(req.id)
        if meta is None:
            raise ProtocolError(f"request {req.id!r} is not waiting")
        entered, cost = meta
        cut = self._cut(req.model, now)
        if entered < cut:
            return req.arrival + self._snap(entered) - cut, cost
        return req.arrival, cost

    # -- decisions -------------------------------------------------------------

    def select(self, model: str, now: float) -> Request | None:
        """The waiting request with the least key at ``now`` for ``model``, or ``None``."""
        queue = self._queues.get(model)
        if not queue:
            return None
        return self._head(queue, model, now)[3]

    def select_among(self, models: Iterable[str], now: float) -> Request | None:
        """The waiting request with the least key at ``now`` over ``models`` (each with its own ``θ``).

        Examples:
            >>> import fairagents as fa
            >>> cost = fa.UnifiedTokenCost({m: fa.ModelProfile(d_model=64, n_layers=1) for m in ("a", "b")})
            >>> policy = fa.policies.duet.Duet(cost)
            >>> who = fa.Agent("t", fa.App("x"))
            >>> for rid, model, at in [("late", "a", 2.0), ("early", "b", 1.0)]:
            ...     policy.on_arrival(fa.Request(id=rid, agent=who, model=model, prompt_tokens=1,
            ...                                  max_tokens=1, arrival=at), now=2.0)
            >>> policy.select_among(["a", "b"], now=2.0).id
            'early'
        """
        best: _Key | None = None
        for model in models:
            queue = self._queues.get(model)
            if queue:
                key = self._head(queue, model, now)
                if best is None or key < best:
                    best = key
        return best[3] if best is not None else None

    # -- driver events ---------------------------------------------------------

    def on_progress(self, req: Request, new_output_tokens: int, now: float) -> None:
        """Count ``req``'s output, to learn its length when it finishes.

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.duet.Duet(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)}))
            >>> r = fa.Request(id="r", agent=fa.Agent("a", fa.App("x")), model="m", prompt_tokens=10,
            ...                max_tokens=8, arrival=0.0)
            >>> policy.on_arrival(r, 0.0); policy.on_dispatch(r, 0.0); policy.on_progress(r, 3, 0.1)
            >>> policy.on_finish(r, fa.Outcome.FINISHED, 0.2)
            >>> policy.predictor.error.samples   # one finished length learned
            1
        """
        super().on_progress(req, new_output_tokens, now)
        self._produced[req.id] += new_output_tokens

    def on_finish(self, req: Request, outcome: Outcome, now: float) -> None:
        """Forget ``req``; a request that ran to completion teaches its modality's regression.

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.duet.Duet(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)}))
            >>> r = fa.Request(id="r", agent=fa.Agent("a", fa.App("x")), model="m", prompt_tokens=10,
            ...                max_tokens=8, arrival=0.0)
            >>> policy.on_arrival(r, 0.0); policy.on_dispatch(r, 0.0); policy.on_progress(r, 3, 0.1)
            >>> policy.on_finish(r, fa.Outcome.CANCELLED, 0.2)
            >>> policy.predictor.error.samples   # a cut-short length is not learned
            0
        """
        was_running = req.id in self._running
        super().on_finish(req, outcome, now)
        if was_running:
            produced = self._produced.pop(req.id)
            if outcome is Outcome.FINISHED:
                self.predictor.observe(_EVERYONE, self.modality(req.model), req.prompt_tokens, produced, req.max_tokens)

    # -- internals ---------------------------------------------------------------

    def _snap(self, t: float) -> float:
        step = self.aging_step
        return step * math.floor(t / step) if step else t

    def _cut(self, model: str, now: float) -> float:
        """Requests that entered before this time are aged, by ``cut − snap(entered)`` seconds."""
        theta = self.threshold(model)
        return -math.inf if theta is None else self._snap(now - theta)

    def _head(self, queue: _ModelQueue, model: str, now: float) -> _Key:
        cut = self._cut(model, now)
        aged, fresh = queue.best(cut)
        if aged[3] is not None:
            aged = (aged[0] - cut, aged[1], aged[2], aged[3])
            if aged < fresh:
                return aged
        return fresh

    def _enqueue(self, req: Request, now: float) -> None:
        queue = self._queues.get(req.model)
        if queue is None:
            queue = self._queues[req.model] = _ModelQueue()
        entered = max(now, queue.last_entered())
        cost = self.estimate_cost(req)
        self._seq += 1
        queue.push(
            req.id,
            entered,
            (req.arrival + self._snap(entered), cost, self._seq, req),
            (req.arrival, cost, self._seq, req),
        )
        self._waiting_meta[req.id] = (entered, cost)

    def _dequeue(self, req: Request, now: float, dispatched: bool) -> None:
        entered, _ = self._waiting_meta.pop(req.id)
        self._queues[req.model].remove(req.id)
        if dispatched:
            waits = self._waits.get(req.model)
            if waits is None:
                waits = self._waits[req.model] = _WaitHistory(self.history)
            waits.add(max(0.0, now - entered))
            self._produced[req.id] = 0
