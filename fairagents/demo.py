"""The main demo: three apps share a real multi-modal pool, one of them flooding it.

The pool is the embedded default (tiny models of random weights: text is gibberish,
images are noise; serving, batching, token counts and timings are real): ``chat``, an
LLM on vLLM; ``vision``, a vision-language model on vLLM; ``image``, a diffusion model
on diffusers. One policy orders all three, with one set of counters: the two vLLM
engines schedule inside themselves by it (the default path), the arbiter dispatches
the image model by it, and a denoising step, an image token and an LLM token are
charged in one currency (unified tokens), so an app's service on one model counts on
the others.

``driving`` (weight 2) plans on ``chat`` and looks at camera frames on ``vision``;
``studio`` writes on ``chat`` and illustrates on ``image``; ``flood`` keeps ten times the
requests of any other agent in flight on ``chat``. The demo runs the same load under
each policy, prints per app and per agent the share of service against the share its
weight entitles it to, with wait and TTFT percentiles and the unified tokens served in
all, and plots each app's service over time. Weights decide between apps that stay
backlogged where a queue forms (here the LLM's batch, which the flood keeps full): an app
whose callers are served as fast as they ask receives what it asks, and ``studio``'s
images count in its share, so under HMFS its writer waits on the LLM while the others
are owed service.

Examples:
    >>> from fairagents.demo import AGENTS
    >>> sorted({app for app, *_ in AGENTS}), sorted({model for _, _, _, _, model, *_ in AGENTS})
    (['driving', 'flood', 'studio'], ['chat', 'image', 'vision'])
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fairagents.runtime.arbiter import Arbiter
from fairagents.engines.base import Engine
from fairagents.images import to_png
from fairagents.policies.pooled import EngineTally
from fairagents.stats import ClientSnapshot, Stats

__all__ = ["AGENTS", "APPS", "main", "run", "run_async"]

#: app → weight.
APPS = {"driving": 2.0, "studio": 1.0, "flood": 1.0}
#: (app, agent, agent weight, concurrent callers, model, max_tokens, prompt).
AGENTS = [
    ("driving", "planner", 2.0, 6, "chat", 48, "Plan a safe route from the depot to the harbour avoiding the closed bridge."),
    ("driving", "perception", 1.0, 6, "vision", 24, "Describe the obstacles ahead in this camera frame."),
    ("studio", "writer", 1.0, 6, "chat", 64, "Write the opening paragraph of a story about a lighthouse keeper."),
    ("studio", "illustrator", 1.0, 2, "image", 0, "A lighthouse on a cliff at dusk, watercolour."),
    ("flood", "chatty", 1.0, 60, "chat", 32, "Tell me something. Anything. Then tell me more."),
]
#: Images the illustrator asks for: (width, height) and denoising steps.
IMAGE_SIZE, IMAGE_STEPS = (64, 64), 8


def camera_frame() -> bytes:
    """A synthetic road scene as PNG bytes (what ``perception`` sends with each question)."""
    from PIL import Image, ImageDraw

    frame = Image.new("RGB", (96, 64), (135, 190, 235))
    draw = ImageDraw.Draw(frame)
    draw.polygon([(0, 64), (96, 64), (60, 28), (36, 28)], fill=(90, 90, 90))
    draw.rectangle((70, 18, 76, 34), fill=(30, 30, 30))
    draw.ellipse((71, 19, 75, 23), fill=(230, 30, 30))
    draw.rectangle((40, 40, 52, 52), fill=(240, 240, 240))
    return to_png(frame)


async def run(
    engines: Mapping[str, Engine], policy: str, seconds: float
) -> tuple[Stats, list[tuple[float, str, str, float]], dict[str, EngineTally]]:
    """Run the demo load for ``seconds`` under ``policy`` on started ``engines`` (``chat``, ``vision``, ``image``).

    Returns the stats, the charges as (seconds since start, app, agent, unified tokens),
    and what each in-engine model preempted (:class:`~fairagents.policies.pooled.EngineTally`).
    """
    arbiter = Arbiter(policy=policy)
    for name, engine in engines.items():
        arbiter.add_model(name, engine)
    handles = {name: arbiter.app(name, weight=w) for name, w in APPS.items()}
    frame = camera_frame()
    await arbiter.start()
    start = time.monotonic()
    deadline = start + seconds

    async def caller(app: str, agent: str, weight: float, model: str, max_tokens: int, prompt: str) -> None:
        who = handles[app].agent(agent, weight=weight)
        while time.monotonic() < deadline:
            if model == "image":
                await who.generate_image(model, prompt, size=IMAGE_SIZE, steps=IMAGE_STEPS)
            elif model == "vision":
                content = [{"type": "image", "image": frame}, {"type": "text", "text": prompt}]
                await who.chat(model, [{"role": "user", "content": content}], max_tokens=max_tokens)
            else:
                await who.chat(model, [{"role": "user", "content": prompt}], max_tokens=max_tokens)

    try:
        await asyncio.gather(
            *(caller(app, agent, w, model, max_tokens, prompt)
              for app, agent, w, n, model, max_tokens, prompt in AGENTS for _ in range(n))
        )
    finally:
        await arbiter.close(stop_engines=False)
    charges = [(c.time - start, c.app, c.agent, c.amount) for c in arbiter.ledger.charges]
    return arbiter.stats(), charges, dict(arbiter.pool_policy.tallies)


def table(policy: str, stats: Stats, charges: list[tuple[float, str, str, float]], seconds: float,
          tallies: Mapping[str, EngineTally] | None = None) -> Table:
    """Per app and agent (with its model): weight share, share of the service delivered while the load ran, latencies.

    For image generation, TTFT is the time to the first denoising step. The caption gives
    the unified tokens served and the requests done in all, and the engines' preemptions.
    """
    served: dict[str, float] = defaultdict(float)
    for t, app, agent, amount in charges:
        if t <= seconds:  # after the deadline only the flood's leftovers drain
            served[app] += amount
            served[f"{app}/{agent}"] += amount
    total = sum(served[app] for app in stats.apps) or 1.0
    models = {f"{app}/{agent}": model for app, agent, _, _, model, *_ in AGENTS}
    t = Table(title=f"policy {policy}")
    for column in ("app / agent", "weight", "served", "done", "wait p50", "wait p99", "TTFT p50", "TTFT p99"):
        t.add_column(column, justify="left" if column == "app / agent" else "right")
    for app, s in stats.apps.items():
        t.add_row(f"[bold]{app}[/]", *_cells(s, served[app] / total))
        for key, a in stats.agents.items():
            if key.startswith(f"{app}/"):
                label = f"  {key.split('/', 1)[1]}" + (f" [dim]({models[key]})[/]" if key in models else "")
                t.add_row(label, *_cells(a, served[key] / (served[app] or 1.0)))
    done = sum(s.done for s in stats.apps.values())
    caption = f"served {total:,.0f} unified tokens in {seconds:g} s, {done} requests done"
    for model, tally in sorted((tallies or {}).items()):
        if tally.preemptions:
            caption += (f"; {model}: {tally.preemptions} preempted ({tally.fair_preemptions} for fairness), "
                        f"recompute tax {tally.recompute_tax:.1%}")
    t.caption = caption
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


async def run_async(
    console: Console,
    policies: Sequence[str] = ("fcfs", "hmfs"),
    seconds: float = 12.0,
    out: str | Path = "fairagents-demo.png",
    model: str | None = None,
    engines: Mapping[str, Engine] | None = None,
) -> dict[str, Stats]:
    """The demo in a running event loop: serve ``engines`` (started and stopped here) or the embedded pool.

    ``model`` serves another text model as ``chat`` (a folder or a name); vision and image
    stay the embedded ones.
    """
    from fairagents.engines import embedded_pool

    if engines is None:
        pool = embedded_pool(model)
        engines = {"chat": pool["text"], "vision": pool["vision"], "image": pool["image"]}
    text = model or "the embedded tiny LLM"
    console.print(
        f"fairagents demo: {len(APPS)} apps, {len(AGENTS)} agents ('flood' keeps 10x the requests in flight) sharing "
        f"a real multi-modal pool: {text} and a tiny vision-language model on in-process vLLM engines, which "
        f"schedule by the arbiter's policy themselves, and a tiny diffusion model on diffusers (random weights: "
        f"gibberish text, noise images, real serving); {seconds:g} s per policy."
    )
    await asyncio.gather(*(e.start() for e in engines.values()))
    results, runs = {}, {}
    try:
        for policy in policies:
            stats, charges, tallies = await run(engines, policy, seconds)
            results[policy], runs[policy] = stats, charges
            console.print(table(policy, stats, charges, seconds, tallies))
    finally:
        await asyncio.gather(*(e.stop() for e in engines.values()), return_exceptions=True)
    console.print(f"served: share of the service (unified tokens, on every model) delivered while the load ran; an "
                  f"agent's share is of its app's. weight: what the weights entitle it to, between apps that stay "
                  f"backlogged where a queue forms (the LLM's batch, which the flood keeps full); an app served as "
                  f"fast as it asks receives what it asks, and studio's images count in studio's share. Each app's "
                  f"service over time: {plot(runs, Path(out))}")
    return results


def main(
    console: Console,
    policies: Sequence[str] = ("fcfs", "hmfs"),
    seconds: float = 12.0,
    out: str | Path = "fairagents-demo.png",
    model: str | None = None,
) -> dict[str, Stats]:
    """Run the demo under each policy on the embedded pool; print the tables and write the plot."""
    return asyncio.run(run_async(console, policies, seconds, out, model))
