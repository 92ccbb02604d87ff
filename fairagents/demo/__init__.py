"""The main demo: three apps share a real multi-modal pool, one of them flooding it.

The pool is the embedded default (tiny models of random weights: text is gibberish,
images are noise; serving, batching, token counts and timings are real): ``chat``, an
LLM on vLLM; ``vision``, a vision-language model on vLLM; ``image``, a diffusion model
on diffusers. The two vLLM engines schedule inside themselves by the policy (the
default path), the arbiter dispatches the image model by it, and a denoising step, an
image token and an LLM token are charged in one currency (unified tokens).

Which models share hardware decides what is fair (:mod:`fairagents.policies.devices`).
Here the three run on one CPU: by default the demo puts them on **one device**, whose
engines take one order with one set of counters, so ``studio``'s images count in its
share of the device and its illustrator waits while an app owed more waits for the LLM.
``layout="separate"`` (``fairagents demo --devices separate``) runs the same load as if
each model had a GPU of its own: each device splits its own service, and ``studio``'s
images, which nobody else wants, cost its writer nothing on the LLM.

``driving`` (weight 2) plans on ``chat`` and looks at camera frames on ``vision``;
``studio`` writes on ``chat`` and illustrates on ``image``; ``flood`` keeps ten times the
requests of any other agent in flight on ``chat``. The demo runs the same load under
each policy and prints, per device, each app and agent with the share its weight gives,
its **entitlement given its demand** (weighted max-min: an app that asks less than its
share is entitled to what it asks, the others split the rest by weight;
:func:`~fairagents.metrics.entitlements`), the share it was served, and wait and TTFT
percentiles; it plots each app's share of the LLM's device over time against its
entitlement.

Examples:
    >>> from fairagents.demo import AGENTS
    >>> sorted({app for app, *_ in AGENTS}), sorted({model for _, _, _, _, model, *_ in AGENTS})
    (['driving', 'flood', 'studio'], ['chat', 'image', 'vision'])
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console

from fairagents.demo.load import (
    AGENTS,
    APPS,
    BACKLOGGED,
    CHAT_BATCH,
    IMAGE_SIZE,
    IMAGE_STEP_TOKENS,
    IMAGE_STEPS,
    LAYOUTS,
    PROMPT_TOKENS,
    SERIAL,
    camera_frame,
)
from fairagents.demo.report import DemoRun, Row, disagreement, plot, standings, table, worst_gap
from fairagents.demo.simulated import sim_engines, simulated, simulated_main
from fairagents.engines.base import Engine
from fairagents.errors import InvalidParameterError
from fairagents.records import RequestRecord
from fairagents.runtime.arbiter import Arbiter

__all__ = ["AGENTS", "APPS", "BACKLOGGED", "CHAT_BATCH", "IMAGE_SIZE", "IMAGE_STEPS", "IMAGE_STEP_TOKENS", "LAYOUTS",
           "PROMPT_TOKENS", "SERIAL", "DemoRun", "Row", "camera_frame", "disagreement", "main", "plot", "run",
           "run_async", "sim_engines", "simulated", "simulated_main", "standings", "table", "worst_gap"]


async def run(engines: Mapping[str, Engine], policy: str, seconds: float, layout: str = "one") -> DemoRun:
    """Run the demo load for ``seconds`` under ``policy`` on started ``engines`` (``chat``, ``vision``, ``image``).

    ``layout``: ``"one"`` puts the three models on one device, as they are here (one
    CPU); ``"separate"`` gives each a device of its own, as three GPUs would be.
    """
    if layout not in LAYOUTS:
        raise InvalidParameterError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    arbiter = Arbiter(policy=policy)
    for name, engine in engines.items():
        arbiter.add_model(name, engine, device="local" if layout == "one" else name,
                          in_flight=CHAT_BATCH if name == "chat" else None)
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
    charges = [(c.time - start, c.app, c.agent, c.amount, c.model or "") for c in arbiter.ledger.charges]
    records = [_shifted(r, start) for r in arbiter.ledger.records]
    devices = {m: d for d, models in arbiter.devices.items() for m in models}
    tallies = {m: tally for m in engines if (tally := arbiter.pool_policy_of(m).tallies.get(m)) is not None}
    return DemoRun(policy, arbiter.stats(), charges, records, devices, tallies)


def _shifted(r: RequestRecord, start: float) -> RequestRecord:
    def shift(t: float | None) -> float | None:
        return None if t is None else t - start

    return dataclasses.replace(r, arrival=r.arrival - start, dispatched=shift(r.dispatched),
                               first_token=shift(r.first_token), finished=r.finished - start)


async def run_async(
    console: Console,
    policies: Sequence[str] = ("fcfs", "hmfs"),
    seconds: float = 12.0,
    out: str | Path = "fairagents-demo.png",
    model: str | None = None,
    engines: Mapping[str, Engine] | None = None,
    layout: str = "one",
) -> dict[str, DemoRun]:
    """The demo in a running event loop: serve ``engines`` (started and stopped here) or the embedded pool.

    ``model`` serves another text model as ``chat`` (a folder or a name); vision and image
    stay the embedded ones. ``layout``: the devices (:data:`LAYOUTS`).
    """
    from fairagents.engines import embedded_pool

    if layout not in LAYOUTS:
        raise InvalidParameterError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if engines is None:
        pool = embedded_pool(model)
        engines = {"chat": pool["text"], "vision": pool["vision"], "image": pool["image"]}
    text = model or "the embedded tiny LLM"
    where = ("all three models on one device, as they are here (one CPU): one order and one set of counters over "
             "the three engines" if layout == "one" else
             "each model on a device of its own, as on three GPUs: each device splits its own service")
    console.print(
        f"fairagents demo: {len(APPS)} apps, {len(AGENTS)} agents ('flood' keeps 10x the requests in flight) sharing "
        f"a real multi-modal pool: {text} and a tiny vision-language model on in-process vLLM engines, which "
        f"schedule by the arbiter's policy themselves, and a tiny diffusion model on diffusers (random weights: "
        f"gibberish text, noise images, real serving); {seconds:g} s per policy. Layout: {where}."
    )
    await asyncio.gather(*(e.start() for e in engines.values()))
    runs: dict[str, DemoRun] = {}
    try:
        for policy in policies:
            result = runs[policy] = await run(engines, policy, seconds, layout)
            rows = standings(result, seconds)
            for device, device_rows in rows.items():
                console.print(table(result, seconds, device, device_rows))
            if model is None and set(engines) == set(SERIAL):
                off, whose = disagreement(rows, standings(simulated(policy, seconds, layout), seconds))
                console.print(f"[dim]the simulator's prediction of this run (fairagents demo --simulated, timed on a "
                              f"2-core CPU): every share within {100 * off:.1f} points of these (the largest "
                              f"difference: {whose})[/]")
    finally:
        await asyncio.gather(*(e.stop() for e in engines.values()), return_exceptions=True)
    console.print(f"weight: the share the weights give between clients that all want more. entitled: weighted "
                  f"max-min fairness given demand: a client that was seldom waiting (marked ·) asked for what it "
                  f"got, and the others split the rest by weight. served: the share received while the load ran "
                  f"(unified tokens on the device's models; an agent's, of its app's). Each app's share of the LLM's "
                  f"device over time: {plot(runs, seconds, Path(out))}")
    return runs


def main(
    console: Console,
    policies: Sequence[str] = ("fcfs", "hmfs"),
    seconds: float = 12.0,
    out: str | Path = "fairagents-demo.png",
    model: str | None = None,
    layout: str = "one",
) -> dict[str, DemoRun]:
    """Run the demo under each policy on the embedded pool; print the tables and write the plot."""
    return asyncio.run(run_async(console, policies, seconds, out, model, layout=layout))
