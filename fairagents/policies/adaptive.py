"""H-MAS's meta controller: switch the active policy from long-horizon statistics, with guards.

H-MAS (§3.4.1, Appendix C, Alg. 1) keeps a pool Ω of queue orderings and lets a slow
loop pick the active one. :class:`Adaptive` wraps one active policy of ``pool`` and,
at the first event after every ``interval`` boundary (it has no timer), applies the
paper's rule map to what the interval showed, first match wins: a queue longer than
``bypass_queue`` or a violation rate above ``bypass_violation`` → ``fcfs`` (emergency
bypass); a length CV above ``length_cv`` with violations above ``violation`` →
``two_lane``; violations above ``violation`` → ``edf``; Jain's index of the apps'
weighted service below ``unfairness`` → ``wfq``; otherwise ``sjf``. If within ``guard``
seconds of a switch the p99 TTFT or the violation rate exceeds ``rho`` × its value
before, the last stable policy is restored (eq. 12). Waiting requests move to the new
policy in arrival order; running ones stay with the policy that dispatched them.
``selector`` lets a model decide instead (``Π_meta``), with the rules as the fallback.

See the policies page in the docs (*Choosing a policy*, ``adaptive``) for the selector
protocol and where the paper leaves things open.

Examples:
    >>> import fairagents as fa
    >>> from fairagents.policies.adaptive import Adaptive
    >>> cost = fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=4096, n_layers=1)})
    >>> policy = Adaptive(cost, pool=("fcfs", "hmfs"), initial="hmfs", interval=1.0, bypass_queue=1)
    >>> who = fa.Agent("t", fa.App("a"))
    >>> for i, t in enumerate([0.0, 0.5]):
    ...     policy.on_arrival(fa.Request(f"r{i}", who, "m", 4, 4, t), now=t)
    >>> policy.active.name
    'hmfs'
    >>> policy.on_arrival(fa.Request("r2", who, "m", 4, 4, 1.5), now=1.5)   # an interval ended with 2 waiting
    >>> policy.switches, policy.queued(), policy.select("m", now=1.5).id
    ([Switch(at=1.5, frm='hmfs', to='fcfs', reason='emergency bypass', source='bypass')], 3, 'r0')
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fairagents.cost import CostModel, UnifiedTokenCost
from fairagents.errors import InvalidParameterError, ProtocolError
from fairagents.metrics import jain_index, percentile
from fairagents.policies.base import BasePolicy, DefersInput, Policy
from fairagents.policies.decision import parse_decision
from fairagents.policies.registry import BASE_POLICIES, by_name
from fairagents.request import Outcome, Request

__all__ = ["Adaptive", "SelectorStats", "Switch"]

BYPASS = "emergency bypass"
SOURCES = (
    "rules", "model", "fallback: malformed", "fallback: late", "fallback: error", "rollback", "bypass", "by hand",
)
"""What a :class:`Switch` came from."""


@dataclass(frozen=True, slots=True)
class Switch:
    """One switch of the active policy, and where its decision came from.

    ``source`` is one of :data:`SOURCES`:

    - ``"rules"``: the rule map (no selector);
    - ``"model"``: the selector's answer, validated against the pool;
    - ``"fallback: malformed"``, ``"fallback: late"``, ``"fallback: error"``: the rule
      map, because the selector's answer was not a valid decision, was not there by
      ``selector_timeout``, or the selector failed;
    - ``"rollback"``: the rollback guard restored the last stable policy;
    - ``"bypass"``: the emergency bypass (always the rules');
    - ``"by hand"``: :meth:`Adaptive.switch` called by an operator.

    ``reason`` is the rule's reason, or the model's own (``"the model's choice"`` if it
    gave none).
    """

    at: float
    frm: str
    to: str
    reason: str
    source: str = "rules"


@dataclass(slots=True)
class SelectorStats:
    """What the selector's questions came to: asked, and how each was answered.

    ``asked`` = ``accepted + malformed + late + errors + dropped`` once no question is
    pending; ``dropped`` counts questions cancelled because the emergency bypass or a
    rollback decided first.
    """

    asked: int = 0
    accepted: int = 0
    malformed: int = 0
    late: int = 0
    errors: int = 0
    dropped: int = 0


@dataclass(slots=True)
class _Fallback:
    """The rules' choice at a decision, and the baseline the rollback guard compares with."""

    target: str
    reason: str
    p99: float | None
    rate: float


@dataclass(slots=True)
class _Pending:
    """A question to the selector whose answer is not in yet."""

    future: Any
    asked: float
    fallback: _Fallback


@dataclass(slots=True)
class _Window:
    """What one interval showed."""

    start: float = 0.0
    arrivals: int = 0
    finished: int = 0
    violations: int = 0
    ttfts: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    service: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))

    @property
    def violation_rate(self) -> float:
        return self.violations / self.finished if self.finished else 0.0


class Adaptive(BasePolicy):
    """A policy that picks the active policy of a pool every ``interval`` seconds (H-MAS's meta controller).

    Args:
        cost: the unified cost model (handed to every policy of the pool).
        pool: names of the policies it may switch between (must be registered).
        initial: the first active policy (``sjf``, as H-MAS's Alg. 1).
        interval: ``ΔT_meta``, seconds between decisions.
        violation: TTFT/TPOT violation rate above which deadlines (or isolation) are chosen.
        length_cv: output-length coefficient of variation above which isolation is chosen.
        unfairness: Jain's index of app service below which fair sharing is chosen.
        bypass_queue: requests waiting above which the bypass to FCFS fires.
        bypass_violation: a violation rate above which the bypass fires.
        rho: the rollback factor ``ρ`` > 1 of eq. 12.
        guard: seconds after a switch during which the rollback guard watches.
        selector: ``Π_meta`` as a model (Appendix C.2), or ``None`` for the rules alone.
            Called at a decision with the view ``V_long`` (a JSON-able dict, see
            :meth:`view`), it returns the model's reply text (``str``), or a future-like
            object (``done()``, ``result()``, ``cancel()``: an :class:`asyncio.Task`, a
            :class:`concurrent.futures.Future`) whose result is that text.
            :class:`~fairagents.runtime.selector.ModelSelector` asks a model of the
            pool. The reply is validated by
            :func:`~fairagents.policies.decision.parse_decision` against the pool; the
            rules decide instead when it is malformed, late, or the selector fails.
        selector_timeout: seconds (of ``now``) a pending answer is waited for; at the
            first event after that it is cancelled and the rules decide.

    Examples:
        >>> from fairagents.policies.adaptive import Adaptive
        >>> Adaptive(pool=("fcfs", "nope"))
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: adaptive pool: unknown policy 'nope'

        A selector that answers at once, with the reply of a model that chose ``edf``
        (the rules would keep ``sjf`` on a quiet interval):

        >>> import fairagents as fa
        >>> cost = fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=4096, n_layers=1)})
        >>> who = fa.Agent("t", fa.App("a"))
        >>> views = []
        >>> def model(view):
        ...     views.append(view)
        ...     return 'Here you go: {"policy": "edf", "reason": "deadlines ahead"}'
        >>> policy = Adaptive(cost, interval=1.0, selector=model)
        >>> policy.on_arrival(fa.Request("r0", who, "m", 4, 4, 0.2), now=0.2)
        >>> policy.on_arrival(fa.Request("r1", who, "m", 4, 4, 1.5), now=1.5)
        >>> views[0]["rules"], views[0]["arrivals"], views[0]["queued"]
        ({'policy': 'sjf', 'reason': 'steady'}, 1, 1)
        >>> policy.switches
        [Switch(at=1.5, frm='sjf', to='edf', reason='deadlines ahead', source='model')]

        A reply that is no decision (or names a policy outside the pool): the rules decide.

        >>> policy = Adaptive(cost, initial="fcfs", interval=1.0, selector=lambda view: "EDF, definitely")
        >>> policy.on_arrival(fa.Request("r0", who, "m", 4, 4, 0.2), now=0.2)
        >>> policy.on_arrival(fa.Request("r1", who, "m", 4, 4, 1.5), now=1.5)
        >>> policy.switches
        [Switch(at=1.5, frm='fcfs', to='sjf', reason='steady', source='fallback: malformed')]
        >>> policy.selector_stats
        SelectorStats(asked=1, accepted=0, malformed=1, late=0, errors=0, dropped=0)
    """

    name: ClassVar[str] = "adaptive"
    charges_unified_tokens: ClassVar[bool] = True
    reads_slos: ClassVar[bool] = True  # its rules read SLO attainment, and its pool holds edf and two_lane

    def __init__(
        self,
        cost: CostModel | None = None,
        *,
        pool: Sequence[str] = ("fcfs", "edf", "sjf", "two_lane", "wfq"),
        initial: str = "sjf",
        interval: float = 10.0,
        violation: float = 0.1,
        length_cv: float = 1.0,
        unfairness: float = 0.9,
        bypass_queue: int = 10_000,
        bypass_violation: float = 0.9,
        rho: float = 1.5,
        guard: float = 10.0,
        selector: Callable[[dict[str, Any]], Any] | None = None,
        selector_timeout: float = 5.0,
    ) -> None:
        super().__init__(cost if cost is not None else UnifiedTokenCost())
        unknown = [p for p in pool if p not in BASE_POLICIES]
        if unknown:
            raise InvalidParameterError(f"adaptive pool: unknown policy {unknown[0]!r}")
        if initial not in pool:
            initial = "fcfs" if "fcfs" in pool else pool[0]
        if interval <= 0 or guard < 0 or rho <= 1:
            raise InvalidParameterError("adaptive: interval must be > 0, guard ≥ 0 and rho > 1")
        if selector is not None and not callable(selector):
            raise InvalidParameterError(f"adaptive: selector must be callable or None, got {selector!r}")
        if not selector_timeout >= 0:
            raise InvalidParameterError(f"adaptive: selector_timeout must be ≥ 0, got {selector_timeout!r}")
        self.pool = tuple(pool)
        self.interval, self.violation, self.length_cv, self.unfairness = interval, violation, length_cv, unfairness
        self.bypass_queue, self.bypass_violation, self.rho, self.guard = bypass_queue, bypass_violation, rho, guard
        self.active: Policy = self._build(initial)
        self.switches: list[Switch] = []
        """Every switch, in order."""
        self._owner: dict[str, Policy] = {}  # running request id -> the policy that dispatched it
        self._first: dict[str, float] = {}
        self._produced: dict[str, int] = {}
        self._window = _Window()
        self._next = interval
        self._stable: str = initial
        self._watch: tuple[float, float | None, float] | None = None  # (until, TTFT p99 before, violation rate before)
        self._ending = Outcome.CANCELLED  # the outcome of the request ending now (for _dequeue)
        self.selector, self.selector_timeout = selector, selector_timeout
        self.selector_stats = SelectorStats()
        """How the selector's questions were answered."""
        self._pending: _Pending | None = None

    # -- the policy interface ------------------------------------------------------

    def select(self, model: str, now: float) -> Request | None:
        return self.active.select(model, now)

    def select_among(self, models: Iterable[str], now: float) -> Request | None:
        return self.active.select_among(models, now)

    def on_arrival(self, req: Request, now: float) -> None:
        self._tick(now)
        super().on_arrival(req, now)
        self._window.arrivals += 1

    def on_progress(self, req: Request, new_output_tokens: int, now: float) -> None:
        # BasePolicy.on_progress with _charge inlined: this runs for every streamed chunk.
        rid = req.id
        if rid not in self._running:
            raise ProtocolError(f"request {rid!r} is not running")
        if new_output_tokens:  # the cost model rejects a negative or non-integer count
            amount = self._output_cost(req.model, new_output_tokens)
            app = req.agent.app
            self._window.service[app.name] += amount / app.weight
            first = self._first
            if rid not in first:
                first[rid] = now
            produced = self._produced
            produced[rid] = produced.get(rid, 0) + new_output_tokens
        self._owner[rid].on_progress(req, new_output_tokens, now)

    def on_input(self, req: Request, tokens: int, now: float, cached: int = 0) -> None:
        """Charge admitted input to the window and to the policy that took the request."""
        super().on_input(req, tokens, now, cached)
        owner = self._owner[req.id]
        if isinstance(owner, DefersInput):
            owner.on_input(req, tokens, now, cached)

    def on_finish(self, req: Request, outcome: Outcome, now: float) -> None:
        owner = self._owner.pop(req.id, None)
        self._ending = outcome
        super().on_finish(req, outcome, now)
        if owner is not None:
            owner.on_finish(req, outcome, now)
            self._record(req, outcome, now)
        self._first.pop(req.id, None)
        self._produced.pop(req.id, None)
        self._tick(now)

    # -- BasePolicy hooks ----------------------------------------------------------------

    def _enqueue(self, req: Request, now: float) -> None:
        self.active.on_arrival(req, now)

    def _dequeue(self, req: Request, now: float, dispatched: bool) -> None:
        if dispatched:
            active = self.active
            if self._taking and isinstance(active, DefersInput):
                active.on_take(req, now)
            else:
                active.on_dispatch(req, now)
            self._owner[req.id] = active
        else:
            self.active.on_finish(req, self._ending, now)

    def _charge(self, req: Request, amount: float, now: float) -> None:
        self._window.service[req.app] += amount / req.agent.app.weight

    # -- the controller --------------------------------------------------------------------

    def _build(self, name: str) -> Policy:
        return by_name(BASE_POLICIES[name], self.cost)

    def _record(self, req: Request, outcome: Outcome, now: float) -> None:
        if outcome is not Outcome.FINISHED:
            return
        w = self._window
        w.finished += 1
        first = self._first.get(req.id)
        produced = self._produced.get(req.id, 0)
        w.lengths.append(produced)
        ttft = None if first is None else first - req.arrival
        if ttft is not None:
            w.ttfts.append(ttft)
        tpot = None if first is None or produced < 2 else (now - first) / (produced - 1)
        slo = req.agent.effective_slo
        if slo is not None and ((slo.ttft is not None and (ttft is None or ttft > slo.ttft))
                                or (slo.tpot is not None and tpot is not None and tpot > slo.tpot)):
            w.violations += 1

    def _tick(self, now: float) -> None:
        """At each event: a decision if an interval ended, then the pending answer, if any, checked."""
        if now >= self._next:
            self._boundary(now)
        if self._pending is not None:
            self._poll(now)

    def _boundary(self, now: float) -> None:
        """At the first event after an interval ends: the rollback guard, then one meta decision.

        However many intervals passed without events, one decision is made, on the
        statistics gathered since the last one. A baseline without measurements (no
        request finished before the switch) cannot be exceeded. The bypass is the rules'
        at once; otherwise the selector, if any, is asked (unless a question is pending:
        its fallback becomes this interval's rules' choice).
        """
        w, self._window = self._window, _Window(start=now)
        self._next = (math.floor(now / self.interval) + 1) * self.interval
        p99 = percentile(w.ttfts, 99) if w.ttfts else None
        mean, cv = _length_stats(w.lengths)
        target, reason = self._decide(w, cv)
        bypassing = reason == BYPASS
        if self._watch is not None:
            until, p99_before, rate_before = self._watch
            worse = w.finished and (
                (p99 is not None and p99_before is not None and p99 > self.rho * p99_before)
                or (rate_before > 0 and w.violation_rate > self.rho * rate_before)
            )
            # never undo the bypass while its condition holds
            if worse and not bypassing and self.active.name != self._stable:
                self._drop_pending()
                self.switch(self._stable, now, "rollback (eq. 12)", source="rollback")
                self._watch = None
                return
            if now >= until:
                self._stable = self.active.name
                self._watch = None
        fallback = _Fallback(target, reason, p99, w.violation_rate)
        if bypassing or self.selector is None:
            if bypassing:
                self._drop_pending()
            self._apply(target, reason, "bypass" if bypassing else "rules", fallback, now)
        elif self._pending is not None:
            self._pending.fallback = fallback
        else:
            self._ask(self._view(w, now, p99, mean, cv, fallback), fallback, now)

    def _decide(self, w: _Window, cv: float) -> tuple[str, str]:
        """The rule map's choice on interval ``w``, and why."""
        queued = self.queued()
        if queued > self.bypass_queue or w.violation_rate > self.bypass_violation:
            if "fcfs" in self.pool:
                return "fcfs", BYPASS
        rules = [
            (cv > self.length_cv and w.violation_rate > self.violation, "two_lane", "long requests block short ones"),
            (w.violation_rate > self.violation, "edf", "deadline misses"),
            (len(w.service) > 1 and jain_index(w.service.values()) < self.unfairness, "wfq", "unfair shares"),
            (True, "sjf", "steady"),
        ]
        for fires, name, reason in rules:
            if fires and name in self.pool:
                return name, reason
        return self.active.name, "no rule applies"

    def _view(
        self, w: _Window, now: float, p99: float | None, mean: float, cv: float, fallback: _Fallback
    ) -> dict[str, Any]:
        """``V_long``: what interval ``w`` showed, the state, and the rules' choice, as a JSON-able dict."""
        span = now - w.start
        return {
            "interval_s": _round(span),
            "arrivals": w.arrivals,
            "arrival_rate_per_s": _round(w.arrivals / span) if span > 0 else None,
            "finished": w.finished,
            "violation_rate": _round(w.violation_rate),
            "ttft_p99_s": None if p99 is None else _round(p99),
            "output_length_mean": _round(mean),
            "output_length_cv": _round(cv),
            "jain_index": _round(jain_index(w.service.values())) if w.service else None,
            "queued": self.queued(),
            "active": self.active.name,
            "pool": list(self.pool),
            "rules": {"policy": fallback.target, "reason": fallback.reason},
        }

    def view(self, now: float) -> dict[str, Any]:
        """The view a selector would be given now, on the interval so far (for inspection; changes nothing)."""
        w = self._window
        p99 = percentile(w.ttfts, 99) if w.ttfts else None
        mean, cv = _length_stats(w.lengths)
        target, reason = self._decide(w, cv)
        return self._view(w, now, p99, mean, cv, _Fallback(target, reason, p99, w.violation_rate))

    def _ask(self, view: dict[str, Any], fallback: _Fallback, now: float) -> None:
        """Ask the selector: a reply text is settled now, a future-like answer is left pending."""
        assert self.selector is not None
        self.selector_stats.asked += 1
        try:
            answer = self.selector(view)
        except Exception:  # e.g. ModelSelector with no running event loop
            self._fall_back("error", fallback, now)
            return
        if isinstance(answer, str):
            self._settle(answer, fallback, now)
        elif all(callable(getattr(answer, a, None)) for a in ("done", "result", "cancel")):
            self._pending = _Pending(answer, now, fallback)
        else:
            self._fall_back("error", fallback, now)

    def _poll(self, now: float) -> None:
        """The pending answer: settled if it is there, the rules' choice if its time is up."""
        pending = self._pending
        assert pending is not None
        try:
            done = bool(pending.future.done())
            text = pending.future.result() if done else None
        except BaseException as err:  # the selector's failure, or its future cancelled
            if isinstance(err, KeyboardInterrupt | SystemExit):
                raise
            self._pending = None
            self._fall_back("error", pending.fallback, now)
            return
        if done:
            self._pending = None
            self._settle(text, pending.fallback, now)
        elif now >= pending.asked + self.selector_timeout:
            self._pending = None
            self._cancel(pending)
            self._fall_back("late", pending.fallback, now)

    def _settle(self, text: Any, fallback: _Fallback, now: float) -> None:
        """Apply the model's decision in ``text`` if it is valid, the rules' choice if not."""
        decision = parse_decision(text, self.pool)
        if decision is None:
            self._fall_back("malformed", fallback, now)
            return
        self.selector_stats.accepted += 1
        self._apply(decision.policy, decision.reason or "the model's choice", "model", fallback, now)

    def _fall_back(self, why: str, fallback: _Fallback, now: float) -> None:
        stats = self.selector_stats
        setattr(stats, _COUNTERS[why], getattr(stats, _COUNTERS[why]) + 1)
        self._apply(fallback.target, fallback.reason, f"fallback: {why}", fallback, now)

    def _drop_pending(self) -> None:
        """Cancel the pending question: the bypass or a rollback decided first."""
        if self._pending is not None:
            self._cancel(self._pending)
            self._pending = None
            self.selector_stats.dropped += 1

    @staticmethod
    def _cancel(pending: _Pending) -> None:
        with contextlib.suppress(Exception):  # a future-like object that fails to cancel: nothing more to do
            pending.future.cancel()

    def _apply(self, target: str, reason: str, source: str, fallback: _Fallback, now: float) -> None:
        """Make ``target`` active (nothing if it is) and start the rollback guard's watch."""
        if target != self.active.name:
            self._watch = (now + max(self.guard, self.interval), fallback.p99, fallback.rate)
            self.switch(target, now, reason, source=source)

    def switch(self, name: str, now: float, reason: str = "by hand", *, source: str = "by hand") -> None:
        """Make ``name`` the active policy now: the waiting requests move to it, in arrival order; running ones stay.

        The controller calls it; an operator may too (the rules, or a pending answer of
        the selector, may switch again later).
        """
        if name not in self.pool:
            raise InvalidParameterError(f"adaptive: {name!r} is not in the pool ({', '.join(self.pool)})")
        old, new = self.active, self._build(name)
        waiting = sorted(self._waiting.values(), key=lambda r: (r.arrival, r.id))
        for req in waiting:
            old.on_finish(req, Outcome.CANCELLED, now)  # withdrawn from the old order, uncharged
            new.on_arrival(req, now)
        self.active = new
        self.switches.append(Switch(now, old.name, name, reason, source))


_COUNTERS = {"malformed": "malformed", "late": "late", "error": "errors"}


def _length_stats(lengths: Sequence[int]) -> tuple[float, float]:
    """The mean and coefficient of variation of output lengths (0 for none)."""
    mean = sum(lengths) / len(lengths) if lengths else 0.0
    cv = (math.sqrt(sum((x - mean) ** 2 for x in lengths) / len(lengths)) / mean) if mean else 0.0
    return mean, cv


def _round(x: float) -> float:
    return round(float(x), 4)
