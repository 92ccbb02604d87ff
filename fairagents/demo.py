"""The main demo: several apps share one real vLLM engine, one of them flooding it.

Three apps of different weights run their agents concurrently against the embedded
tiny model (random weights: the text is gibberish; serving, batching, token counts
and timings are real). ``flood`` keeps ten times the requests of any other agent in
flight. The demo runs the same load under each policy, prints per app and per agent
the share of service against the share its weight entitles it to, with wait and TTFT
percentiles, and plots each app's service over time.

Examples:
    >>> from fairagents.demo import AGENTS
    >>> sorted({app for app, *_ in AGENTS})
    ['driving', 'flood', 'studio']
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fairagents.arbiter import Arbiter
from fairagents.engines.base import Engine
from fairagents.stats import ClientSnapshot, Stats

__all__ = ["AGENTS", "APPS", "main", "run"]

#: Requests the engine runs at once: fewer than the callers of any app's fair share, so every app stays
#: backlogged and its weight decides (the engine's own batch capacity would leave the light apps demand-limited).
IN_FLIGHT = 16
#: app → weight.
APPS = {"driving": 2.0, "studio": 1.0, "flood": 1.0}
#: (app, agent, agent weight, concurrent callers, max_tokens, prompt).
AGENTS = [
    ("driving", "planner", 2.0, 6, 48, "Plan a safe route from the depot to the harbour avoiding the closed bridge."),
    ("driving", "perception", 1.0, 6, 24, "Describe the obstacles ahead: a cyclist, a parked van, a red light."),
    ("studio", "writer", 1.0, 6, 64, "Write the opening paragraph of a story about a lighthouse keeper."),
    ("studio", "critic", 1.0, 6, 32, "Critique this paragraph for pacing and imagery in two sentences."),
    ("flood", "chatty", 1.0, 60, 32, "Tell me something. Anything. Then tell me more."),
]


async def run(
    engine: Engine, policy: str, seconds: float, in_flight: int | None = None
) -> tuple[Stats, list[tuple[float, str, str, float]]]:
    """Run the demo load for ``seconds`` under ``policy``; stats and (seconds, app, agent, service) charges."""
    arbiter = Arbiter(policy=policy, **({"in_flight": in_flight} if in_flight else {}))
    arbiter.add_model("chat", engine)
    handles = {name: arbiter.app(name, weight=w) for name, w in APPS.items()}
    await arbiter.start()
    start = time.monotonic()
    deadline = start + seconds

    async def caller(app: str, agent: str, weight: float, max_tokens: int, prompt: str) -> None:
        who = handles[app].agent(agent, weight=weight)
        messages = [{"role": "user", "content": prompt}]
        while time.monotonic() < deadline:
            await who.chat("chat", messages, max_tokens=max_tokens)

    try:
        await asyncio.gather(
            *(caller(app, agent, w, max_tokens, prompt) for app, agent, w, n, max_tokens, prompt in AGENTS for _ in range(n))
        )
    finally:
        await arbiter.close(stop_engines=False)
    charges = [(c.time - start, c.app, c.agent, c.amount) for c in arbiter.ledger.charges]
    return arbiter.stats(), charges


def table(policy: str, stats: Stats, charges: list[tuple[float, str, str, float]], seconds: float) -> Table:
    """Per app and agent: weight share, share of the service delivered while the load ran, latencies."""
    served: dict[str, float] = defaultdict(float)
    for t, app, agent, amount in charges:
        if t <= seconds:  # after the deadline only the flood's leftovers drain
            served[app] += amount
            served[f"{app}/{agent}"] += amount
    total = sum(served[app] for app in stats.apps) or 1.0
    t = Table(title=f"policy {policy}")
    for column in ("app / agent", "weight", "served", "done", "wait p50", "wait p99", "TTFT p50", "TTFT p99"):
        t.add_column(column, justify="left" if column == "app / agent" else "right")
    for app, s in stats.apps.items():
        t.add_row(f"[bold]{app}[/]", *_cells(s, served[app] / total))
        for key, a in stats.agents.items():
            if key.startswith(f"{app}/"):
                t.add_row(f"  {key.split('/', 1)[1]}", *_cells(a, served[key] / (served[app] or 1.0)))
    return t


def _cells(c: ClientSnapshot, share: float) -> list[str]:
    return [f"{c.weight_share:.0%}", f"{share:.0%}", str(c.done), f"{c.wait_p50:.2f}s", f"{c.wait_p99:.2f}s",
            f"{c.ttft_p50:.2f}s", f"{c.ttft_p99:.2f}s"]


def plot(runs: dict[str, list[tuple[float, str, str, float]]], out: Path) -> Path:
    """Each app's cumulative service over time, one panel per policy, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), sharey=True, squeeze=False)
    for ax, (policy, charges) in zip(axes[0], runs.items(), strict=True):
        series: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
        totals: dict[str, float] = defaultdict(float)
        for t, app, _, amount in sorted(charges):
            totals[app] += amount
            series[app][0].append(t)
            series[app][1].append(totals[app])
        for app in APPS:
            xs, ys = series.get(app, ([], []))
            ax.plot(xs, ys, label=f"{app} (weight {APPS[app]:g})")
        ax.set_title(f"policy {policy}")
        ax.set_xlabel("seconds")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("service (unified tokens)")
    axes[0][-1].legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


async def _main(console: Console, policies: Sequence[str], seconds: float, out: Path, model: str | None) -> dict[str, Stats]:
    from fairagents.engines.vllm import VLLMEngine

    console.print(
        f"fairagents demo: {len(APPS)} apps, {len(AGENTS)} agents ('flood' keeps 10x the requests in flight) on a real "
        f"in-process vLLM engine serving {model or 'the embedded tiny model (random weights: gibberish text, real serving)'}; "
        f"{seconds:g} s per policy, {IN_FLIGHT} requests in flight."
    )
    engine = VLLMEngine(model, kv_cache_bytes=256 * 2**20, max_model_len=1024 if model is None else None)
    await engine.start()
    results, runs = {}, {}
    try:
        for policy in policies:
            stats, charges = await run(engine, policy, seconds, IN_FLIGHT)
            results[policy], runs[policy] = stats, charges
            console.print(table(policy, stats, charges, seconds))
    finally:
        await engine.stop()
    console.print(f"served: share of the service (unified tokens) delivered while the load ran; an agent's share "
                  f"is of its app's. weight: what the weights entitle it to. Each app's service over time: {plot(runs, out)}")
    return results


def main(
    console: Console,
    policies: Sequence[str] = ("fcfs", "hmfs"),
    seconds: float = 12.0,
    out: str | Path = "fairagents-demo.png",
    model: str | None = None,
) -> dict[str, Stats]:
    """Run the demo under each policy; print the tables and write the plot."""
    return asyncio.run(_main(console, policies, seconds, Path(out), model))
