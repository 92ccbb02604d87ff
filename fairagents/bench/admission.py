"""What Statera admission buys and risks, on the simulator: worst-case reservations against predicted bounds.

The workload is ``bench policies``' mixed-SLO overload (four apps on a text and a
vision model), with one change that makes the question real: callers ask for far more
``max_tokens`` than they use, as OpenAI clients usually do — 1,024 on the text model
(2,048 for ``reports``' long generations), 512 on the vision model. With worst-case
reservations (``prompt + max_tokens``) the text model's KV budget then binds before its
batch does; Statera (:mod:`fairagents.admission`) reserves ``prompt + l_upper``
instead and lets the two loops steer the limits.

The engines are :class:`~fairagents.engines.SimEngine` with ``kv="paged"``: a request
holds what it has generated, and when the running batch outgrows the KV cache the
newest request is preempted and recomputed later, as vLLM does. So the cost of
overcommitting is in the numbers (``preemptions``). Per policy and admission:

- ``slo_attainment``, ``goodput``, ``ttft_p99`` (seconds), ``gap_over_2u``, ``esg``: as
  in ``fairagents bench policies``;
- ``makespan``: virtual seconds until the last request finished (less is more throughput);
- ``preemptions``: requests the engines preempted;
- ``coverage``: the share of finished requests whose output stayed within their
  conformal bound (Statera's ``1 − ε`` target; ``None`` without Statera).

Examples:
    >>> from fairagents.bench import admission
    >>> work, engines = admission.scenario(seconds=5)
    >>> {r.max_tokens for r in work.requests if r.model == "vision"}, engines["text"].kv
    ({512}, 'paged')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from fairagents.admission import Statera
from fairagents.bench.policies import _row
from fairagents.cost import ModelProfile
from fairagents.engines.sim import SimEngine
from fairagents.identity import SLO, Agent, App, Modality
from fairagents.simulation import Workload, simulate

__all__ = ["ADMISSIONS", "render", "run", "scenario"]

#: Admission modes compared: worst-case reservations, and Statera.
ADMISSIONS = ("off", "statera")


def scenario(seconds: float = 60.0, seed: int = 0) -> tuple[Workload, dict[str, SimEngine]]:
    """``bench policies``' workload with callers asking for generous ``max_tokens``, on paged engines."""
    assistant = Agent("chat", App("assistant"), slo=SLO(ttft=1.0, tpot=0.1, e2e=10.0))
    reports = Agent("writer", App("reports"), slo=SLO(ttft=10.0, tpot=0.5, e2e=120.0))
    inspector = Agent("eye", App("inspector"), slo=SLO(ttft=2.0, e2e=15.0))
    flood = Agent("bulk", App("flood"), slo=SLO(ttft=10.0, tpot=0.5))
    work = Workload(seed=seed)
    work.poisson(assistant, "text", rate=4.0, until=seconds, prompt=(100, 400), output=(16, 96), max_tokens=1024)
    work.poisson(reports, "text", rate=0.5, until=seconds, prompt=(200, 800), output=(400, 900), max_tokens=2048)
    work.poisson(inspector, "vision", rate=3.0, until=seconds, prompt=(600, 1200), output=(16, 64), max_tokens=512)
    work.poisson(flood, "text", rate=7.0, until=seconds, prompt=(200, 600), output=(64, 256), max_tokens=1024)
    engines = {
        "text": SimEngine(ModelProfile(d_model=4096, n_layers=32), max_running=16, kv_capacity=16_384, seed=seed,
                          kv="paged"),
        "vision": SimEngine(ModelProfile(d_model=2048, n_layers=24, modality=Modality.VISION), max_running=8,
                            kv_capacity=16_384, seed=seed, kv="paged"),
    }
    return work, engines


def run(policies: Sequence[str] | None = None, seconds: float = 60.0, seed: int = 0) -> dict[str, Any]:
    """``{policy: {"off": {metric: value}, "statera": {...}}}`` (default policies: fcfs, hmfs, edf, sjf)."""
    out: dict[str, Any] = {}
    for name in policies or ("fcfs", "hmfs", "edf", "sjf"):
        out[name] = {}
        for mode in ADMISSIONS:
            work, engines = scenario(seconds, seed)
            controller = Statera() if mode == "statera" else None
            result = simulate(work, name, engines, admission=controller)
            row: dict[str, Any] = _row(result)
            row["makespan"] = result.end
            row["preemptions"] = result.preemptions
            row["coverage"] = controller.covered / controller.calibrated if controller and controller.calibrated else None
            out[name][mode] = row
    return out


def render(result: dict[str, Any]) -> Table:
    """One table: a row per policy and admission mode."""
    table = Table(title="Worst-case reservations vs Statera admission (simulator: callers ask 4-10x the tokens they use)")
    for column in ("policy", "admission", "SLO attainment", "goodput", "TTFT p99", "gap / 2U", "ESG", "makespan",
                   "preempted", "coverage"):
        table.add_column(column, justify="right")
    for name, modes in result.items():
        for mode, row in modes.items():
            coverage = "-" if row["coverage"] is None else f"{row['coverage']:.1%}"
            table.add_row(name, mode, f"{row['slo_attainment']:.1%}", f"{row['goodput']:.1%}",
                          f"{row['ttft_p99']:.2f} s", f"{row['gap_over_2u']:.2f}", f"{row['esg']:.3f}",
                          f"{row['makespan']:.1f} s", str(row["preemptions"]), coverage)
    return table
