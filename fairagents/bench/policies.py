"""Every policy side by side on one mixed-SLO overload scenario, on the simulator.

Four apps share a text and a vision model for ``seconds`` virtual seconds, sending
more than the engines serve (the text model's queue grows through the run):

- ``assistant``: interactive chat, tight SLOs (TTFT 1 s, TPOT 0.1 s, end to end 10 s);
- ``reports``: long generations, loose SLOs (TTFT 10 s, TPOT 0.5 s, end to end 120 s);
- ``inspector``: vision requests (TTFT 2 s, end to end 15 s);
- ``flood``: many medium requests, its SLO as loose as ``reports``' (TTFT 10 s).

It runs on :class:`~fairagents.engines.SimEngine` (the simulator, deterministic for a
seed), so the numbers compare policies, not machines. Per policy:

- ``slo_attainment``: the share of requests with an SLO that met every SLO they had;
- ``goodput``: the share of requests with a TTFT or TPOT SLO that met both (H-MAS eq. 8–9; unset = met);
- ``jain_safi``: Jain's index (standard) over the apps' SAFI (ExFairS eq. 4:
  ``0.7 · SLO-miss rate + 0.3 · service / max service``, service in unified tokens);
- ``gap_over_2u``: the largest service gap between two backlogged apps over ``2U``;
- ``ttft_p99``: p99 time to first token, in seconds;
- ``esg``: H-MAS eq. 6, ``Σ V_base · min(1, SLO_ttlt / TTLT)`` with ``V_base = input +
  2 · output`` and α = 1, reported normalised by ``Σ V_base`` (1 = every request in time).
  ``SLO_ttlt`` is the end-to-end SLO, or ``SLO_ttft + L_o · SLO_tpot`` without one.

A request without the SLO a metric checks is left out of it; with no such request the
metric is undefined (NaN from the functions here, ``None`` in tables and JSON).

Examples:
    >>> from fairagents.bench import policies
    >>> sorted(policies.scenario(seconds=5)[1])
    ['text', 'vision']
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from rich.table import Table

from fairagents.cost import ModelProfile
from fairagents.engines.sim import SimEngine
from fairagents.identity import SLO, Agent, App, Modality
from fairagents.metrics import RequestRecord, jain_index, percentile
from fairagents.request import Outcome
from fairagents.simulation import SimResult, Workload, simulate

__all__ = ["esg", "goodput", "render", "run", "safi", "scenario", "slo_attainment"]

#: SAFI's weight of the SLO-miss rate (ExFairS eq. 4, α = 0.7).
SAFI_ALPHA = 0.7


def scenario(
    seconds: float = 60.0, seed: int = 0, *, max_tokens: Mapping[str, int] | None = None,
    kv: Literal["reserve", "paged"] = "reserve",
) -> tuple[Workload, dict[str, SimEngine]]:
    """The mixed-SLO overload workload and its two simulated engines.

    ``max_tokens`` maps an app to what its callers ask for (default: exactly what they
    use); ``kv`` is the engines' KV model (:class:`~fairagents.engines.SimEngine`).
    """
    asks = max_tokens or {}
    assistant = Agent("chat", App("assistant"), slo=SLO(ttft=1.0, tpot=0.1, e2e=10.0))
    reports = Agent("writer", App("reports"), slo=SLO(ttft=10.0, tpot=0.5, e2e=120.0))
    inspector = Agent("eye", App("inspector"), slo=SLO(ttft=2.0, e2e=15.0))
    flood = Agent("bulk", App("flood"), slo=SLO(ttft=10.0, tpot=0.5))
    work = Workload(seed=seed)
    for who, model, rate, prompt, output in [
        (assistant, "text", 4.0, (100, 400), (16, 96)),
        (reports, "text", 0.5, (200, 800), (400, 900)),
        (inspector, "vision", 3.0, (600, 1200), (16, 64)),
        (flood, "text", 7.0, (200, 600), (64, 256)),
    ]:
        work.poisson(who, model, rate=rate, until=seconds, prompt=prompt, output=output,
                     max_tokens=asks.get(who.app.name))
    engines = {
        "text": SimEngine(ModelProfile(d_model=4096, n_layers=32), max_running=16, kv_capacity=16_384, seed=seed,
                          kv=kv),
        "vision": SimEngine(ModelProfile(d_model=2048, n_layers=24, modality=Modality.VISION), max_running=8,
                            kv_capacity=16_384, seed=seed, kv=kv),
    }
    return work, engines


def slo_attainment(records: Sequence[RequestRecord]) -> float:
    """The share of requests with an SLO that finished and met every SLO they had (NaN: none had an SLO).

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.bench.policies import slo_attainment
        >>> from fairagents.metrics import RequestRecord
        >>> late = RequestRecord("r", "a", "t", "m", 0.0, 0.0, 1.5, 2.0, 10, 4, fa.Outcome.FINISHED, fa.SLO(ttft=1.0))
        >>> free = RequestRecord("s", "a", "t", "m", 0.0, 0.0, 1.5, 2.0, 10, 4, fa.Outcome.FINISHED)
        >>> slo_attainment([late, free]), slo_attainment([free])   # a request without an SLO is left out
        (0.0, nan)
    """
    met = [_met(r) for r in records if _checks(r.slo, "ttft", "tpot", "e2e")]
    return sum(met) / len(met) if met else math.nan


def goodput(records: Sequence[RequestRecord]) -> float:
    """The share of requests with a TTFT or TPOT SLO meeting both (H-MAS eq. 8–9); an unset one of the two is met.

    NaN when no request had a TTFT or TPOT SLO.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.bench.policies import goodput
        >>> from fairagents.metrics import RequestRecord
        >>> ok = RequestRecord("r", "a", "t", "m", 0.0, 0.0, 0.5, 2.0, 10, 4, fa.Outcome.FINISHED, fa.SLO(ttft=1.0))
        >>> late = RequestRecord("s", "a", "t", "m", 0.0, 0.0, 1.5, 2.0, 10, 4, fa.Outcome.FINISHED, fa.SLO(ttft=1.0))
        >>> goodput([ok, late])
        0.5
    """
    good = counted = 0
    for r in records:
        slo, ttft, tpot = r.slo, r.ttft, r.tpot
        if slo is None or not _checks(slo, "ttft", "tpot"):
            continue
        counted += 1
        ok = r.outcome is Outcome.FINISHED and ttft is not None
        good += ok and (slo.ttft is None or ttft <= slo.ttft) and (slo.tpot is None or tpot is None or tpot <= slo.tpot)
    return good / counted if counted else math.nan


def esg(records: Sequence[RequestRecord], *, w_input: float = 1.0, w_output: float = 2.0, alpha: float = 1.0) -> float:
    """Expected Service Gain (H-MAS eq. 6), normalised by the total base value (1 = everything in time).

    Over the requests with a time-to-last-token target (an end-to-end SLO, or TTFT and
    TPOT SLOs); NaN when no request had one.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.bench.policies import esg
        >>> from fairagents.metrics import RequestRecord
        >>> slow = RequestRecord("r", "a", "t", "m", 0.0, 0.0, 1.0, 8.0, 10, 5, fa.Outcome.FINISHED, fa.SLO(e2e=4.0))
        >>> esg([slow])   # twice as long as its SLO: half its value
        0.5
    """
    gained = total = 0.0
    for r in records:
        slo = r.slo
        if slo is None or (slo.e2e is None and (slo.ttft is None or slo.tpot is None)):
            continue  # no target to gain against
        base = w_input * r.prompt_tokens + w_output * r.output_tokens
        total += base
        if r.outcome is not Outcome.FINISHED:
            continue
        target = slo.e2e if slo.e2e is not None else slo.ttft + r.output_tokens * slo.tpot
        ttlt = r.finished - r.arrival
        gained += base if ttlt <= 0 else base * min(1.0, (target / ttlt) ** alpha)
    return gained / total if total else math.nan


def safi(result: SimResult, alpha: float = SAFI_ALPHA) -> dict[str, float]:
    """Each app's SAFI (ExFairS eq. 4): ``α · SLO-miss rate + (1 − α) · service / max service``.

    Examples:
        >>> from fairagents.bench.policies import safi, scenario
        >>> from fairagents.simulation import simulate
        >>> work, engines = scenario(seconds=5)
        >>> sorted(safi(simulate(work, "fcfs", engines)))
        ['assistant', 'flood', 'inspector', 'reports']
    """
    missed: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    for r in result.records:
        count[r.app] += 1
        missed[r.app] += not _met(r)
    service = {s.name: s.service for s in result.app_stats()}
    most = max(service.values(), default=0.0) or 1.0
    return {app: alpha * missed[app] / count[app] + (1 - alpha) * service.get(app, 0.0) / most for app in count}


def _met(r: RequestRecord) -> bool:
    """Whether ``r`` finished and met every SLO it had."""
    return r.outcome is Outcome.FINISHED and r.ttft is not None and (
        r.slo is None or r.slo.met(ttft=r.ttft, tpot=r.tpot, e2e=r.finished - r.arrival))


def _checks(slo: SLO | None, *objectives: str) -> bool:
    """Whether ``slo`` sets any of ``objectives`` (``"ttft"``, ``"tpot"``, ``"e2e"``)."""
    return slo is not None and any(getattr(slo, o) is not None for o in objectives)


def _row(result: SimResult) -> dict[str, float | None]:
    records = result.records
    ttfts = [r.ttft for r in records if r.ttft is not None]
    row = {
        "slo_attainment": slo_attainment(records),
        "jain_safi": jain_index(safi(result).values()),
        "gap_over_2u": result.max_app_gap() / (2 * result.bound),
        "ttft_p99": percentile(ttfts, 99),
        "goodput": goodput(records),
        "esg": esg(records),
    }
    return {k: v if math.isfinite(v) else None for k, v in row.items()}  # JSON has no NaN


def run(policies: Sequence[str] | None = None, seconds: float = 60.0, seed: int = 0) -> dict[str, Any]:
    """``{policy: {metric: value}}`` for every policy (default: all built-in) on the scenario."""
    from fairagents.policies import POLICIES

    names = list(policies) if policies else sorted(POLICIES)
    out: dict[str, Any] = {}
    for name in names:
        work, engines = scenario(seconds, seed)
        out[name] = _row(simulate(work, name, engines))
    return out


def render(result: dict[str, Any]) -> Table:
    """One table: a row per policy."""
    table = Table(title="Policies on a mixed-SLO overload (simulator: 4 apps on a text and a vision model)")
    for column in ("policy", "SLO attainment", "goodput", "Jain (SAFI)", "gap / 2U", "TTFT p99", "ESG"):
        table.add_column(column, justify="right")
    formats = (("slo_attainment", "{:.1%}"), ("goodput", "{:.1%}"), ("jain_safi", "{:.3f}"), ("gap_over_2u", "{:.2f}"),
               ("ttft_p99", "{:.2f} s"), ("esg", "{:.3f}"))
    for name, row in result.items():
        table.add_row(name, *("—" if row[key] is None else fmt.format(row[key]) for key, fmt in formats))
    return table
