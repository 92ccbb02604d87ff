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
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fairagents.engines.base import Engine
from fairagents.engines.sim import SimEngine
from fairagents.errors import InvalidParameterError
from fairagents.images import to_png
from fairagents.metrics import backlog_intervals, entitlements, percentile
from fairagents.policies.pooled import EngineTally
from fairagents.records import RequestRecord
from fairagents.request import Outcome
from fairagents.runtime.arbiter import Arbiter
from fairagents.stats import Stats

__all__ = ["AGENTS", "APPS", "BACKLOGGED", "CHAT_BATCH", "DemoRun", "IMAGE_STEP_TOKENS", "LAYOUTS", "PROMPT_TOKENS",
           "Row", "SERIAL", "disagreement", "main", "plot", "run", "run_async", "sim_engines", "simulated",
           "simulated_main", "standings", "table", "worst_gap"]

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
#: Sequences the LLM runs at once in the demo (as GPU memory would bound it): the flood's 60 callers fill it.
CHAT_BATCH = 32
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


#: The layouts the demo runs: every model on one device (the embedded pool: one CPU), or each on its own.
LAYOUTS = ("one", "separate")
#: An agent wants more than it got when it had a request waiting (not yet started) this share of the load's time;
#: an app, when one of its agents does.
BACKLOGGED = 0.5


@dataclass
class DemoRun:
    """What one policy's run measured (times in seconds since the load started)."""

    policy: str
    stats: Stats | None
    """The arbiter's stats after the run (``None`` for a simulated run)."""
    charges: list[tuple[float, str, str, float, str]]
    """Every charge: (time, app, agent, unified tokens, model)."""
    records: list[RequestRecord]
    """Every request's record, times shifted to the load's start."""
    devices: dict[str, str]
    """Each model's device."""
    tallies: dict[str, EngineTally]
    """What each in-engine model preempted."""
    simulated: bool = False
    """Whether the load ran on the simulator (:func:`simulated`)."""


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


#: Prompt tokens of each agent's request as the embedded models count them (the chat template; for ``perception``,
#: the camera frame's image tokens too; for ``illustrator``, the caption as the image model's text encoder keeps it).
PROMPT_TOKENS = {("driving", "planner"): 53, ("driving", "perception"): 71, ("studio", "writer"): 47,
                 ("studio", "illustrator"): 32, ("flood", "chatty"): 32}
#: Latent tokens a denoising step of one demo image produces (the image model charges them per step).
IMAGE_STEP_TOKENS = 256
#: Which engines step one at a time on this machine's CPU: vLLM's in-process engines do (their forward context is
#: global to the process); the diffusion engine runs beside them.
SERIAL = {"chat": "vllm", "vision": "vllm", "image": "diffusers"}


def sim_engines() -> dict[str, SimEngine]:
    """The demo's engines as the simulator models them: the default path, timed as measured on a 2-core CPU.

    ``chat`` and ``vision`` schedule by the policy themselves (``scheduler="fair"``), their
    batches capped as the demo caps them; ``image`` runs one request at a time, which the
    arbiter dispatches. Step times were fitted to one run of the real demo under ``hmfs``
    on one device (this repository's CI machine: 2 cores, no GPU): a ``chat`` step of 30
    sequences took 9.1 ms on average, a ``vision`` step of 5.4 took 6.5 ms, and a denoising
    step of a 64×64 image about 26 ms, which the simulator spreads over its latent tokens.
    On other hardware, measure and pass engines of your own to :func:`simulated`.
    """
    from fairagents.cost import ModelProfile
    from fairagents.identity import Modality

    return {
        "chat": SimEngine(ModelProfile(d_model=128, n_layers=2), max_running=CHAT_BATCH, kv_capacity=32_768,
                          max_model_len=1024, scheduler="fair", decode_base=0.0015, decode_per_seq=0.0002,
                          prefill_per_token=4e-5),
        "vision": SimEngine(ModelProfile(d_model=128, n_layers=2, modality=Modality.VISION), max_running=8,
                            kv_capacity=32_768, max_model_len=1024, scheduler="fair", decode_base=0.0037,
                            decode_per_seq=0.0002, prefill_per_token=1e-4),
        "image": SimEngine(ModelProfile(d_model=64, n_layers=2, modality=Modality.IMAGE), max_running=1,
                           kv_capacity=IMAGE_STEPS * IMAGE_STEP_TOKENS + 64,
                           decode_base=0.026 / IMAGE_STEP_TOKENS, decode_per_seq=0.0, prefill_per_token=0.0),
    }


def simulated(policy: str, seconds: float = 12.0, layout: str = "one",
              engines: Mapping[str, SimEngine] | None = None) -> DemoRun:
    """The demo's load played on the simulator, on the default path (:func:`sim_engines` unless ``engines``).

    The same apps, agents, weights and callers as :func:`run`: each caller asks again as
    soon as its request ends, until ``seconds``; the same devices by ``layout``. What it
    reports is what the simulator predicts the real demo serves; ``fairagents demo
    --simulated`` prints it beside nothing real.
    """
    from fairagents.identity import Agent, App
    from fairagents.simulation import Shape, Workflows, simulate_workflows

    if layout not in LAYOUTS:
        raise InvalidParameterError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    engines = dict(sim_engines() if engines is None else engines)
    apps = {name: App(name, weight=w) for name, w in APPS.items()}
    flows = Workflows()
    for app, agent, weight, n, model, max_tokens, _ in AGENTS:
        who = Agent(agent, apps[app], weight=weight)
        output = IMAGE_STEPS * IMAGE_STEP_TOKENS if model == "image" else max_tokens
        flows.users(Shape.chain(who, model, prompt=PROMPT_TOKENS[(app, agent)], output=output), n=n, until=seconds,
                    name=f"{app}.{agent}")
    devices = {m: "local" if layout == "one" else m for m in engines}
    result = simulate_workflows(flows, policy, engines, devices=devices, serial=SERIAL)
    charges = [(c.time, c.app, c.agent, c.amount, c.model or "") for c in result.charges]
    return DemoRun(policy, None, charges, result.records, devices, dict(result.tallies), simulated=True)


def _shifted(r: RequestRecord, start: float) -> RequestRecord:
    def shift(t: float | None) -> float | None:
        return None if t is None else t - start

    return dataclasses.replace(r, arrival=r.arrival - start, dispatched=shift(r.dispatched),
                               first_token=shift(r.first_token), finished=r.finished - start)


@dataclass
class Row:
    """An app's or agent's standing on one device: shares of the device's service (an agent's: of its app's)."""

    name: str
    weight: float
    """What its weight entitles it to between clients that all want more."""
    entitled: float
    """What weighted max-min fairness entitles it to, given its demand (:func:`~fairagents.metrics.entitlements`)."""
    served: float
    """What it received."""
    backlogged: bool
    """Whether it had a request waiting at least :data:`BACKLOGGED` of the time (it wanted more)."""
    done: int
    waits: list[float]
    ttfts: list[float]
    agents: list[Row] = dataclasses.field(default_factory=list)

    @property
    def gap(self) -> float:
        """How far its share is from its entitlement, relative to the entitlement."""
        return abs(self.served - self.entitled) / self.entitled if self.entitled else 0.0


def standings(result: DemoRun, seconds: float) -> dict[str, list[Row]]:
    """Per device, each app with service there, and its agents there: weight, entitlement and share while the load ran."""
    weights = {(app, agent): w for app, agent, w, *_ in AGENTS}
    out: dict[str, list[Row]] = {}
    for device in dict.fromkeys(result.devices.values()):
        models = {m for m, d in result.devices.items() if d == device}
        served: dict[tuple[str, ...], float] = defaultdict(float)
        for t, app, agent, amount, model in result.charges:
            if t <= seconds and model in models:  # after the deadline only the flood's leftovers drain
                served[(app,)] += amount
                served[(app, agent)] += amount
        records = [r for r in result.records if r.model in models and r.arrival <= seconds]
        backlog = {key: sum(min(b, seconds) - a for a, b in spans if a < seconds) / seconds
                   for key, spans in backlog_intervals(records, key="agent").items()}
        wants = {key: share >= BACKLOGGED for key, share in backlog.items()}
        apps = [app for app in APPS if served[(app,)] > 0]
        if not apps:
            continue
        # an app wants more when one of its agents does (a request of one of its many callers waiting for its
        # first step, now and then, is no demand for more)
        app_wants = {a: any(w for key, w in wants.items() if key.split("/", 1)[0] == a) for a in apps}
        app_share = entitlements({a: served[(a,)] for a in apps}, {a: APPS[a] for a in apps}, app_wants)
        total = sum(served[(a,)] for a in apps)
        rows = []
        for app in apps:
            agents = [agent for a, agent, *_ in AGENTS if a == app and served[(app, agent)] > 0]
            agent_share = entitlements({g: served[(app, g)] for g in agents}, {g: weights[(app, g)] for g in agents},
                                       {g: wants.get(f"{app}/{g}", False) for g in agents})
            row = _row(app, APPS[app] / sum(APPS[a] for a in apps), app_share[app], served[(app,)] / total,
                       app_wants[app], [r for r in records if r.app == app])
            row.agents = [_row(g, weights[(app, g)] / sum(weights[(app, x)] for x in agents), agent_share[g],
                               served[(app, g)] / served[(app,)], wants.get(f"{app}/{g}", False),
                               [r for r in records if r.app == app and r.agent == g]) for g in agents]
            rows.append(row)
        out[device] = rows
    return out


def _row(name: str, weight: float, entitled: float, served: float, backlogged: bool,
         records: list[RequestRecord]) -> Row:
    done = [r for r in records if r.outcome is Outcome.FINISHED]
    return Row(name, weight, entitled, served, backlogged, len(done),
               [r.dispatched - r.arrival for r in done if r.dispatched is not None],
               [r.first_token - r.arrival for r in done if r.first_token is not None])


def disagreement(rows: dict[str, list[Row]], predicted: dict[str, list[Row]]) -> tuple[float, str]:
    """The largest difference between two runs' shares, over every app and agent of every device, and whose it is.

    Shares are fractions (an agent's, of its app's); a client served in one run and not
    the other differs by its whole share.
    """
    def shares(standing: dict[str, list[Row]]) -> dict[str, float]:
        out = {}
        for device, apps in standing.items():
            for app in apps:
                out[f"{device}: {app.name}"] = app.served
                out.update({f"{device}: {app.name}/{agent.name}": agent.served for agent in app.agents})
        return out

    a, b = shares(rows), shares(predicted)
    return max(((abs(a.get(k, 0.0) - b.get(k, 0.0)), k) for k in a.keys() | b.keys()), default=(0.0, ""))


def worst_gap(rows: dict[str, list[Row]]) -> float:
    """The largest gap between a share and its entitlement, over every app and agent of every device."""
    return max((r.gap for device in rows.values() for app in device for r in (app, *app.agents)), default=0.0)


def table(result: DemoRun, seconds: float, device: str, rows: list[Row]) -> Table:
    """One device's apps and agents (with their model): weight, entitlement and share of its service, latencies.

    For image generation, TTFT is the time to the first denoising step. The caption gives
    the unified tokens served and the requests done on the device, and its engines' preemptions.
    """
    models = {f"{app}/{agent}": model for app, agent, _, _, model, *_ in AGENTS}
    on_device = sorted(m for m, d in result.devices.items() if d == device)
    t = Table(title=f"{'SIMULATED ' if result.simulated else ''}policy {result.policy} — device {device!r} "
                    f"({', '.join(on_device)})")
    for column in ("app / agent", "weight", "entitled", "served", "done", "wait p50", "wait p99", "TTFT p50",
                   "TTFT p99"):
        t.add_column(column, justify="left" if column == "app / agent" else "right")
    for app in rows:
        t.add_row(f"[bold]{app.name}[/]", *_cells(app))
        for agent in app.agents:
            key = f"{app.name}/{agent.name}"
            t.add_row(f"  {agent.name} [dim]({models[key]})[/]", *_cells(agent))
    total = sum(a for time, _, _, a, m in result.charges if time <= seconds and m in on_device)
    done = sum(app.done for app in rows)
    caption = (f"served {total:,.0f} unified tokens in {seconds:g} s, {done} requests done; largest gap to an "
               f"entitlement {worst_gap({device: rows}):.0%}")
    for model in on_device:
        tally = result.tallies.get(model)
        if tally is not None and tally.preemptions:
            caption += (f"; {model}: {tally.preemptions} preempted ({tally.fair_preemptions} for fairness), "
                        f"recompute tax {tally.recompute_tax:.1%}")
    t.caption = caption
    return t


def _cells(row: Row) -> list[str]:
    mark = "" if row.backlogged else " [dim]·[/]"
    return [f"{row.weight:.0%}", f"{row.entitled:.0%}{mark}", f"{row.served:.0%}", str(row.done),
            f"{percentile(row.waits, 50):.2f}s", f"{percentile(row.waits, 99):.2f}s",
            f"{percentile(row.ttfts, 50):.2f}s", f"{percentile(row.ttfts, 99):.2f}s"]


def plot(runs: dict[str, DemoRun], seconds: float, out: Path) -> Path:
    """Each app's share of the LLM's device over time, against its entitlement (dotted), one panel per policy, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), sharey=True, squeeze=False)
    for ax, (policy, result) in zip(axes[0], runs.items(), strict=True):
        device = result.devices["chat"]
        entitled = {row.name: row.entitled for row in standings(result, seconds).get(device, [])}
        totals: dict[str, float] = defaultdict(float)
        series: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
        for t, app, _, amount, model in sorted(result.charges):
            if result.devices.get(model) != device or t > seconds:
                continue
            totals[app] += amount
            everyone = sum(totals.values())
            for name in APPS:
                series[name][0].append(t)
                series[name][1].append(totals[name] / everyone)
        for i, app in enumerate(APPS):
            color = f"C{i}"
            xs, ys = series.get(app, ([], []))
            ax.plot(xs, ys, color=color, label=f"{app} (weight {APPS[app]:g})")
            if app in entitled:
                ax.axhline(entitled[app], color=color, linestyle=":", linewidth=1.5)
        ax.set_title(f"policy {policy}: share of device {device!r}")
        ax.set_xlabel("seconds")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("share of service so far (dotted: entitled)")
    axes[0][-1].legend(loc="upper right")
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


def simulated_main(console: Console, policies: Sequence[str] = ("fcfs", "hmfs"), seconds: float = 12.0,
                   out: str | Path = "fairagents-demo.png", layout: str = "one") -> dict[str, DemoRun]:
    """The demo's load on the simulator (:func:`simulated`) under each policy: the same tables and plot, said to be simulated."""
    console.print(
        f"[bold yellow]SIMULATED[/]: the demo's load ({len(APPS)} apps, {len(AGENTS)} agents, {seconds:g} s per "
        f"policy, devices: {layout}) played on SimEngine, a discrete-event simulator on a virtual clock, with "
        f"engines that schedule by the policy as the real default path does, timed as measured on a 2-core CPU. "
        f"Nothing is served.")
    runs: dict[str, DemoRun] = {}
    for policy in policies:
        result = runs[policy] = simulated(policy, seconds, layout)
        for device, rows in standings(result, seconds).items():
            console.print(table(result, seconds, device, rows))
    console.print(f"Each app's share of the LLM's device over time (simulated): {plot(runs, seconds, Path(out))}")
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
