"""Fairness inside vLLM against fairness in front of it: one real engine under KV pressure, five ways.

The embedded model with a KV cache that holds a few requests (``bench overhead``'s KV
pressure set-up: :func:`~fairagents.bench.overhead.pressure_kv_bytes`), two apps of
equal weight — a flood of ``flood_callers`` and a victim of ``victim_callers``, each
caller sending requests back to back through an ``hmfs`` arbiter — for ``seconds`` per
mode, the modes alternating ``rounds`` times:

- ``vllm``: vLLM's own scheduler (FCFS, preempting the newest), handed everything
  (the arbiter's in-flight limit 65,536, no token budget): what serving without
  fairagents does;
- ``default``: the default path, the arbiter's ``hmfs`` inside the engine
  (``VLLMEngine()``, :class:`~fairagents.vllm.FairScheduler`), handed each request at
  once, with fair preemption;
- ``default vtc``, ``default wfq``: the same with the arbiter's policy ``vtc`` or
  ``wfq``, which preempt for fairness by their own comparison of two clients;
- ``arbiter``: vLLM's own scheduler behind the arbiter's token-budget admission
  (``VLLMEngine(scheduler="vllm")``): the arbiter keeps the queue and hands the
  engine what fits.

Reported per mode (summed over rounds): output tokens/s, and its ratio to ``vllm``; for
the default path, the engine's preemptions (those for fairness in brackets) and recompute
tax (recomputed tokens over all prefilled ones; vLLM's own scheduler keeps no such count);
the largest service gap between the two apps while both had a request waiting for its
first token (in the arbiter's queue or in vLLM's), over ``2U`` with ``U`` from the KV
capacity, the same for every mode; the victim's TTFT p50 and p99. A last table is the
in-engine queue's decision cost: one pop and one add on a queue of ``n`` apps, for
``n`` from 10 to 10,000 (:data:`DECISION_APPS`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rich.table import Table

from fairagents.bench.overhead import MESSAGES, PRESSURE_TOKENS, _direct, _ms, _pressure_point, pressure_kv_bytes
from fairagents.metrics import percentile

__all__ = ["DECISION_APPS", "MODES", "decision_cost", "render", "run"]

MODES = ("vllm", "default", "default vtc", "default wfq", "arbiter")
#: Numbers of apps at which the in-engine queue's decision cost is measured.
DECISION_APPS = (10, 100, 1_000, 10_000)
_HAND_EVERYTHING = {"in_flight": 65_536, "token_budget": None}


def decision_cost(apps: int, decisions: int = 20_000) -> float:
    """Microseconds for one pop and one add on a :class:`~fairagents.vllm.scheduler.FairQueue` of ``apps`` apps."""
    from vllm import SamplingParams
    from vllm.v1.request import Request as VllmRequest

    from fairagents.cost import ModelProfile
    from fairagents.request import Outcome, Request
    from fairagents.vllm.scheduler import Binding, FairQueue, identity, own_policy

    seat = own_policy()
    seat.register("engine", ModelProfile(d_model=4096, n_layers=1))
    queue = FairQueue(Binding(seat, "engine"), lambda r: Request(
        r.request_id, identity(r.sampling_params.extra_args), "engine", 16, 8, r.arrival_time))
    requests = [VllmRequest(f"r{i}", [1] * 16, SamplingParams(max_tokens=8, extra_args={"fairagents_app": f"a{i % apps}"}),
                            None, arrival_time=float(i)) for i in range(2 * apps)]
    for r in requests:
        queue.add_request(r)
    start = time.perf_counter()
    for _ in range(decisions):  # served (its prompt charged), one token out, ended, and back: the queue keeps its size
        request = queue.pop_request()
        seat.engine_progress("engine", [(request.request_id, 1)])
        seat.engine_end("engine", request.request_id, Outcome.FINISHED)
        queue.add_request(request)
    return (time.perf_counter() - start) / decisions * 1e6


async def _measure(flood_callers: int, victim_callers: int, seconds: float, rounds: int) -> dict[str, Any]:
    from fairagents.engines.vllm import VLLMEngine

    kv_bytes = pressure_kv_bytes(PRESSURE_TOKENS)
    engines = {"vllm": VLLMEngine(None, kv_cache_bytes=kv_bytes, max_model_len=1024, scheduler="vllm"),
               "default": VLLMEngine(None, kv_cache_bytes=kv_bytes, max_model_len=1024)}
    engines["arbiter"] = engines["vllm"]
    engines["default vtc"] = engines["default wfq"] = engines["default"]
    limits = {"vllm": _HAND_EVERYTHING, "default": {}, "default vtc": {"policy": "vtc"},
              "default wfq": {"policy": "wfq"}, "arbiter": {"token_budget": "engine"}}
    rows: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    u = 0.0
    for engine in {id(e): e for e in engines.values()}.values():
        await engine.start()
    try:
        prompt = len(engines["vllm"].prepare_chat(MESSAGES).token_ids)
        for engine in (engines["vllm"], engines["default"]):
            await _direct(engine, 2, 1, 8)  # warm up
        load = (flood_callers, victim_callers, prompt, PRESSURE_TOKENS, seconds)
        for _ in range(rounds):
            for mode in MODES:
                row, bound = await _pressure_point(engines[mode], limits[mode], *load)
                rows[mode].append(row)
                if mode == "arbiter":
                    u = bound  # from the KV capacity: what the engine can really hold
    finally:
        for engine in {id(e): e for e in engines.values()}.values():
            await engine.stop()
    out: dict[str, Any] = {"token_capacity": engines["vllm"].token_capacity, "prompt_tokens": prompt,
                           "max_tokens": PRESSURE_TOKENS, "flood_callers": flood_callers,
                           "victim_callers": victim_callers, "seconds": seconds, "rounds": rounds, "u": u}
    for mode in MODES:
        rs = rows[mode]

        def measured(key: str) -> list[float]:  # a round without a first token (or service) measured nothing
            return [r[key] for r in rs if r[key] is not None]

        ratios, p50s, p99s = measured("victim_over_flood"), measured("victim_ttft_p50_s"), measured("victim_ttft_p99_s")
        out[mode] = {
            "tokens_per_s": sum(r["output_tokens"] for r in rs) / sum(r["seconds"] for r in rs),
            "gap_over_2u": max(r["max_gap"] for r in rs) / (2 * u),
            "victim_over_flood": sum(ratios) / len(ratios) if ratios else None,
            "victim_ttft_p50_s": percentile(p50s, 50) if p50s else None,
            "victim_ttft_p99_s": max(p99s, default=None),
            "preemptions": sum(r["preemptions"] for r in rs),
            "fair_preemptions": sum(r["fair_preemptions"] for r in rs),
            "recompute_tax": sum(r["recompute_tax"] for r in rs) / len(rs),
        }
    for mode in MODES:
        out[mode]["throughput_vs_vllm"] = out[mode]["tokens_per_s"] / out["vllm"]["tokens_per_s"]
    return out


def run(seconds: float = 15.0, rounds: int = 2, flood_callers: int = 30, victim_callers: int = 3) -> dict[str, Any]:
    """The modes on one real engine, then the in-engine queue's decision cost."""
    result = asyncio.run(_measure(flood_callers, victim_callers, seconds, rounds))
    result["decision_us"] = {str(n): decision_cost(n) for n in DECISION_APPS}
    return result


def render(result: dict[str, Any]) -> list[Table]:
    """Two tables: the modes side by side, and the decision cost."""
    first = Table(title=f"Fair inside vLLM vs in front of it: KV cache of {result['token_capacity']:,} tokens, "
                        f"{result['victim_callers']} victim and {result['flood_callers']} flood callers, "
                        f"{result['rounds']} x {result['seconds']:g} s per mode")
    for column in ("mode", "output tok/s", "vs vllm", "gap / 2U", "victim / flood service", "victim TTFT p50",
                   "victim TTFT p99", "preemptions (fair)", "recompute tax"):
        first.add_column(column, justify="right")
    for mode in MODES:
        r = result[mode]
        ratio = "—" if r["victim_over_flood"] is None else f"{r['victim_over_flood']:.3f}"
        first.add_row(mode, f"{r['tokens_per_s']:,.0f}", f"{r['throughput_vs_vllm']:.3f}", f"{r['gap_over_2u']:.2f}",
                      ratio, _ms(r["victim_ttft_p50_s"]), _ms(r["victim_ttft_p99_s"]),
                      f"{r.get('preemptions', 0)} ({r.get('fair_preemptions', 0)})", f"{r.get('recompute_tax', 0.0):.1%}")
    first.caption = f"U = {result['u']:,.1f} unified tokens for every row (from the KV capacity)"
    second = Table(title="In-engine queue: one pop + one add")
    second.add_column("apps", justify="right")
    second.add_column("µs", justify="right")
    for n, us in result["decision_us"].items():
        second.add_row(f"{int(n):,}", f"{us:.1f}")
    return [first, second]
