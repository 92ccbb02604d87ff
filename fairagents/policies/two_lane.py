"""Two-lane isolation with slack order, H-MAS's isolation-based policy (§3.5, Eq. 5; Appendix C.1–C.2).

Requests are split into a latency-sensitive **fast** lane and a throughput-oriented
**slow** lane on their predicted service time ``T_tot = t̂_ttft + t̂_tpot · l_pred``
(§3.2), so long generations do not block short ones (head-of-line blocking). Within a
lane, requests go by the urgency score of Eq. (5)::

    S_r = D_r − V_sys − T_tot        D_r = a_r + SLO_ttft + SLO_tpot · l_pred

the remaining slack, least first (§3.5). ``l_pred`` comes from the shared output-length
predictor; ``t̂_ttft`` and ``t̂_tpot`` are learned per model (see
:class:`~fairagents.policies.sjf.SJF`).

Why a heap suffices. ``V_sys`` is one value for the whole system at a decision, so for
two requests ``S_r − S_q = (D_r − T_tot(r)) − (D_q − T_tot(q))``: the order by slack
is the order by the fixed key ``D_r − T_tot(r)``, whatever ``V_sys`` and ``now`` are,
and each lane is a heap on that key. :meth:`TwoLane.slack` gives ``S_r`` itself.

Where the paper is ambiguous or silent, and what is done here:

- **V_sys** is "the current system delay estimate" in §3.5 but "system virtual time"
  in Table 3. Here ``V_sys = now + d̂``, with ``d̂`` a moving average of the queueing
  delays (arrival → dispatch) of the requests dispatched so far, so ``S_r`` is the
  time left before ``r`` must start, were it to wait as long as requests do now.
  Either reading leaves the order unchanged (above).
- **Lane split.** The paper gives no threshold. A request goes to the fast lane if
  its ``T_tot`` is at most ``threshold`` seconds; by default (``threshold=None``), at
  most the mean ``T_tot`` of the earlier arrivals for its model (the first one is
  fast). The lane is fixed at arrival.
- **Which lane runs.** The paper mentions "lane gates" with a "gate period" and
  "weighting knobs" (Appendix C.1) but not how they work. Here a gate per model
  shares dispatches between the lanes by stride scheduling: while both wait, the
  fast lane gets ``fast_share`` of them and the slow lane the rest (3:1 by default,
  fast first: each lane's pass advances by ``1 / share`` per dispatch, and the lane
  whose next dispatch ends at the lower pass goes, the fast one on a tie); a lane
  alone takes every slot (work conservation). A lane that starts waiting is lifted
  to the other lane's pass, so it banks no credit, and a model whose lanes both
  empty starts afresh. There is no time-based gate period: a period in dispatches
  is implied by the share.
- **Default SLO** as in :class:`~fairagents.policies.edf.EDF` (13 s, 150 ms/token).
- **Several models.** Under a shared pool limit, the models' choices compare by
  slack (``D_r − T_tot``, ``V_sys`` being common).

Starvation. None, with finite deadlines (the defaults): in a lane, a request ``r``
is passed only by requests of smaller ``D − T_tot``, which arrived before
``a_r + (D_r − T_tot(r) − a_r) − min(D − T_tot − a)``; and while ``r``'s lane waits,
the other lane runs at most ``⌈share_other / share_lane⌉ + 2`` requests in a row.

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
        >>> fa.policies.two_lane.TwoLane(fast_share=0.5).name
        'two_lane'
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
        """``V_sys = now + d̂``, ``d̂`` the moving average of queueing delays so far.

        Examples:
            >>> import fairagents as fa
            >>> fa.policies.two_lane.TwoLane().system_time(5.0)
            5.0
        """
        return now + self._delay

    # -- driver-facing -----------------------------------------------------

    def select(self, model: str, now: float) -> Request | None:
        """The head of the lane whose turn it is on ``model`` (the fast one on a tie), or ``None``.

        Examples:
            >>> import fairagents as fa
            >>> fa.policies.two_lane.TwoLane().select("m", now=0.0) is None
            True
        """
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
