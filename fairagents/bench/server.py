"""What the HTTP server costs: the same load through ``fairagents serve``'s API and through the in-process API.

One engine, one arbiter (``hmfs`` at the default in-flight limit) and one server in
this process, as ``fairagents serve`` runs them. The load is closed-loop: ``callers``
concurrent callers spread over four apps, each sending ``per_caller`` streaming chat
requests of ``max_tokens`` output tokens back to back.

- **in-process**: the callers are coroutines in this process calling
  ``stream_chat`` on the arbiter; TTFT is from the call to the first token.
- **HTTP**: the callers are in a separate process (an app's process), using the stock
  ``openai`` client with each app's API key, streaming; TTFT is from sending the
  request to the first content chunk. The client process shares the machine's cores.

The two alternate, ``rounds`` times each. Reported: requests/s, output tokens/s and
p50/p99 TTFT of both, and the ratio HTTP / in-process of requests/s.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from fairagents.runtime.arbiter import Arbiter
from fairagents.engines.base import Engine
from fairagents.metrics import percentile

__all__ = ["APPS", "render", "run"]

APPS = ("app0", "app1", "app2", "app3")
MESSAGES = [{"role": "user", "content": "Summarise the state of the road network in three sentences."}]


def _key(app: str) -> str:
    return f"sk-bench-{app}"


async def _in_process(arbiter: Arbiter, callers: int, per_caller: int, max_tokens: int) -> dict[str, Any]:
    agents = [arbiter.app(app, max_queued=None).agent("default") for app in APPS]
    ttfts: list[float] = []
    tokens = 0

    async def caller(i: int) -> None:
        nonlocal tokens
        for _ in range(per_caller):
            start, first = time.perf_counter(), None
            async for delta in agents[i % len(agents)].stream_chat("chat", MESSAGES, max_tokens=max_tokens, ignore_eos=True):
                if first is None and delta.new_tokens:
                    first = time.perf_counter() - start
                tokens += delta.new_tokens
            ttfts.append(first if first is not None else float("nan"))

    start = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    return {"requests": callers * per_caller, "tokens": tokens, "seconds": time.perf_counter() - start, "ttfts": ttfts}


async def _http(url: str, callers: int, per_caller: int, max_tokens: int) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fairagents.bench.server", url, str(callers), str(per_caller), str(max_tokens),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    ready = await process.stdout.readline()
    if ready.strip() != b"ready":
        await process.wait()
        raise RuntimeError(f"the HTTP client process did not start (exit status {process.returncode})")
    out, _ = await process.communicate(b"go\n")  # its clients are made: time the load only
    if process.returncode != 0:
        raise RuntimeError(f"the HTTP client process failed (exit status {process.returncode})")
    return json.loads(out)  # type: ignore[no-any-return]


async def _client(url: str, callers: int, per_caller: int, max_tokens: int) -> dict[str, Any]:
    """The HTTP side, in its own process: one stock openai client per app."""
    import openai

    clients = [openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=_key(app), max_retries=0, timeout=600) for app in APPS]
    ttfts: list[float] = []
    tokens = 0

    async def caller(i: int) -> None:
        nonlocal tokens
        for _ in range(per_caller):
            start, first = time.perf_counter(), None
            stream = await clients[i % len(clients)].chat.completions.create(  # type: ignore[call-overload]
                model="chat", messages=MESSAGES, max_tokens=max_tokens, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            )
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - start
                if chunk.usage is not None:
                    tokens += chunk.usage.completion_tokens
            ttfts.append(first if first is not None else float("nan"))

    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    start = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    elapsed = time.perf_counter() - start
    for c in clients:
        await c.close()
    return {"requests": callers * per_caller, "tokens": tokens, "seconds": elapsed, "ttfts": ttfts}


def _summary(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    seconds = sum(r["seconds"] for r in runs)
    ttfts = [t for r in runs for t in r["ttfts"]]
    return {
        "requests_per_s": sum(r["requests"] for r in runs) / seconds,
        "tokens_per_s": sum(r["tokens"] for r in runs) / seconds,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
    }


async def _run(engine: Engine, callers: int, per_caller: int, max_tokens: int, rounds: int) -> dict[str, Any]:
    """Both paths on ``engine`` (started here if it is not), leaving the engine running."""
    from fairagents.server import Config, create_app, running

    arbiter = Arbiter(policy="hmfs")
    arbiter.add_model("chat", engine)
    config = Config.model_validate({"apps": {app: {"api_key": _key(app), "max_queued": None} for app in APPS}})
    app = create_app(arbiter, config)
    await arbiter.start()
    try:
        async with running(app) as url:
            await _in_process(arbiter, min(callers, 8), 1, 8)  # warm up both paths
            await _http(url, min(callers, 8), 1, 8)
            local, remote = [], []
            for _ in range(rounds):
                local.append(await _in_process(arbiter, callers, per_caller, max_tokens))
                remote.append(await _http(url, callers, per_caller, max_tokens))
    finally:
        await arbiter.close(stop_engines=False)
    inside, http = _summary(local), _summary(remote)
    return {
        "load": {"callers": callers, "requests": callers * per_caller * rounds, "max_tokens": max_tokens},
        "in_flight": arbiter.in_flight_limit("chat"),
        "in_process": inside,
        "http": http,
        "ratio": http["requests_per_s"] / inside["requests_per_s"],
    }


def run(
    model: str | None = None, callers: int = 32, per_caller: int = 4, max_tokens: int = 64, rounds: int = 2
) -> dict[str, Any]:
    """Measure both paths on a real vLLM engine (the embedded model by default)."""
    if importlib.util.find_spec("openai") is None:
        raise RuntimeError("fairagents bench server drives the server with the openai client: pip install openai")
    from fairagents.engines.vllm import VLLMEngine

    engine = VLLMEngine(model, kv_cache_bytes=256 * 2**20, max_model_len=1024 if model is None else None)

    async def main() -> dict[str, Any]:
        try:
            return await _run(engine, callers, per_caller, max_tokens, rounds)
        finally:
            await engine.stop()

    return asyncio.run(main())


def render(result: dict[str, Any]) -> list[Table]:
    """One table: in-process vs HTTP."""
    load = result["load"]
    table = Table(title=f"HTTP server vs in-process API: {load['requests']} streaming requests x {load['max_tokens']} tokens "
                        f"per path, {load['callers']} callers, in-flight limit {result['in_flight']}")
    for column in ("path", "requests/s", "output tok/s", "TTFT p50", "TTFT p99"):
        table.add_column(column, justify="right")
    for name, label in (("in_process", "in-process"), ("http", "HTTP (openai client)")):
        r = result[name]
        table.add_row(label, f"{r['requests_per_s']:,.1f}", f"{r['tokens_per_s']:,.0f}",
                      f"{r['ttft_p50_s'] * 1e3:.0f} ms", f"{r['ttft_p99_s'] * 1e3:.0f} ms")
    table.caption = f"ratio HTTP/in-process requests/s = {result['ratio']:.3f}"
    return [table]


if __name__ == "__main__":  # the HTTP client process: URL CALLERS PER_CALLER MAX_TOKENS
    url, *numbers = sys.argv[1:]
    print(json.dumps(asyncio.run(_client(url, *map(int, numbers)))), flush=True)
