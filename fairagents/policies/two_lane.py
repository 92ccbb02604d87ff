"""Two-lane isolation with slack order, H-MAS's isolation-based policy (§3.5, Eq. 5; Appendix C.1–C.2).

Requests are split on their predicted service time ``T_tot = t̂_ttft + t̂_tpot · l_pred``
into a **fast** lane (``T_tot`` at most ``threshold`` seconds; by default at most the mean
``T_tot`` of the model's earlier arrivals) and a **slow** lane, so long generations do
not block short ones. Within a lane requests go by least slack (Eq. 5)::

    S_r = D_r − V_sys − T_tot        D_r = a_r + SLO_ttft + SLO_tpot · l_pred

``V_sys`` is common to every request at a decision, so each lane is a heap on the fixed
key ``D_r − T_tot``; :meth:`TwoLane.slack` gives ``S_r`` itself. While both lanes wait,
a stride gate per model gives the fast lane ``fast_share`` of the dispatches (fast
first); a lane waiting alone takes every slot. Deadlines and ``T_tot`` are as for
:class:`~fairagents.policies.edf.EDF` and :class:`~fairagents.policies.sjf.SJF`.

See the policies page in the docs (*Choosing a policy*, the H-MAS pool) for the
starvation bound and where the paper is silent and what was chosen.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from fairagents.cost import CostModel
from fairagents.errors import InvalidParameterError
from fairagents.policies._predicted import (
    DEFAULT_TPOT,
    DEFAULT_TTFT,
    PRIOR_TPOT,
    PRIOR_TTFT,
    PredictivePolicy,
    check_positive,
)
from fairagents.policies.predict import LengthPredictor
from fairagents.request import Request

__all__ = ["TwoLane"]

Lane = Literal["fast", "slow"]
FAST: Lane = "fast"
SLOW: Lane = "slow"
#: Weight of the latest queueing delay in the moving average ``d̂`` of ``V_sys``.
DELAY_SMOOTHING = 0.2


class _Gate:
    """One model's two lanes: how many wait in each and each lane's stride pass."""

    __slots__ = ("passes", "waiting")

    def __init__(self) -> None:
        self.waiting = {FAST: 0, SLOW: 0}
        self.passes = {FAST: 0.0, SLOW: 0.0}


class TwoLane(PredictivePolicy):
    """Fast and slow lanes split on ``T_tot``, slack order ``S = D − V_sys − T_tot`` within each.

    Args:
        cost: the unified cost model (its profiles give each model's modality).
        threshold: ``T_tot`` (seconds) up to which a request takes the fast lane;
            ``None``: the mean ``T_tot`` of earlier arrivals for the same model.
        fast_share: share of dispatches the fast lane gets while both lanes wait, in (0, 1).
        predictor: the output-length predictor; pass one to share it with other
            policies, a new one by default.
        default_ttft: TTFT objective (seconds) of a request without one (13 s).
        default_tpot: TPOT objective (seconds per token) of a request without one (0.15 s).
        prior_ttft: ``t̂_ttft`` (seconds) of a model before any of its requests was observed.
        prior_tpot: ``t̂_tpot`` (seconds per token) of a model before any was observed.

    Examples:
        >>> import fairagents as fa
        >>> cost = fa.UnifiedTokenCost({"chat": fa.ModelProfile(d_model=4096, n_layers=1)})
        >>> policy = fa.policies.two_lane.TwoLane(cost, threshold=1.0)
        >>> who = fa.Agent("a", fa.App("x"), slo=fa.SLO(ttft=1.0, tpot=0.05))
        >>> def request(i, max_tokens, at):
        ...     return fa.Request(id=i, agent=who, model="chat", prompt_tokens=10, max_tokens=max_tokens, arrival=at)
        >>> reqs = [request("essay", 400, 0.0), request("q1", 20, 0.1), request("q2", 40, 0.2)]
        >>> for r in reqs:
        ...     policy.on_arrival(r, now=0.2)
        >>> [(r.id, policy.lane(r)) for r in reqs]   # T_tot = 0.1 + 0.02 · l_pred: 4.1, 0.3, 0.5
        [('essay', 'slow'), ('q1', 'fast'), ('q2', 'fast')]
        >>> order = []
        >>> while (r := policy.select("chat", now=0.2)) is not None:
        ...     order.append(r.id); policy.on_dispatch(r, now=0.2)
        >>> order   # fast lane by slack (q1 1.1, q2 1.5 at 0.2), up to 3 fast for 1 slow; then essay (slack 6.7)
        ['q1', 'q2', 'essay']
    """

    name: ClassVar[str] = "two_lane"
    reads_slos: ClassVar[bool] = True

    def __init__(
        self,
        cost: CostModel | None = None,
        *,
        threshold: float | None = None,
        fast_share: float = 0.75,
        predictor: LengthPredictor | None = None,
        default_ttft: float = DEFAULT_TTFT,
        default_tpot: float = DEFAULT_TPOT,
        prior_ttft: float = PRIOR_TTFT,
        prior_tpot: float = PRIOR_TPOT,
    ) -> None:
        super().__init__(cost, predictor=predictor, default_ttft=default_ttft, default_tpot=default_tpot,
                         prior_ttft=prior_ttft, prior_tpot=prior_tpot)
        self.threshold = None if threshold is None else check_positive(threshold, "threshold", allow_zero=True)
        share = check_positive(fast_share, "fast_share")
        if share >= 1:
            raise InvalidParameterError(f"fast_share must be in (0, 1), got {fast_share!r}")
        self.fast_share = share
        self._stride = {FAST: 1.0 / share, SLOW: 1.0 / (1.0 - share)}
        self._gates: dict[str, _Gate] = {}
        self._seen: dict[str, list[float]] = {}  # model -> [sum of T_tot, arrivals], for the default threshold
        self._lane: dict[str, Lane] = {}  # waiting request id -> lane
        self._due: dict[str, float] = {}  # waiting request id -> D_r
        self._delay = 0.0  # d̂

    # -- introspection -----------------------------------------------------

    def lane(self, req: Request) -> Lane:
        """``"fast"`` or ``"slow"``: the lane of a waiting request.

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.two_lane.TwoLane(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64,
            ...                                                                                  n_layers=1)}))
            >>> r = fa.Request(id="r", agent=fa.Agent("a", fa.App("x")), model="m", prompt_tokens=1,
            ...                max_tokens=10, arrival=0.0)
            >>> policy.on_arrival(r, now=0.0); policy.lane(r)   # the first arrival for a model is fast
            'fast'
        """
        return self._lane[req.id]

    def slack(self, req: Request, now: float) -> float:
        """``S_r = D_r − V_sys − T_tot`` of a waiting request (Eq. 5), with ``V_sys = now + d̂``.

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.two_lane.TwoLane(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64,
            ...                                                                                  n_layers=1)}))
            >>> who = fa.Agent("a", fa.App("x"), slo=fa.SLO(ttft=2.0, tpot=0.1))
            >>> r = fa.Request(id="r", agent=who, model="m", prompt_tokens=1, max_tokens=10, arrival=0.0)
            >>> policy.on_arrival(r, now=0.0)
            >>> round(policy.slack(r, now=1.0), 6)   # D = 2 + 0.1 · 5 = 2.5, T_tot = 0.1 + 0.02 · 5 = 0.2
            1.3
        """
        return self._queues.key(req) - self.system_time(now)  # type: ignore[no-any-return]

    def deadline(self, req: Request) -> float:
        """``D_r`` of a waiting request.

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.two_lane.TwoLane(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64,
            ...                                                                                  n_layers=1)}))
            >>> r = fa.Request(id="r", agent=fa.Agent("a", fa.App("x")), model="m", prompt_tokens=1,
            ...                max_tokens=10, arrival=1.0)
            >>> policy.on_arrival(r, now=1.0); policy.deadline(r)   # no SLO: 1 + 13 + 0.15 · 5
            14.75
        """
        return self._due[req.id]

    def system_time(self, now: float) -> float:
        """``V_sys = now + d̂``, ``d̂`` the moving average of queueing delays so far."""
        return now + self._delay

    # -- driver-facing -----------------------------------------------------

    def select(self, model: str, now: float) -> Request | None:
        """The head of the lane whose turn it is on ``model`` (the fast one on a tie), or ``None``."""
        gate = self._gates.get(model)
        if gate is None:
            return None
        fast, slow = gate.waiting[FAST], gate.waiting[SLOW]
        passes, stride = gate.passes, self._stride
        if fast and (not slow or passes[FAST] + stride[FAST] <= passes[SLOW] + stride[SLOW]):
            return self._queues.head((model, FAST))
        if slow:
            return self._queues.head((model, SLOW))
        return None

    # -- hooks -------------------------------------------------------------

    def _enqueue(self, req: Request, now: float) -> None:
        est = self._estimates[req.id] = self._predict(req)
        seen = self._seen.setdefault(req.model, [0.0, 0])
        if self.threshold is not None:
            fast = est.service <= self.threshold
        else:
            fast = not seen[1] or est.service * seen[1] <= seen[0]
        seen[0] += est.service
        seen[1] += 1
        lane = self._lane[req.id] = FAST if fast else SLOW
        due = self._due[req.id] = self._deadline(req, est)
        self._queues.push((req.model, lane), req, due - est.service)
        gate = self._gates.get(req.model)
        if gate is None:
            gate = self._gates[req.model] = _Gate()
        other = SLOW if lane == FAST else FAST
        if not gate.waiting[lane] and gate.waiting[other]:  # no banked credit for a lane that was empty
            gate.passes[lane] = max(gate.passes[lane], gate.passes[other])
        gate.waiting[lane] += 1

    def _dequeue(self, req: Request, now: float, dispatched: bool) -> None:
        lane = self._lane.pop(req.id)
        del self._due[req.id]
        super()._dequeue(req, now, dispatched)
        gate = self._gates[req.model]
        gate.waiting[lane] -= 1
        if dispatched:
            gate.passes[lane] += self._stride[lane]
            wait = now - req.arrival
            self._delay += DELAY_SMOOTHING * (wait - self._delay)
        if not gate.waiting[FAST] and not gate.waiting[SLOW]:
            gate.passes[FAST] = gate.passes[SLOW] = 0.0
