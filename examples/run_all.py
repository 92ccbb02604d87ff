"""Run the driving, studio, research and concierge apps at once, sharing one arbiter, and print their shares.

Each app is its own tenant (``driving`` has weight 2, the others 1) and runs twice over
at the same time. The model takes only a few requests at once, so the apps queue, and
the arbiter decides whose request runs next: apps by their weights, then agents by
theirs inside each app. The table shows, per app and per agent within its app, the
share its weight entitles it to, the share of the service (unified tokens) it got, and
its waits. An app that asks for less than its share gets what it asks for: the others
use the rest.

Runs on the embedded tiny model (random weights: the text is gibberish, the serving real):

    python examples/run_all.py
"""

from __future__ import annotations

import asyncio

import concierge
import driving
import research
import studio
from rich.console import Console
from rich.table import Table

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine

APPS = [driving.drive, studio.create, research.research, concierge.plan]


def share_table(stats: fa.Stats) -> Table:
    """Per app, then per agent within its app: weight share, service share, unified tokens, waits."""
    table = Table(
        title="fair shares: apps of the pool, agents of their app",
        caption="weight: the share its weight entitles it to; served: the share of the service it got; "
        "service: unified tokens charged",
    )
    table.add_column("app / agent", no_wrap=True)
    for column in ("weight", "served", "service", "calls", "wait p50", "TTFT p50"):
        table.add_column(column, justify="right")

    def row(name: str, s: fa.ClientSnapshot) -> None:
        table.add_row(
            name, f"{s.weight_share:.0%}", f"{s.share:.0%}", f"{s.service:,.1f}", str(s.done),
            f"{s.wait_p50:.2f}s", f"{s.ttft_p50:.2f}s",
        )

    for app, snapshot in stats.apps.items():
        row(f"[bold]{app}[/]", snapshot)
        for key, agent in stats.agents.items():
            if key.startswith(f"{app}/"):
                row(f"  {key.removeprefix(f'{app}/')}", agent)
    return table


async def main(arbiter: fa.Arbiter | None = None, repeats: int = 2) -> fa.Stats:
    if arbiter is None:  # the embedded tiny model on an in-process vLLM engine
        arbiter = fa.Arbiter(in_flight=4)  # fewer slots than callers: the apps queue, and the weights decide
        arbiter.add_model("chat", VLLMEngine())
        async with arbiter:
            return await main(arbiter, repeats)
    await asyncio.gather(*(run(arbiter) for run in APPS for _ in range(repeats)))
    stats = arbiter.stats()
    Console().print(share_table(stats))
    return stats


if __name__ == "__main__":
    asyncio.run(main())
