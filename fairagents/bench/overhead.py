"""What the arbiter costs, and how its in-flight limit trades fairness for throughput.

Two measurements on one real engine, in one run:

1. **Overhead.** The same closed-loop load (``callers`` concurrent callers, each
   sending requests of ``max_tokens`` output tokens back to back) goes straight to
   the engine and through the arbiter with ``hmfs`` at the default in-flight limit,
   alternating, ``rounds`` times each. Reported: output tokens/s of both, their ratio
   (arbiter/direct, from the summed tokens and times), and p50/p99 TTFT of both.
2. **In-flight sweep.** Two apps of equal weight, 6 and 60 callers (two requests of 32
   tokens each), through ``hmfs`` at each limit: throughput; the largest service gap
   between the two while both waited in the arbiter, as a fraction of ``2U`` (``U``
   grows with the limit); and each app's median TTFT. A low limit keeps the order
   with the policy but starves the batch; past the engine's batch capacity the queue
   moves into the engine's FCFS order, where the arbiter's gap no longer shows but the
   small app's TTFT climbs to the flood's. The default limit is the engine's batch
   capacity (``max_num_seqs``); the table also names the smallest limit within 3% of
   the best throughput.

Examples:
    >>> from fairagents.bench import overhead
    >>> overhead.SWEEP
    (2, 4, 8, 16, 32, 64)
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from fairagents.arbiter import Arbiter
from fairagents.engines.base import Engine, GenerationParams
from fairagents.metrics import max_service_gap, percentile

__all__ = ["SWEEP", "render", "run"]

SWEEP = (2, 4, 8, 16, 32, 64)
MESSAGES = [{"role": "user", "content": "Summarise the state of the road network in three sentences."}]
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
    arbiter = Arbiter(policy="hmfs")  # the default in-flight limit
    arbiter.add_model("m", engine)
    agents = [arbiter.app(f"app{i % 4}").agent(f"agent{i % 8}") for i in range(8)]
    await arbiter.start()
    ttfts: list[float] = []
    tokens = 0

    async def caller(i: int) -> None:
        nonlocal tokens
        for _ in range(per_caller):
            reply = await agents[i % 8].chat("m", MESSAGES, max_tokens=max_tokens, ignore_eos=True, seed=0)
            tokens += reply.usage.completion_tokens
            ttfts.append(reply.timing.ttft if reply.timing.ttft is not None else float("nan"))

    start = time.perf_counter()
    try:
        await asyncio.gather(*(caller(i) for i in range(callers)))
    finally:
        elapsed = time.perf_counter() - start
        await arbiter.close(stop_engines=False)
    return tokens, elapsed, ttfts


async def _sweep_point(engine: Engine, in_flight: int, victim_callers: int, per_caller: int, max_tokens: int) -> dict[str, float]:
    arbiter = Arbiter(policy="hmfs", in_flight=in_flight)
    arbiter.add_model("m", engine)
    flood, victim = arbiter.app("flood").agent("bot"), arbiter.app("victim").agent("bot")
    await arbiter.start()
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


async def _run(engine: Engine, callers: int, per_caller: int, max_tokens: int, rounds: int, sweep: Sequence[int]) -> dict[str, Any]:
    await engine.start()
    await _direct(engine, callers, 1, 8)  # warm up
    direct = [0, 0.0, []]  # type: list[Any]
    through = [0, 0.0, []]  # type: list[Any]
    for _ in range(rounds):
        for acc, result in (
            (direct, await _direct(engine, callers, per_caller, max_tokens)),
            (through, await _arbitrated(engine, callers, per_caller, max_tokens)),
        ):
            acc[0] += result[0]
            acc[1] += result[1]
            acc[2].extend(result[2])
    points = {str(limit): await _sweep_point(engine, limit, 6, 2, 32) for limit in sweep}
    best = max(p["tokens_per_s"] for p in points.values())
    chosen = min(int(k) for k, p in points.items() if p["tokens_per_s"] >= 0.97 * best)

    def summary(acc: list[Any]) -> dict[str, float]:
        return {"tokens_per_s": acc[0] / acc[1], "ttft_p50_s": percentile(acc[2], 50), "ttft_p99_s": percentile(acc[2], 99)}

    d, a = summary(direct), summary(through)
    return {
        "load": {"callers": callers, "requests": callers * per_caller * rounds, "max_tokens": max_tokens},
        "default_in_flight": _default_limit(engine),
        "direct": d,
        "arbiter": a,
        "ratio": a["tokens_per_s"] / d["tokens_per_s"],
        "sweep": points,
        "smallest_limit_within_3pct_of_best": chosen,
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
) -> dict[str, Any]:
    """Measure overhead and the in-flight sweep on a real vLLM engine (the embedded model by default)."""
    from fairagents.engines.vllm import VLLMEngine

    engine = VLLMEngine(model, kv_cache_bytes=256 * 2**20, max_model_len=1024 if model is None else None)

    async def main() -> dict[str, Any]:
        try:
            return await _run(engine, callers, per_caller, max_tokens, rounds, sweep)
        finally:
            await engine.stop()

    return asyncio.run(main())


def render(result: dict[str, Any]) -> list[Table]:
    """Two tables: direct vs arbiter, and the in-flight sweep."""
    load = result["load"]
    first = Table(title=f"Arbiter overhead: {load['requests']} requests x {load['max_tokens']} tokens, "
                        f"{load['callers']} callers, in-flight limit {result['default_in_flight']}")
    for column in ("path", "output tok/s", "TTFT p50", "TTFT p99"):
        first.add_column(column, justify="right")
    for name in ("direct", "arbiter"):
        r = result[name]
        first.add_row(name, f"{r['tokens_per_s']:,.0f}", f"{r['ttft_p50_s'] * 1e3:.0f} ms", f"{r['ttft_p99_s'] * 1e3:.0f} ms")
    first.caption = f"ratio arbiter/direct = {result['ratio']:.3f}"
    second = Table(title="In-flight limit sweep (hmfs; two apps of equal weight, 6 and 60 callers)")
    for column in ("limit", "output tok/s", "max service gap", "gap / 2U", "victim TTFT p50", "flood TTFT p50"):
        second.add_column(column, justify="right")
    for limit, p in result["sweep"].items():
        second.add_row(limit, f"{p['tokens_per_s']:,.0f}", f"{p['max_gap']:,.1f}", f"{p['gap_over_2u']:.3f}",
                       f"{p['victim_ttft_p50_s'] * 1e3:.0f} ms", f"{p['flood_ttft_p50_s'] * 1e3:.0f} ms")
    second.caption = f"smallest limit within 3% of the best throughput: {result['smallest_limit_within_3pct_of_best']}"
    return [first, second]
