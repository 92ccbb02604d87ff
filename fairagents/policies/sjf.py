"""Shortest (predicted) job first, H-MAS's duration-driven policy (Appendix C.1–C.2; §3.2).

A model runs its waiting request of least predicted service time (§3.2; Algorithm 1,
line 6)::

    T_tot = t̂_ttft + t̂_tpot · l_pred

``l_pred`` comes from the shared output-length predictor; ``t̂_ttft`` (a line in the
prompt length) and ``t̂_tpot`` are learned per model from the dispatched requests
(``prior_ttft`` / ``prior_tpot`` until a model has been observed), so ``T_tot`` is in
seconds and comparable across models. Pure SJF starves long requests while shorter ones
keep arriving, so every second waited takes ``aging`` seconds off a request's key
(``aging=0`` is the paper's pure SJF): a request is passed only by requests arriving
before ``a_r + T_tot / aging``.

See the policies page in the docs (*Choosing a policy*, the H-MAS pool) for more.
"""

from __future__ import annotations

from typing import ClassVar

from fairagents.cost import CostModel
from fairagents.policies._predicted import PRIOR_TPOT, PRIOR_TTFT, Estimate, PredictivePolicy, check_positive
from fairagents.policies.predict import LengthPredictor
from fairagents.request import Request

__all__ = ["SJF"]


class SJF(PredictivePolicy):
    """Least predicted service time ``T_tot`` first, aged by waiting time.

    Args:
        cost: the unified cost model (its profiles give each model's modality).
        aging: seconds of predicted service time forgiven per second waited (≥ 0);
            0 is the paper's pure SJF, which can starve long requests.
        predictor: the output-length predictor; pass one to share it with other
            policies, a new one by default.
        prior_ttft: ``t̂_ttft`` (seconds) of a model before any of its requests was observed.
        prior_tpot: ``t̂_tpot`` (seconds per token) of a model before any was observed.

    Examples:
        >>> import fairagents as fa
        >>> cost = fa.UnifiedTokenCost({"chat": fa.ModelProfile(d_model=4096, n_layers=1)})
        >>> policy = fa.policies.sjf.SJF(cost, aging=0.0)
        >>> who = fa.Agent("a", fa.App("x"))
        >>> long = fa.Request(id="long", agent=who, model="chat", prompt_tokens=10, max_tokens=400, arrival=0.0)
        >>> short = fa.Request(id="short", agent=who, model="chat", prompt_tokens=10, max_tokens=20, arrival=0.5)
        >>> policy.on_arrival(long, now=0.0); policy.on_arrival(short, now=0.5)
        >>> round(policy.service_time(long), 6), round(policy.service_time(short), 6)   # 0.1 + 0.02 · l_pred
        (4.1, 0.3)
        >>> policy.select("chat", now=0.5).id
        'short'
    """

    name: ClassVar[str] = "sjf"

    def __init__(
        self,
        cost: CostModel | None = None,
        *,
        aging: float = 0.1,
        predictor: LengthPredictor | None = None,
        prior_ttft: float = PRIOR_TTFT,
        prior_tpot: float = PRIOR_TPOT,
    ) -> None:
        super().__init__(cost, predictor=predictor, prior_ttft=prior_ttft, prior_tpot=prior_tpot)
        self.aging = check_positive(aging, "aging", allow_zero=True)

    def service_time(self, req: Request) -> float:
        """``T_tot`` of a waiting or running request, as predicted when it arrived (seconds).

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.sjf.SJF(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)}))
            >>> r = fa.Request(id="r", agent=fa.Agent("a", fa.App("x")), model="m", prompt_tokens=1,
            ...                max_tokens=10, arrival=0.0)
            >>> policy.on_arrival(r, now=0.0)
            >>> round(policy.service_time(r), 6)   # 0.1 + 0.02 · 5
            0.2
        """
        return self.estimate(req).service

    def priority(self, req: Request, now: float) -> float:
        """The aged key ``T_tot − aging · (now − a_r)`` of a waiting request (lower runs first).

        Examples:
            >>> import fairagents as fa
            >>> policy = fa.policies.sjf.SJF(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)}),
            ...                              aging=0.5)
            >>> r = fa.Request(id="r", agent=fa.Agent("a", fa.App("x")), model="m", prompt_tokens=1,
            ...                max_tokens=10, arrival=0.0)
            >>> policy.on_arrival(r, now=0.0)
            >>> round(policy.priority(r, now=0.0), 6), round(policy.priority(r, now=2.0), 6)
            (0.2, -0.8)
        """
        return self._queues.key(req) - self.aging * now  # type: ignore[no-any-return]

    def _key(self, req: Request, est: Estimate, now: float) -> float:
        # T_tot − aging·(now − a) = (T_tot + aging·a) − aging·now: the last term is common to all.
        return est.service + self.aging * req.arrival
