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

Then the **tight-KV** case: an engine whose KV cache holds two requests of
:data:`TIGHT_TOKENS` output tokens, so the victim always has a request waiting, under
``vllm`` and the three ``default`` modes: each policy that orders by service must then
give the victim about the flood's service.

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

__all__ = ["DECISION_APPS", "MODES", "TIGHT_MODES", "decision_cost", "render", "run"]

MODES = ("vllm", "default", "default vtc", "default wfq", "arbiter")
#: The modes of the tight-KV case, where the victim always has a request waiting.
TIGHT_MODES = ("vllm", "default", "default vtc", "default wfq")
#: Output tokens of each request in the tight-KV case, whose KV cache holds two of them.
TIGHT_TOKENS = 64
_LIMITS: dict[str, dict[str, Any]] = {"vllm": {"in_flight": 65_536, "token_budget": None}, "default": {},
                                      "default vtc": {"policy": "vtc"}, "default wfq": {"policy": "wfq"},
                                      "arbiter": {"token_budget": "engine"}}
#: Numbers of apps at which the in-engine queue's decision cost is measured.
DECISION_APPS = (10, 100, 1_000, 10_000)


def decision_cost(apps: int, decisions: int = 20_000) -> float:
    """Microseconds for one pop and one add on a :class:`~fairagents.vllm.queue.FairQueue` of ``apps`` apps."""
    from vllm import SamplingParams
    from vllm.v1.request import Request as VllmRequest

    from fairagents.cost import ModelProfile
    from fairagents.request import Outcome, Request
    from fairagents.vllm.args import identity
    from fairagents.vllm.queue import Binding, FairQueue
    from fairagents.vllm.scheduler import own_policy

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
        queue.admit_scheduled(lambda rid: True)
        queue.new_step()
        seat.engine_progress("engine", [(request.request_id, 1)])
        seat.engine_end("engine", request.request_id, Outcome.FINISHED)
        queue.add_request(request)
    return (time.perf_counter() - start) / decisions * 1e6


def _summary(rows: list[dict[str, Any]], u: float) -> dict[str, Any]:
    """One mode's rounds, summed (a round without a first token, or without service, measured nothing)."""

    def measured(key: str) -> list[float]:
        return [r[key] for r in rows if r[key] is not None]

    ratios, p50s, p99s = measured("victim_over_flood"), measured("victim_ttft_p50_s"), measured("victim_ttft_p99_s")
    return {
        "tokens_per_s": sum(r["output_tokens"] for r in rows) / sum(r["seconds"] for r in rows),
        "gap_over_2u": max(r["max_gap"] for r in rows) / (2 * u),
        "victim_over_flood": sum(ratios) / len(ratios) if ratios else None,
        "victim_ttft_p50_s": percentile(p50s, 50) if p50s else None,
        "victim_ttft_p99_s": max(p99s, default=None),
        "preemptions": sum(r["preemptions"] for r in rows),
        "fair_preemptions": sum(r["fair_preemptions"] for r in rows),
        "recompute_tax": sum(r["recompute_tax"] for r in rows) / len(rows),
    }


async def _compare(engines: dict[str, Any], modes: tuple[str, ...], load: tuple[Any, ...],
                   rounds: int) -> tuple[dict[str, dict[str, Any]], float]:
    """Each of ``modes`` on its engine, alternating ``rounds`` times; per mode its summary, and ``U``."""
    rows: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    u = 0.0
    bounded_by = "arbiter" if "arbiter" in modes else "default"  # a mode whose U comes from the KV capacity
    for _ in range(rounds):
        for mode in modes:
            row, bound = await _pressure_point(engines[mode], _LIMITS[mode], *load)
            rows[mode].append(row)
            if mode == bounded_by:
                u = bound  # from the KV capacity: what the engine can really hold
    out = {mode: _summary(rows[mode], u) for mode in modes}
    for mode in modes:
        out[mode]["throughput_vs_vllm"] = out[mode]["tokens_per_s"] / out["vllm"]["tokens_per_s"]
    return out, u


async def _measure(flood_callers: int, victim_callers: int, seconds: float, rounds: int) -> dict[str, Any]:
    from fairagents.engines.vllm import VLLMEngine

    kv_bytes = pressure_kv_bytes(PRESSURE_TOKENS)
    tight_bytes = pressure_kv_bytes(TIGHT_TOKENS, holds=2)
    engines = {"vllm": VLLMEngine(None, kv_cache_bytes=kv_bytes, max_model_len=1024, scheduler="vllm"),
               "default": VLLMEngine(None, kv_cache_bytes=kv_bytes, max_model_len=1024)}
    tight = {"vllm": VLLMEngine(None, kv_cache_bytes=tight_bytes, max_model_len=256, scheduler="vllm"),
             "default": VLLMEngine(None, kv_cache_bytes=tight_bytes, max_model_len=256)}
    for group in (engines, tight):
        group["arbiter"] = group["vllm"]
        group["default vtc"] = group["default wfq"] = group["default"]
    started = [e for group in (engines, tight) for e in {id(e): e for e in group.values()}.values()]
    for engine in started:
        await engine.start()
    try:
        prompt = len(engines["vllm"].prepare_chat(MESSAGES).token_ids)
        for engine in started:
            await _direct(engine, 2, 1, 8)  # warm up
        out, u = await _compare(engines, MODES, (flood_callers, victim_callers, prompt, PRESSURE_TOKENS, seconds),
                                rounds)
        tight_out, tight_u = await _compare(tight, TIGHT_MODES,
                                            (flood_callers, victim_callers, prompt, TIGHT_TOKENS, seconds), rounds)
    finally:
        for engine in started:
            await engine.stop()
    return {"token_capacity": engines["vllm"].token_capacity, "prompt_tokens": prompt,
            "max_tokens": PRESSURE_TOKENS, "flood_callers": flood_callers, "victim_callers": victim_callers,
            "seconds": seconds, "rounds": rounds, "u": u, **out,
            "tight": {"token_capacity": tight["vllm"].token_capacity, "max_tokens": TIGHT_TOKENS, "u": tight_u,
                      **tight_out}}


def run(seconds: float = 15.0, rounds: int = 2, flood_callers: int = 30, victim_callers: int = 3) -> dict[str, Any]:
    """The modes on one real engine, the tight-KV case, then the in-engine queue's decision cost."""
    result = asyncio.run(_measure(flood_callers, victim_callers, seconds, rounds))
    result["decision_us"] = {str(n): decision_cost(n) for n in DECISION_APPS}
    return result


def _table(title: str, rows: dict[str, Any], modes: tuple[str, ...], u: float) -> Table:
    table = Table(title=title)
    for column in ("mode", "output tok/s", "vs vllm", "gap / 2U", "victim / flood service", "victim TTFT p50",
                   "victim TTFT p99", "preemptions (fair)", "recompute tax"):
        table.add_column(column, justify="right")
    for mode in modes:
        r = rows[mode]
        ratio = "—" if r["victim_over_flood"] is None else f"{r['victim_over_flood']:.3f}"
        table.add_row(mode, f"{r['tokens_per_s']:,.0f}", f"{r['throughput_vs_vllm']:.3f}", f"{r['gap_over_2u']:.2f}",
                      ratio, _ms(r["victim_ttft_p50_s"]), _ms(r["victim_ttft_p99_s"]),
                      f"{r.get('preemptions', 0)} ({r.get('fair_preemptions', 0)})", f"{r.get('recompute_tax', 0.0):.1%}")
    table.caption = f"U = {u:,.1f} unified tokens for every row (from the KV capacity)"
    return table


def render(result: dict[str, Any]) -> list[Table]:
    """Three tables: the modes side by side, the tight-KV case (when measured), and the decision cost."""
    callers = f"{result['victim_callers']} victim and {result['flood_callers']} flood callers"
    rounds = f"{result['rounds']} x {result['seconds']:g} s per mode"
    tables = [_table(f"Fair inside vLLM vs in front of it: KV cache of {result['token_capacity']:,} tokens, "
                     f"{callers}, {rounds}", result, MODES, result["u"])]
    tight = result.get("tight")
    if tight is not None:
        tables.append(_table(f"Tight KV: a cache of {tight['token_capacity']:,} tokens holds two requests of "
                             f"{tight['max_tokens']} output tokens, so the victim always waits; {callers}, {rounds}",
                             tight, TIGHT_MODES, tight["u"]))
    second = Table(title="In-engine queue: one pop + one add")
    second.add_column("apps", justify="right")
    second.add_column("µs", justify="right")
    for n, us in result["decision_us"].items():
        second.add_row(f"{int(n):,}", f"{us:.1f}")
    return [*tables, second]
