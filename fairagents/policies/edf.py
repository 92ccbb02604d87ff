"""Earliest deadline first, H-MAS's deadline-driven policy (Appendix C.1–C.2, deadline from §3.5).

Each request gets an absolute deadline when it arrives (§3.5, under Eq. 5)::

    D_r = a_r + SLO_ttft + SLO_tpot · l_pred

and a model runs its waiting request of earliest deadline. ``l_pred`` comes from the
shared output-length predictor. A request whose agent (and app) states no ``ttft`` or
``tpot`` takes ``default_ttft`` / ``default_tpot`` (13 s and 150 ms per token, the
loosest template of the paper's Table 6), so every deadline is finite and nothing
starves. An ``e2e`` objective caps the deadline at ``a_r + SLO_e2e``. Deadlines are
times, so under a shared pool limit the earliest among the models with room goes first.

See the policies page in the docs (*Choosing a policy*, the H-MAS pool) for the
starvation bound and where the paper is silent.
"""

from __future__ import annotations

from typing import ClassVar

from fairagents.cost import CostModel
from fairagents.policies._predicted import DEFAULT_TPOT, DEFAULT_TTFT, Estimate, PredictivePolicy
from fairagents.policies.predict import LengthPredictor
from fairagents.request import Request

__all__ = ["EDF"]


class EDF(PredictivePolicy):
    """Earliest deadline ``D_r = a_r + SLO_ttft + SLO_tpot · l_pred`` first.

    Args:
        cost: the unified cost model (its profiles give each model's modality).
        predictor: the output-length predictor; pass one to share it with other
            policies, a new one by default.
        default_ttft: TTFT objective (seconds) of a request without one (13 s).
        default_tpot: TPOT objective (seconds per token) of a request without one (0.15 s).

    Examples:
        >>> import fairagents as fa
        >>> cost = fa.UnifiedTokenCost({"chat": fa.ModelProfile(d_model=4096, n_layers=1)})
        >>> policy = fa.policies.edf.EDF(cost)
        >>> app = fa.App("x")
        >>> urgent = fa.Agent("pilot", app, slo=fa.SLO(ttft=0.5, tpot=0.05))
        >>> relaxed = fa.Agent("indexer", app, slo=fa.SLO(ttft=5.0, tpot=0.1))
        >>> first = fa.Request(id="bulk", agent=relaxed, model="chat", prompt_tokens=10, max_tokens=20, arrival=0.0)
        >>> later = fa.Request(id="ping", agent=urgent, model="chat", prompt_tokens=10, max_tokens=20, arrival=1.0)
        >>> policy.on_arrival(first, now=0.0); policy.on_arrival(later, now=1.0)
        >>> policy.deadline(first), policy.deadline(later)   # l_pred = 10 (half of max_tokens) before any is seen
        (6.0, 2.0)
        >>> policy.select("chat", now=1.0).id
        'ping'
    """

    name: ClassVar[str] = "edf"
    reads_slos: ClassVar[bool] = True

    def __init__(
        self,
        cost: CostModel | None = None,
        *,
        predictor: LengthPredictor | None = None,
        default_ttft: float = DEFAULT_TTFT,
        default_tpot: float = DEFAULT_TPOT,
    ) -> None:
        super().__init__(cost, predictor=predictor, default_ttft=default_ttft, default_tpot=default_tpot)

    def deadline(self, req: Request) -> float:
        """``D_r`` of a waiting request (seconds on the scheduler's clock).

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.edf.EDF(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)}))
            >>> r = fa.Request(id="r", agent=fa.Agent("a", fa.App("x")), model="m", prompt_tokens=1,
            ...                max_tokens=20, arrival=2.0)
            >>> policy.on_arrival(r, now=2.0)
            >>> policy.deadline(r)   # no SLO: 2 + 13 + 0.15 · 10
            16.5
        """
        return self._queues.key(req)  # type: ignore[no-any-return]

    def _key(self, req: Request, est: Estimate, now: float) -> float:
        return self._deadline(req, est)
