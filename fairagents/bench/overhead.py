"""What the arbiter costs, how its in-flight limit trades fairness for throughput, and what its token budget does.

Three measurements, the first two on one real engine, the third on a second one:

1. **Overhead.** The same closed-loop load (``callers`` concurrent callers sending
   requests of ``max_tokens`` output tokens back to back) goes straight to an engine
   with vLLM's own scheduler (``scheduler="vllm"``: plain vLLM) and through the arbiter
   with ``hmfs`` on the default path (a second engine, ``VLLMEngine()``: the policy inside
   it), alternating, ``rounds`` times each: output tokens/s of both, their ratio, and
   p50/p99 TTFT, counted from the caller's clock just before the call on both paths.
2. **In-flight sweep.** On the first engine (the arbiter's admission, ``scheduler="vllm"``),
   two apps of equal weight, 6 and 60 callers, through ``hmfs`` at each in-flight
   limit: throughput, the largest service gap between them as a fraction of ``2U``,
   each app's median TTFT, and the smallest limit within 3% of the best throughput.
3. **KV pressure.** A third engine (``scheduler="vllm"``) whose KV cache holds
   :data:`PRESSURE_HOLDS` requests (:func:`pressure_kv_bytes`); two apps, 3 and 30
   callers, backlogged for ``kv_seconds`` with the token budget and by request count
   alone (``token_budget=None``): throughput, the victim's service over the flood's,
   the largest gap while both had a request waiting for its first token (in the
   arbiter's queue or vLLM's) as a fraction of the token budget's ``2U``, and median
   TTFTs. ``bench vllm-scheduler`` sets the default path against both.

The Benchmarks page in the docs shows a run and explains the results.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from fairagents.runtime.arbiter import Arbiter
from fairagents.engines.base import Engine, GenerationParams
from fairagents.metrics import max_service_gap, percentile

__all__ = ["PRESSURE_HOLDS", "PRESSURE_TOKENS", "SWEEP", "pressure_kv_bytes", "render", "run"]

SWEEP = (2, 4, 8, 16, 32, 64)
MESSAGES = [{"role": "user", "content": "Summarise the state of the road network in three sentences."}]
PRESSURE_HOLDS = 8
"""Requests the KV pressure measurement's KV cache holds at once."""
PRESSURE_TOKENS = 120
"""Output tokens of each request under KV pressure: with the prompt, two KV blocks at its peak."""
_PROMPT_TOKENS = 43  # MESSAGES under the embedded model's chat template
_BLOCK_TOKENS = 128  # vLLM's KV block on CPU
_BLOCK_BYTES = 2 * 2 * 2 * 64 * 4 * _BLOCK_TOKENS  # K and V x 2 layers x 2 heads of 64 x float32 per token: 256 KiB
_ids = itertools.count()


async def _direct(engine: Engine, callers: int, per_caller: int, max_tokens: int) -> tuple[int, float, list[float]]:
    params = GenerationParams(max_tokens, ignore_eos=True, seed=0)
    ttfts: list[float] = []
    tokens = 0

    async def caller() -> None:
        nonlocal tokens
        for _ in range(per_caller):
            t0 = time.perf_counter()
            first = None
            prompt = engine.prepare_chat(MESSAGES)  # a server applies the chat template per request too
            async for delta in engine.generate(f"direct-{next(_ids)}", prompt, params):
                if first is None and delta.new_tokens:
                    first = time.perf_counter() - t0
                tokens += delta.new_tokens
            ttfts.append(first if first is not None else float("nan"))

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return tokens, time.perf_counter() - start, ttfts


async def _arbitrated(engine: Engine, callers: int, per_caller: int, max_tokens: int) -> tuple[int, float, list[float]]:
    arbiter = Arbiter(policy="hmfs")  # the default in-flight limit and token budget
    arbiter.add_model("m", engine)
    agents = [arbiter.app(f"app{i % 4}").agent(f"agent{i % 8}") for i in range(8)]
    await arbiter.start()
    ttfts: list[float] = []
    tokens = 0

    async def caller(i: int) -> None:
        nonlocal tokens
        for _ in range(per_caller):
            t0 = time.perf_counter()  # the same instant as the direct path: before the call prepares the prompt
            first = None
            async for delta in agents[i % 8].stream_chat("m", MESSAGES, max_tokens=max_tokens, ignore_eos=True, seed=0):
                if first is None and delta.new_tokens:
                    first = time.perf_counter() - t0
                tokens += delta.new_tokens
            ttfts.append(first if first is not None else float("nan"))

    start = time.perf_counter()
    try:
        await asyncio.gather(*(caller(i) for i in range(callers)))
    finally:
        elapsed = time.perf_counter() - start
        await arbiter.close(stop_engines=False)
    return tokens, elapsed, ttfts


async def _flood_and_victim(engine: Engine, policy: str = "hmfs", **limits: Any) -> tuple[Arbiter, Any, Any]:
    """A started arbiter (``hmfs`` unless told) over ``engine`` with two apps of equal weight; their agents."""
    arbiter = Arbiter(policy=policy, **limits)
    arbiter.add_model("m", engine)
    flood, victim = arbiter.app("flood").agent("bot"), arbiter.app("victim").agent("bot")
    await arbiter.start()
    return arbiter, flood, victim


async def _sweep_point(engine: Engine, in_flight: int, victim_callers: int, per_caller: int, max_tokens: int) -> dict[str, float]:
    arbiter, flood, victim = await _flood_and_victim(engine, in_flight=in_flight)
    tokens = 0

    async def caller(who: Any) -> None:
        nonlocal tokens
        for _ in range(per_caller):
            reply = await who.chat("m", MESSAGES, max_tokens=max_tokens, ignore_eos=True)
            tokens += reply.usage.completion_tokens

    start = time.perf_counter()
    try:
        await asyncio.gather(*(caller(flood) for _ in range(10 * victim_callers)), *(caller(victim) for _ in range(victim_callers)))
    finally:
        elapsed = time.perf_counter() - start
        await arbiter.close(stop_engines=False)
    records, charges = list(arbiter.ledger.records), list(arbiter.ledger.charges)
    bound = arbiter.bound(max(r.prompt_tokens for r in records) + max_tokens)
    gap = max_service_gap(records, charges, {"flood": 1.0, "victim": 1.0})

    def ttft(app: str) -> float:
        return percentile([r.ttft for r in records if r.app == app and r.ttft is not None], 50)

    return {
        "tokens_per_s": tokens / elapsed,
        "max_gap": gap,
        "gap_over_2u": gap / (2 * bound),
        "victim_ttft_p50_s": ttft("victim"),
        "flood_ttft_p50_s": ttft("flood"),
    }


async def _run(engine: Engine, default: Engine, callers: int, per_caller: int, max_tokens: int, rounds: int,
               sweep: Sequence[int], sweep_load: tuple[int, int, int] = (6, 2, 32)) -> dict[str, Any]:
    await engine.start()
    await default.start()
    await _direct(engine, callers, 1, 8)  # warm up
    await _direct(default, callers, 1, 8)
    direct = [0, 0.0, []]  # type: list[Any]
    through = [0, 0.0, []]  # type: list[Any]
    for _ in range(rounds):
        for acc, result in (
            (direct, await _direct(engine, callers, per_caller, max_tokens)),
            (through, await _arbitrated(default, callers, per_caller, max_tokens)),
        ):
            acc[0] += result[0]
            acc[1] += result[1]
            acc[2].extend(result[2])
    points = {str(limit): await _sweep_point(engine, limit, *sweep_load) for limit in sweep}
    best = max(p["tokens_per_s"] for p in points.values())
    chosen = min(int(k) for k, p in points.items() if p["tokens_per_s"] >= 0.97 * best)

    def summary(acc: list[Any]) -> dict[str, float]:
        return {"tokens_per_s": acc[0] / acc[1], "ttft_p50_s": percentile(acc[2], 50), "ttft_p99_s": percentile(acc[2], 99)}

    d, a = summary(direct), summary(through)
    return {
        "load": {"callers": callers, "requests": callers * per_caller * rounds, "max_tokens": max_tokens},
        "default_in_flight": _default_limit(engine),
        "default_max_num_seqs": _default_limit(default),
        "direct": d,
        "arbiter": a,
        "ratio": a["tokens_per_s"] / d["tokens_per_s"],
        "sweep": points,
        "smallest_limit_within_3pct_of_best": chosen,
    }


def pressure_kv_bytes(max_tokens: int = PRESSURE_TOKENS, holds: int = PRESSURE_HOLDS) -> int:
    """KV cache bytes for the embedded model to hold ``holds`` requests of ``MESSAGES`` + ``max_tokens`` at once.

    Each request reserves ``prompt + max_tokens`` rounded up to whole blocks; vLLM
    keeps one more block that no request holds (its null block).

    Examples:
        >>> pressure_kv_bytes(120) // 2**10   # 8 requests x 2 blocks + the null block, 256 KiB each
        4352
    """
    blocks = -(-(_PROMPT_TOKENS + max_tokens) // _BLOCK_TOKENS)
    return (holds * blocks + 1) * _BLOCK_BYTES


async def _pressure_point(
    engine: Engine, limits: dict[str, Any], flood_callers: int, victim_callers: int, prompt: int,
    max_tokens: int, seconds: float,
) -> tuple[dict[str, Any], float]:
    """One admission mode (``limits``: the arbiter's) under KV pressure: its row, and ``U`` under its own limits."""
    arbiter, flood, victim = await _flood_and_victim(engine, **limits)
    tokens = 0

    async def caller(who: Any) -> None:
        nonlocal tokens
        while True:  # backlogged until cancelled; the request in flight then ends as cancelled
            async for delta in who.stream_chat("m", MESSAGES, max_tokens=max_tokens, ignore_eos=True):
                tokens += delta.new_tokens

    tasks = [asyncio.create_task(caller(flood)) for _ in range(flood_callers)]
    tasks += [asyncio.create_task(caller(victim)) for _ in range(victim_callers)]
    start, t0 = time.perf_counter(), arbiter.clock()
    try:
        await asyncio.sleep(seconds)
    finally:
        produced, elapsed, t1 = tokens, time.perf_counter() - start, arbiter.clock()  # the window only
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await arbiter.close(stop_engines=False)
    records, charges = list(arbiter.ledger.records), list(arbiter.ledger.charges)
    served = {"flood": 0.0, "victim": 0.0}
    for c in charges:
        if t0 <= c.time <= t1:
            served[c.app] += c.amount
    # A request waits until its first token, whether in the arbiter's queue or in vLLM's
    # (by request count, that is where the queue is): the gap counts both alike.
    waited = [dataclasses.replace(r, dispatched=r.first_token) for r in records]
    gap = max_service_gap(waited, charges, {"flood": 1.0, "victim": 1.0})

    first_tokens = {app: [r.ttft for r in records if r.app == app and r.ttft is not None] for app in served}

    def ttft(app: str, q: float = 50) -> float | None:
        """``None`` when no request of ``app`` had its first token in the window (a result, on a busy machine)."""
        return percentile(first_tokens[app], q) if first_tokens[app] else None

    tally = arbiter.pool_policy.tally("m")  # what the engine preempted, when it schedules by the policy
    row = {
        "fair_preemptions": tally.fair_preemptions,
        "preemptions": tally.preemptions,
        "recompute_tax": tally.recompute_tax,
        "in_flight": arbiter.in_flight_limit("m"),
        "token_budget": arbiter.token_budget_of("m"),
        "tokens_per_s": produced / elapsed,
        "victim_over_flood": served["victim"] / served["flood"] if served["flood"] else None,
        "max_gap": gap,
        "victim_ttft_p50_s": ttft("victim"),
        "victim_ttft_p99_s": ttft("victim", 99),
        "flood_ttft_p50_s": ttft("flood"),
        "victim_first_tokens": len(first_tokens["victim"]),
        "flood_first_tokens": len(first_tokens["flood"]),
        "output_tokens": produced,
        "seconds": elapsed,
    }
    return row, arbiter.bound(prompt + max_tokens)


async def _kv_pressure(flood_callers: int, victim_callers: int, max_tokens: int, seconds: float) -> dict[str, Any]:
    """Token-budget against request-count admission on an engine whose KV holds a few requests."""
    from fairagents.engines.vllm import VLLMEngine

    kv_bytes = pressure_kv_bytes(max_tokens)
    engine = VLLMEngine(None, kv_cache_bytes=kv_bytes, max_model_len=1024, scheduler="vllm")
    await engine.start()
    try:
        prompt = len(engine.prepare_chat(MESSAGES).token_ids)
        await _direct(engine, 2, 1, 8)  # warm up
        load = (flood_callers, victim_callers, prompt, max_tokens, seconds)
        budgeted, u = await _pressure_point(engine, {"token_budget": "engine"}, *load)
        counted, _ = await _pressure_point(engine, {"token_budget": None}, *load)
    finally:
        await engine.stop()
    block, capacity = engine.kv_block_size, engine.token_capacity or 0
    reservation = -(-(prompt + max_tokens) // block) * block
    for row in (budgeted, counted):
        row["gap_over_2u"] = row["max_gap"] / (2 * u)  # one U for both: what the KV can really hold
    return {
        "kv_cache_bytes": kv_bytes,
        "token_capacity": engine.token_capacity,
        "kv_block_size": engine.kv_block_size,
        "prompt_tokens": prompt,
        "max_tokens": max_tokens,
        "requests_held": capacity // reservation,
        "flood_callers": flood_callers,
        "victim_callers": victim_callers,
        "seconds": seconds,
        "u": u,
        "token_budget": budgeted,
        "request_count": counted,
    }


def _default_limit(engine: Engine) -> int:
    arbiter = Arbiter()
    arbiter.add_model("m", engine)
    return arbiter.in_flight_limit("m")


def run(
    model: str | None = None,
    callers: int = 32,
    per_caller: int = 3,
    max_tokens: int = 64,
    rounds: int = 2,
    sweep: Sequence[int] = SWEEP,
    kv_seconds: float = 20.0,
    kv_flood_callers: int = 30,
    kv_victim_callers: int = 3,
    sweep_load: tuple[int, int, int] = (6, 2, 32),
) -> dict[str, Any]:
    """Measure overhead and the in-flight sweep on a real vLLM engine (the embedded model by default),
    then KV pressure on a second engine (always the embedded model), ``kv_seconds`` per admission mode.

    ``sweep_load``: each sweep point's victim callers (the flood has ten times as many), requests per
    caller, and tokens per request.
    """
    from fairagents.engines.vllm import VLLMEngine

    length = 1024 if model is None else None
    engine = VLLMEngine(model, kv_cache_bytes=256 * 2**20, max_model_len=length, scheduler="vllm")
    default = VLLMEngine(model, kv_cache_bytes=256 * 2**20, max_model_len=length)

    async def main() -> dict[str, Any]:
        try:
            result = await _run(engine, default, callers, per_caller, max_tokens, rounds, sweep, sweep_load)
        finally:
            await engine.stop()
            await default.stop()
        result["kv_pressure"] = await _kv_pressure(kv_flood_callers, kv_victim_callers, PRESSURE_TOKENS, kv_seconds)
        return result

    return asyncio.run(main())


def render(result: dict[str, Any]) -> list[Table]:
    """Three tables: direct vs arbiter, the in-flight sweep, and KV pressure."""
    load = result["load"]
    first = Table(title=f"Arbiter overhead: {load['requests']} requests x {load['max_tokens']} tokens, "
                        f"{load['callers']} callers")
    for column in ("path", "output tok/s", "TTFT p50", "TTFT p99"):
        first.add_column(column, justify="right")
    for name, label in (("direct", "direct (plain vLLM)"), ("arbiter", "arbiter (default path: hmfs in the engine)")):
        r = result[name]
        first.add_row(label, f"{r['tokens_per_s']:,.0f}", f"{r['ttft_p50_s'] * 1e3:.0f} ms",
                      f"{r['ttft_p99_s'] * 1e3:.0f} ms")
    first.caption = f"ratio arbiter/direct = {result['ratio']:.3f}"
    second = Table(title="In-flight limit sweep (hmfs; the arbiter's admission, scheduler=\"vllm\"; two apps of "
                         "equal weight, 6 and 60 callers)")
    for column in ("limit", "output tok/s", "max service gap", "gap / 2U", "victim TTFT p50", "flood TTFT p50"):
        second.add_column(column, justify="right")
    for limit, p in result["sweep"].items():
        second.add_row(limit, f"{p['tokens_per_s']:,.0f}", f"{p['max_gap']:,.1f}", f"{p['gap_over_2u']:.3f}",
                       f"{p['victim_ttft_p50_s'] * 1e3:.0f} ms", f"{p['flood_ttft_p50_s'] * 1e3:.0f} ms")
    second.caption = f"smallest limit within 3% of the best throughput: {result['smallest_limit_within_3pct_of_best']}"
    kv = result["kv_pressure"]
    third = Table(title=f"KV pressure (hmfs; two apps of equal weight, {kv['victim_callers']} and {kv['flood_callers']} "
                        f"callers, {kv['seconds']:g} s each): KV cache of {kv['token_capacity']:,} tokens, "
                        f"{kv['requests_held']} requests of {kv['prompt_tokens']} + {kv['max_tokens']} tokens")
    for column in ("admission", "output tok/s", "victim / flood service", "max service gap", "gap / 2U",
                   "victim TTFT p50", "flood TTFT p50"):
        third.add_column(column, justify="right")
    for name, p in (("token budget", kv["token_budget"]), ("request count", kv["request_count"])):
        limits = f"in-flight {p['in_flight']}" + (f", {p['token_budget']:,} tokens" if p["token_budget"] is not None else "")
        ratio = "—" if p["victim_over_flood"] is None else f"{p['victim_over_flood']:.3f}"
        third.add_row(f"{name} ({limits})", f"{p['tokens_per_s']:,.0f}", ratio, f"{p['max_gap']:,.1f}",
                      f"{p['gap_over_2u']:.3f}", _ms(p["victim_ttft_p50_s"]), _ms(p["flood_ttft_p50_s"]))
    third.caption = (f"U = {kv['u']:,.1f} for both rows: the bound with the token budget, from the KV capacity "
                     "(what the engine can really hold); — : no first token (or no service) in the window")
    return [first, second, third]


def _ms(seconds: float | None) -> str:
    """Seconds as milliseconds, or "—" when nothing was measured."""
    return "—" if seconds is None else f"{seconds * 1e3:.0f} ms"
