"""What one app's flood does to another app's latency, through the HTTP server.

One real vLLM engine behind ``fairagents serve``'s app, in this process. Two client
processes, each with its own apps' API key, use the stock ``openai`` client:

- the **victim** app sends one short chat request at a time (``victim_tokens`` output
  tokens) for ``seconds``, and reports each request's latency (send to last byte); in
  two more runs (idle, and the flood that ignores ``Retry-After``), each request is a
  tool call, ``tool_choice="required"``, the kind of request agents send most, whose
  grammar vLLM compiles before it may run;
- the **flood** app runs ``flood_clients`` concurrent clients, each sending long
  requests (``flood_tokens`` output tokens) back to back. Its queue is bounded
  (``flood_queue``), so past it the server answers 429 with ``Retry-After``. In one
  run the flood **honours** ``Retry-After`` (it sleeps that long); in the other it
  **ignores** it and retries at once.

Each flood runs twice on the default path (``hmfs`` inside the engine, with fair
preemption): without a per-app cap, and with ``max_in_flight_share = share`` (the
flood may hold at most that share of the model's batch). The flood that ignores
``Retry-After`` runs once more without a cap under ``fcfs``, the order plain vLLM
serves in, for its throughput. The victim's latency with no flood is the baseline.
``in_flight`` sets the model's in-flight limit (for ``scheduler="vllm"`` engines).

Reported per run: the victim's p50 and p99 latency and their ratio to the idle
baseline; its p99 time to first token (from the arbiter's records) and how far above
the idle one it is, in the flood's time per output token (one engine step of the
flood's batch): the steps a quiet request waits for its turn; the flood's completed
requests/s, output tokens/s and 429s/s; and the engine's fair preemptions and
recompute tax (recomputed tokens over all prefilled ones).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from typing import Any

from rich.table import Table

from fairagents.runtime.arbiter import Arbiter
from fairagents.engines.base import Engine, capabilities
from fairagents.metrics import percentile
from fairagents.request import Outcome

__all__ = ["FLOODS", "render", "run"]

#: Flood kinds: name → how the flood treats a 429 (``None``: no flood).
FLOODS: list[tuple[str, str | None]] = [("idle", None), ("honours Retry-After", "honour"), ("ignores Retry-After", "ignore")]
MESSAGES = [{"role": "user", "content": "Summarise the state of the road network in three sentences."}]
#: The victim's tool, for its tool-call runs (``tool_choice="required"``).
TOOLS = [{"type": "function", "function": {"name": "search", "description": "Search the road network.",
                                           "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                                          "required": ["query"]}}}]
#: What the victim sends: plain chats, or tool calls.
CALLS = ("chat", "tool calls")
VICTIM, FLOOD = "victim", "flood"


def _key(app: str) -> str:
    return f"sk-bench-{app}"


async def _victim(url: str, seconds: float, max_tokens: int, calls: str = "chat") -> dict[str, Any]:
    """The well-behaved app, in its own process: one request at a time for ``seconds`` (chats or tool calls)."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=_key(VICTIM), max_retries=0, timeout=600)
    latencies: list[float] = []
    failed = 0
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        kind: dict[str, Any] = ({"tools": TOOLS, "tool_choice": "required"} if calls == "tool calls"
                                else {"extra_body": {"ignore_eos": True}})
        try:
            await client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=max_tokens,  # type: ignore[arg-type]
                                                 **kind)
        except openai.APIError:
            failed += 1
            continue
        latencies.append(time.perf_counter() - start)
    await client.close()
    return {"latencies": latencies, "failed": failed}


async def _flood(url: str, clients: int, max_tokens: int, mode: str) -> dict[str, Any]:
    """The flooding app, in its own process: ``clients`` loops until told to stop on stdin."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=_key(FLOOD), max_retries=0, timeout=600)
    done = refused = 0
    stop = asyncio.Event()

    async def loop() -> None:
        nonlocal done, refused
        while not stop.is_set():
            try:
                await client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=max_tokens,  # type: ignore[arg-type]
                                                     extra_body={"ignore_eos": True})
                done += 1
            except openai.RateLimitError as err:
                refused += 1
                wait = float(err.response.headers.get("retry-after-ms", "1000")) / 1000
                await asyncio.sleep(wait if mode == "honour" else 0)
            except openai.APIError:
                await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(loop()) for _ in range(clients)]
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # go
    start = time.perf_counter()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # stop
    elapsed = time.perf_counter() - start
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()
    return {"done": done, "refused": refused, "seconds": elapsed}


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fairagents.bench.isolation", *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    if (await process.stdout.readline()).strip() != b"ready":
        await process.wait()
        raise RuntimeError(f"a client process of the benchmark did not start (exit status {process.returncode})")
    return process


async def _tell(process: asyncio.subprocess.Process) -> None:
    assert process.stdin is not None
    process.stdin.write(b"go\n")
    await process.stdin.drain()


async def _one(engine: Engine, share: float | None, mode: str | None, *, seconds: float, victim_tokens: int,
               flood_clients: int, flood_tokens: int, flood_queue: int, in_flight: int | None,
               policy: str = "hmfs", calls: str = "chat") -> dict[str, Any]:
    from fairagents.server import Config, create_app, running

    arbiter = Arbiter(policy=policy, max_in_flight_share=share, in_flight=in_flight)
    arbiter.add_model("chat", engine)
    apps = {VICTIM: {"api_key": _key(VICTIM)}, FLOOD: {"api_key": _key(FLOOD), "max_queued": flood_queue}}
    app = create_app(arbiter, Config.model_validate({"apps": apps, "server": {"preprocess_queue_per_app": None}}))
    await arbiter.start()
    try:
        async with running(app) as url:
            flood = None
            if mode is not None:
                flood = await _spawn("flood", url, str(flood_clients), str(flood_tokens), mode)
                await _tell(flood)
                # the flood fills the model first, while the victim's process starts (it waits for its go)
                victim, _ = await asyncio.gather(_spawn("victim", url, str(seconds), str(victim_tokens), calls),
                                                 asyncio.sleep(min(2.0, seconds)))
            else:
                victim = await _spawn("victim", url, str(seconds), str(victim_tokens), calls)
            await _tell(victim)
            out, _ = await victim.communicate()
            measured = json.loads(out)
            if flood is not None:
                await _tell(flood)  # stop
                flood_out, _ = await flood.communicate()
                measured["flood"] = json.loads(flood_out)
    finally:
        await arbiter.close(timeout=0, stop_engines=False)
    latencies = measured["latencies"]
    records = [r for r in arbiter.ledger.records if r.outcome is Outcome.FINISHED]
    ttfts = [r.ttft for r in records if r.app == VICTIM and r.ttft is not None]
    tpots = [r.tpot for r in records if r.app == FLOOD and r.tpot is not None]
    tally = arbiter.pool_policy.tally("chat")
    row: dict[str, Any] = {
        "policy": policy, "share": share, "flood": mode, "calls": calls, "victim_requests": len(latencies),
        "victim_failed": measured["failed"], "victim_p50_s": percentile(latencies, 50),
        "victim_p99_s": percentile(latencies, 99), "victim_ttft_p99_s": percentile(ttfts, 99) if ttfts else None,
        "flood_tpot_s": percentile(tpots, 50) if tpots else None, "fair_preemptions": tally.fair_preemptions,
        "preemptions": tally.preemptions, "recompute_tax": tally.recompute_tax,
    }
    if "flood" in measured:
        f = measured["flood"]
        row |= {"flood_done_per_s": f["done"] / f["seconds"], "flood_429_per_s": f["refused"] / f["seconds"],
                "flood_tokens_per_s": f["done"] * flood_tokens / f["seconds"]}
    return row


async def _run(engine: Engine, options: dict[str, Any], share: float) -> dict[str, Any]:
    await engine.start()
    rows = [await _one(engine, None, None, **options)]
    for _, mode in FLOODS[1:]:
        for cap in (None, share):
            rows.append(await _one(engine, cap, mode, **options))
    rows.append(await _one(engine, None, "ignore", **options, policy="fcfs"))
    rows.append(await _one(engine, None, None, **options, calls="tool calls"))
    rows.append(await _one(engine, None, "ignore", **options, calls="tool calls"))
    idles = {row["calls"]: row for row in rows if row["flood"] is None}
    for row in rows:
        if row["flood"] is None:
            continue
        idle = idles[row["calls"]]
        row["p50_over_idle"] = row["victim_p50_s"] / idle["victim_p50_s"]
        row["p99_over_idle"] = row["victim_p99_s"] / idle["victim_p99_s"]
        if row["victim_ttft_p99_s"] is not None and idle["victim_ttft_p99_s"] is not None and row["flood_tpot_s"]:
            row["ttft_steps"] = (row["victim_ttft_p99_s"] - idle["victim_ttft_p99_s"]) / row["flood_tpot_s"]
        else:
            row["ttft_steps"] = None
    in_flight = options["in_flight"] or capabilities(engine).max_num_seqs
    return {"load": options | {"share": share}, "in_flight": in_flight, "runs": rows}


def run(
    model: str | None = None, seconds: float = 10.0, victim_tokens: int = 16, flood_clients: int = 60,
    flood_tokens: int = 512, flood_queue: int = 8, share: float = 0.5, in_flight: int | None = None,
) -> dict[str, Any]:
    """Measure the victim's latency idle, and under each flood without and with the per-app cap."""
    if importlib.util.find_spec("openai") is None:
        raise RuntimeError("fairagents bench isolation drives the server with the openai client: pip install openai")
    from fairagents.engines.vllm import VLLMEngine

    engine = VLLMEngine(model, kv_cache_bytes=256 * 2**20, max_model_len=1024 if model is None else None)
    options = {"seconds": seconds, "victim_tokens": victim_tokens, "flood_clients": flood_clients,
               "flood_tokens": flood_tokens, "flood_queue": flood_queue, "in_flight": in_flight}

    async def main() -> dict[str, Any]:
        try:
            return await _run(engine, options, share)
        finally:
            await engine.stop()

    return asyncio.run(main())


def render(result: dict[str, Any]) -> list[Table]:
    """One table: the victim's latency per flood and cap."""
    load = result["load"]
    table = Table(title=f"Victim latency while another app floods: {load['flood_clients']} flood clients x "
                        f"{load['flood_tokens']} tokens vs one victim request at a time x {load['victim_tokens']} tokens "
                        f"({load['seconds']:.0f} s per run, in-flight limit {result['in_flight']})")
    for column in ("flood", "victim sends", "policy", "per-app cap", "victim p50", "victim p99", "p50 / idle", "p99 / idle",
                   "victim TTFT p99", "(TTFT p99 − idle) / flood TPOT", "flood done/s", "flood tok/s", "flood 429/s",
                   "fair preemptions", "recompute tax"):
        table.add_column(column, justify="right")
    names = dict((mode, name) for name, mode in FLOODS)
    for row in result["runs"]:
        flooded = row["flood"] is not None
        cap = "-" if not flooded else ("off" if row["share"] is None else f"{row['share']:.0%} of slots")
        steps = row.get("ttft_steps")
        table.add_row(
            names[row["flood"]], row.get("calls", "chat"), row.get("policy", "hmfs"), cap, f"{row['victim_p50_s'] * 1e3:.0f} ms",
            f"{row['victim_p99_s'] * 1e3:.0f} ms",
            f"{row['p50_over_idle']:.1f}x" if flooded else "-",
            f"{row['p99_over_idle']:.1f}x" if flooded else "-",
            "-" if row.get("victim_ttft_p99_s") is None else f"{row['victim_ttft_p99_s'] * 1e3:.0f} ms",
            f"{steps:.1f} steps" if flooded and steps is not None else "-",
            f"{row['flood_done_per_s']:.1f}" if flooded else "-",
            f"{row['flood_tokens_per_s']:,.0f}" if flooded else "-",
            f"{row['flood_429_per_s']:.1f}" if flooded else "-",
            str(row.get("fair_preemptions", "-")), f"{row.get('recompute_tax', 0.0):.1%}",
        )
    return [table]


if __name__ == "__main__":  # a client process: victim URL SECONDS TOKENS CALLS | flood URL CLIENTS TOKENS MODE
    role, url, *rest = sys.argv[1:]
    if role == "victim":
        result = asyncio.run(_victim(url, float(rest[0]), int(rest[1]), rest[2]))
    else:
        result = asyncio.run(_flood(url, int(rest[0]), int(rest[1]), rest[2]))
    print(json.dumps(result), flush=True)
