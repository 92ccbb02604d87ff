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
from fairagents.bench.policies import _row as mixed_slo_row
from fairagents.bench.policies import scenario as mixed_slo_scenario
from fairagents.engines.sim import SimEngine
from fairagents.simulation import Workload, simulate

__all__ = ["ADMISSIONS", "ASKS", "render", "run", "scenario"]

#: Admission modes compared: worst-case reservations, and Statera.
ADMISSIONS = ("off", "statera")


#: What each app's callers ask for as ``max_tokens`` (they use far less).
ASKS = {"assistant": 1024, "reports": 2048, "inspector": 512, "flood": 1024}


def scenario(seconds: float = 60.0, seed: int = 0) -> tuple[Workload, dict[str, SimEngine]]:
    """``bench policies``' workload with callers asking for generous ``max_tokens``, on paged engines."""
    return mixed_slo_scenario(seconds, seed, max_tokens=ASKS, kv="paged")


def run(policies: Sequence[str] | None = None, seconds: float = 60.0, seed: int = 0) -> dict[str, Any]:
    """``{policy: {"off": {metric: value}, "statera": {...}}}`` (default policies: fcfs, hmfs, edf, sjf)."""
    out: dict[str, Any] = {}
    for name in policies or ("fcfs", "hmfs", "edf", "sjf"):
        out[name] = {}
        for mode in ADMISSIONS:
            work, engines = scenario(seconds, seed)
            controller = Statera() if mode == "statera" else None
            result = simulate(work, name, engines, admission=controller)
            row: dict[str, Any] = mixed_slo_row(result)
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
