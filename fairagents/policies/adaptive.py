"""H-MAS's meta controller: switch the active policy from long-horizon statistics, with guards.

H-MAS (§3.4.1, Appendix C, Alg. 1) keeps a pool Ω of queue structures and lets a slow
loop pick the active one every ``ΔT_meta`` seconds from a long-horizon view of the
workload ``V_long``. :class:`Adaptive` is that loop as a policy: it wraps one active
policy of the pool, and every ``interval`` seconds (of the ``now`` it is given: it
has no timer, so it decides at the first event after each boundary) it reads what
the interval showed and applies the paper's rule map (§3.4.1):

1. **emergency bypass** (``ξ_bypass``, Alg. 1 lines 9–12): more than
   ``bypass_queue`` requests waiting, or a short-window TTFT violation rate above
   ``bypass_violation`` → FCFS, until the guard conditions clear;
2. **isolation**: output-length variance high (coefficient of variation above
   ``length_cv``) while TTFT violations exceed ``violation`` → ``two_lane``;
3. **deadlines**: TTFT or TPOT violations above ``violation`` → ``edf``;
4. **fairness**: Jain's index of the apps' weighted service in the interval below
   ``unfairness`` → ``wfq``;
5. otherwise ``sjf`` (Alg. 1 line 1 starts with SJF).

**Rollback guard** (Appendix C.2, eq. 12): after a switch, if within ``guard``
seconds the p99 TTFT exceeds ``rho`` × its value in the interval before the switch,
or the violation rate exceeds ``rho`` × its value before, the last stable policy is
restored (and held for one interval).

**Switching in place** (Appendix C.1): the waiting requests are handed to the new
policy, in arrival order, and withdrawn from the old one uncharged; requests already
running stay with the policy that dispatched them, which is told of their progress
and end. No request is lost, duplicated or reordered against the new policy's order.
``switches`` records every decision.

Where the paper leaves it open, and what is chosen here:

- ``Π_meta`` is an LLM in the paper; here it is the deterministic rule map above (the
  paper's own fallback when the LLM's answer is invalid). Asking a model of the pool
  is not built.
- The thresholds of the rule map are not given in the paper; they are parameters,
  with defaults chosen on the simulator (``fairagents bench policies``).
- A policy of the pool is named by its registered name and built with this policy's
  cost model; ``pool`` limits which ones the rules may pick (one the rules ask for
  but the pool lacks is skipped for the next rule).
- "Violation" counts a finished request that missed its TTFT or TPOT SLO (eq. 1);
  requests without SLOs count as met.

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
    ([Switch(at=1.5, frm='hmfs', to='fcfs', reason='emergency bypass')], 3, 'r0')
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from fairagents.cost import CostModel, UnifiedTokenCost
from fairagents.errors import InvalidParameterError
from fairagents.metrics import jain_index, percentile
from fairagents.policies.base import BasePolicy, Policy
from fairagents.request import Outcome, Request

__all__ = ["Adaptive", "Switch"]


@dataclass(frozen=True, slots=True)
class Switch:
    """One decision of the controller.

    Examples:
        >>> from fairagents.policies.adaptive import Switch
        >>> Switch(10.0, "fcfs", "edf", "deadlines").to
        'edf'
    """

    at: float
    frm: str
    to: str
    reason: str


@dataclass(slots=True)
class _Window:
    """What one interval showed."""

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

    Examples:
        >>> from fairagents.policies.adaptive import Adaptive
        >>> Adaptive(pool=("fcfs", "nope"))
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: adaptive pool: unknown policy 'nope'
    """

    name: ClassVar[str] = "adaptive"
    charges_unified_tokens: ClassVar[bool] = True

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
    ) -> None:
        from fairagents.policies import POLICIES

        super().__init__(cost if cost is not None else UnifiedTokenCost())
        unknown = [p for p in pool if p not in POLICIES or p == self.name]
        if unknown:
            raise InvalidParameterError(f"adaptive pool: unknown policy {unknown[0]!r}")
        if initial not in pool:
            initial = "fcfs" if "fcfs" in pool else pool[0]
        if interval <= 0 or guard < 0 or rho <= 1:
            raise InvalidParameterError("adaptive: interval must be > 0, guard ≥ 0 and rho > 1")
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
        super().on_progress(req, new_output_tokens, now)
        if new_output_tokens:
            self._first.setdefault(req.id, now)
            self._produced[req.id] = self._produced.get(req.id, 0) + new_output_tokens
        self._owner[req.id].on_progress(req, new_output_tokens, now)

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
            self.active.on_dispatch(req, now)
            self._owner[req.id] = self.active
        else:
            self.active.on_finish(req, self._ending, now)

    def _charge(self, req: Request, amount: float, now: float) -> None:
        self._window.service[req.app] += amount / req.agent.app.weight

    # -- the controller --------------------------------------------------------------------

    def _build(self, name: str) -> Policy:
        from fairagents.policies import make_policy

        return make_policy(name, self.cost)

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
        """At the first event after an interval ends: the rollback guard, then one meta decision.

        However many intervals passed without events, one decision is made, on the
        statistics gathered since the last one. A baseline without measurements (no
        request finished before the switch) cannot be exceeded.
        """
        if now < self._next:
            return
        w, self._window = self._window, _Window()
        self._next = (math.floor(now / self.interval) + 1) * self.interval
        p99 = percentile(w.ttfts, 99) if w.ttfts else None
        target, reason = self._decide(w)
        if self._watch is not None:
            until, p99_before, rate_before = self._watch
            worse = w.finished and (
                (p99 is not None and p99_before is not None and p99 > self.rho * p99_before)
                or (rate_before > 0 and w.violation_rate > self.rho * rate_before)
            )
            bypassing = reason == "emergency bypass"  # never undo the bypass while its condition holds
            if worse and not bypassing and self.active.name != self._stable:
                self.switch(self._stable, now, "rollback (eq. 12)")
                self._watch = None
                return
            if now >= until:
                self._stable = self.active.name
                self._watch = None
        if target != self.active.name:
            self._watch = (now + max(self.guard, self.interval), p99, w.violation_rate)
            self.switch(target, now, reason)

    def _decide(self, w: _Window) -> tuple[str, str]:
        queued = self.queued()
        if queued > self.bypass_queue or w.violation_rate > self.bypass_violation:
            if "fcfs" in self.pool:
                return "fcfs", "emergency bypass"
        lengths = w.lengths
        mean = sum(lengths) / len(lengths) if lengths else 0.0
        cv = (math.sqrt(sum((x - mean) ** 2 for x in lengths) / len(lengths)) / mean) if mean else 0.0
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

    def switch(self, name: str, now: float, reason: str = "by hand") -> None:
        """Make ``name`` the active policy now: the waiting requests move to it, in arrival order; running ones stay.

        The controller calls it; an operator may too (the rules may switch again at the next interval).
        """
        if name not in self.pool:
            raise InvalidParameterError(f"adaptive: {name!r} is not in the pool ({', '.join(self.pool)})")
        old, new = self.active, self._build(name)
        waiting = sorted(self._waiting.values(), key=lambda r: (r.arrival, r.id))
        for req in waiting:
            old.on_finish(req, Outcome.CANCELLED, now)  # withdrawn from the old order, uncharged
            new.on_arrival(req, now)
        self.active = new
        self.switches.append(Switch(now, old.name, name, reason))
