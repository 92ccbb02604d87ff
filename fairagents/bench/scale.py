"""``fairagents bench scale``: several arbiters over one pool, on this machine and in the simulator.

**Real** (this machine): the embedded model on one in-process vLLM engine that every
arbiter sends to, and a real Redis (``--redis URL``; unset, a ``redis-server`` on
loopback is started for the run when one is installed). The engine takes ``slots``
requests at once, and ``heavy`` (weight 4) and ``light`` (weight 1) keep ``callers``
requests each in flight, so both stay backlogged. Four modes, each for ``seconds``:

- ``one door``: one arbiter, its own counters (the baseline);
- ``one door, redis``: one arbiter on shared counters — what they cost a request;
- ``two doors, redis``: ``heavy`` calls one arbiter, ``light`` the other, sharing counters;
- ``two doors, own``: the same, each arbiter keeping its own counters.

Reported: the weighted share (heavy's service over light's, from the arbiters' ledgers),
request latency p50/p99, syncs with Redis per request and a sync's round trip p50/p99.

**Simulated** (:mod:`fairagents.bench.scale_sim`): 64 replicas, 10,000 agents, 1–8
doors, with sync delay and staleness modelled: the largest service gap against its
bound ``2(U + S)``, Jain's index, slot use, dispatch and sync cost.

Examples:
    >>> from fairagents.bench import scale
    >>> result = scale.run(real=False, doors=[1, 2], replicas=2, slots_per_replica=2, agents=20, apps=4,
    ...                    sim_seconds=1.0)
    >>> [(row["doors"], row["shared"]) for row in result["simulated"]]
    [(1, False), (1, True), (2, True)]
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import tenacity
from rich.table import Table

from fairagents.bench.scale_sim import run_simulated
from fairagents.errors import InvalidParameterError
from fairagents.metrics import percentile

__all__ = ["render", "run"]

WEIGHTS = {"heavy": 4.0, "light": 1.0}
MODES = ("one door", "one door, redis", "two doors, redis", "two doors, own")
MSG = [{"role": "user", "content": "plan a route through the city"}]


def run(
    *,
    real: bool = True,
    simulated: bool = True,
    redis: str | None = None,
    seconds: float = 10.0,
    callers: int = 16,
    slots: int = 8,
    max_tokens: int = 16,
    doors: Sequence[int] = (1, 2, 4, 8),
    replicas: int = 64,
    slots_per_replica: int = 16,
    agents: int = 10_000,
    apps: int = 100,
    sim_seconds: float = 3.0,
    interval: float = 0.02,
    delay: float = 0.001,
    seed: int = 0,
) -> dict[str, Any]:
    """``{"real": [one dict per mode], "simulated": [one dict per row]}``, measured now."""
    if seconds <= 0 or callers < 1 or max_tokens < 1 or slots < 1:
        raise InvalidParameterError("seconds must be > 0; callers, slots and max_tokens ≥ 1")
    out: dict[str, Any] = {"machine": _machine()}
    if real:
        with _redis(redis) as url:
            out["real"] = asyncio.run(_real(url, seconds, callers, slots, max_tokens, interval))
    if simulated:
        rows = run_simulated(doors, replicas=replicas, slots_per_replica=slots_per_replica, agents=agents, apps=apps,
                             seconds=sim_seconds, interval=interval, delay=delay, seed=seed)
        out["simulated"] = [dataclasses.asdict(row) for row in rows]
    return out


def render(result: dict[str, Any]) -> list[Table]:
    """One table per part that ran."""
    tables = []
    if "real" in result:
        real = Table(title=f"Arbiters over one pool on this machine ({result['machine']}): heavy (weight 4) and "
                           "light (1), each door seeing one app in the two-door modes")
        for column in ("mode", "heavy : light", "requests", "latency p50", "p99", "syncs / request",
                       "sync round trip p50", "p99"):
            real.add_column(column, justify="right")
        for m in result["real"]:
            real.add_row(m["mode"], f"{m['share']:.2f} : 1", f"{m['requests']:,}", f"{m['latency_p50_ms']:.0f} ms",
                         f"{m['latency_p99_ms']:.0f} ms", _maybe(m["syncs_per_request"], "{:.2f}"),
                         _maybe(m["sync_p50_ms"], "{:.2f} ms"), _maybe(m["sync_p99_ms"], "{:.2f} ms"))
        tables.append(real)
    if "simulated" in result:
        sim = Table(title="Simulated: doors in front of one model on replicas (sync delay and staleness modelled)")
        for column in ("doors", "shared", "replicas x slots", "agents", "gap / bound", "Jain", "busy", "req/s",
                       "dispatch p50 / p99", "store step p50 / p99", "door per sync", "wall"):
            sim.add_column(column, justify="right")
        for r in result["simulated"]:
            sim.add_row(str(r["doors"]), "yes" if r["shared"] else "no", f"{r['replicas']} x {r['slots'] // r['replicas']}",
                        f"{r['agents']:,}", f"{r['ratio']:.4f}", f"{r['jain']:.3f}", f"{r['busy']:.2f}",
                        f"{r['throughput']:,.0f}", f"{r['dispatch_p50_us']:.0f} / {r['dispatch_p99_us']:.0f} µs",
                        _maybe(r["sync_p50_us"], "{:,.0f}") + " / " + _maybe(r["sync_p99_us"], "{:,.0f} µs"),
                        _maybe(r["door_sync_us"], "{:,.0f} µs"), f"{r['wall_s']:.1f} s")
        tables.append(sim)
    return tables


def _maybe(value: float | None, fmt: str) -> str:
    return "–" if value is None or value != value else fmt.format(value)


def _machine() -> str:
    import os

    return f"{os.cpu_count()} CPUs, {socket.gethostname()}"


@contextlib.contextmanager
def _redis(url: str | None) -> Iterator[str]:
    """``url``, or a redis-server started on loopback for the run (no persistence), stopped after."""
    if url is not None:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise InvalidParameterError("the real part needs Redis: pass --redis URL or install redis-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                 "--dir", folder], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_listening(port)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait()


def _wait_listening(port: int, timeout: float = 10.0) -> None:
    """Return once a server accepts connections on ``port`` of loopback; ``RuntimeError`` after ``timeout`` s."""
    retrying = tenacity.Retrying(stop=tenacity.stop_after_delay(timeout), wait=tenacity.wait_fixed(0.05),
                                 retry=tenacity.retry_if_exception_type(OSError))
    try:
        for attempt in retrying:
            with attempt, socket.create_connection(("127.0.0.1", port), timeout=0.2):
                pass
    except tenacity.RetryError as err:
        raise RuntimeError("redis-server did not start") from err.last_attempt.exception()


async def _real(url: str, seconds: float, callers: int, slots: int, max_tokens: int,
                interval: float) -> list[dict[str, Any]]:
    import fairagents as fa
    from fairagents.engines import VLLMEngine
    from fairagents.shared import RedisStore, SharedCounters

    engine = VLLMEngine()
    engine.shared_capacity = True  # every arbiter here sends to this one engine
    await engine.start()
    results = []
    try:
        for n, mode in enumerate(MODES):
            two, shared = mode.startswith("two"), "redis" in mode
            namespace = f"bench-{time.time_ns()}-{n}"
            arbiters = []
            for door in range(2 if two else 1):
                counters = SharedCounters(RedisStore(url, namespace=namespace), door=f"door-{door}",
                                          interval=interval) if shared else None
                arbiter = fa.Arbiter(counters=counters)
                arbiter.add_model("chat", engine, in_flight=slots)  # fewer slots than callers: the apps queue
                for app, weight in WEIGHTS.items():
                    arbiter.app(app, weight=weight)
                arbiters.append(arbiter)
            for arbiter in arbiters:
                await arbiter.start()
            try:
                doors = {"heavy": arbiters[0], "light": arbiters[-1]}
                results.append(await _measure(mode, doors, arbiters, seconds, callers, max_tokens))
            finally:
                for arbiter in arbiters:
                    await arbiter.close(stop_engines=False)
    finally:
        await engine.stop()
    return results


async def _measure(mode: str, doors: dict[str, Any], arbiters: list[Any], seconds: float, callers: int,
                   max_tokens: int) -> dict[str, Any]:
    latencies: list[float] = []
    stop = False

    async def call(app: str) -> None:
        who = doors[app].app(app, weight=WEIGHTS[app]).agent("bot")
        while not stop:
            start = time.monotonic()
            await who.chat("chat", MSG, max_tokens=max_tokens, ignore_eos=True)
            latencies.append(time.monotonic() - start)

    def service() -> dict[str, float]:
        out = dict.fromkeys(WEIGHTS, 0.0)
        for arbiter in arbiters:
            for app, snap in arbiter.stats().apps.items():
                out[app] += snap.service
        return out

    tasks = [asyncio.create_task(call(app)) for app in WEIGHTS for _ in range(callers)]
    await asyncio.sleep(min(2.0, seconds / 4))  # warm up
    before, measured_from = service(), len(latencies)
    syncs_before = sum(a.counters.syncs for a in arbiters if a.counters is not None)
    await asyncio.sleep(seconds)
    after, window = service(), latencies[measured_from:]
    syncs = sum(a.counters.syncs for a in arbiters if a.counters is not None) - syncs_before
    trips = [t for a in arbiters if a.counters is not None for t in a.counters.round_trips]
    stop = True
    await asyncio.gather(*tasks)
    shared = any(a.counters is not None for a in arbiters)
    return {
        "mode": mode,
        "share": (after["heavy"] - before["heavy"]) / max(after["light"] - before["light"], 1e-9),
        "requests": len(window),
        "latency_p50_ms": 1000 * percentile(window, 50),
        "latency_p99_ms": 1000 * percentile(window, 99),
        "syncs_per_request": syncs / max(len(window), 1) if shared else None,
        "sync_p50_ms": 1000 * percentile(trips, 50) if trips else None,
        "sync_p99_ms": 1000 * percentile(trips, 99) if trips else None,
    }
