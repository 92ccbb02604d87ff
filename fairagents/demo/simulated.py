"""The demo's load on the simulator: engines timed as on a 2-core CPU, scheduling as the default path does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console

from fairagents.cost import ModelProfile
from fairagents.demo.load import AGENTS, APPS, CHAT_BATCH, IMAGE_STEP_TOKENS, IMAGE_STEPS, LAYOUTS, PROMPT_TOKENS, SERIAL
from fairagents.demo.report import DemoRun, plot, standings, table
from fairagents.engines.sim import SimEngine
from fairagents.errors import InvalidParameterError
from fairagents.identity import Agent, App, Modality
from fairagents.simulation import Shape, Workflows, simulate_workflows

__all__ = ["sim_engines", "simulated", "simulated_main"]


def sim_engines() -> dict[str, SimEngine]:
    """The demo's engines as the simulator models them: the default path, timed as measured on a 2-core CPU.

    ``chat`` and ``vision`` schedule by the policy themselves (``scheduler="fair"``), their
    batches capped as the demo caps them; ``image`` runs one request at a time, which the
    arbiter dispatches. Step times were fitted to one run of the real demo under ``hmfs``
    on one device (a machine of 2 CPU cores, no GPU): a ``chat`` step of 30
    sequences took 9.1 ms on average, a ``vision`` step of 5.4 took 6.5 ms, and a denoising
    step of a 64×64 image about 26 ms, which the simulator spreads over its latent tokens.
    On other hardware, measure and pass engines of your own to :func:`simulated`.
    """
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

    The same apps, agents, weights and callers as :func:`~fairagents.demo.run`: each
    caller asks again as soon as its request ends, until ``seconds``; the same devices by
    ``layout``. It is what the simulator predicts the real demo serves: ``fairagents demo
    --simulated`` prints it as simulated, and the real demo says how far it was.
    """
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


def simulated_main(console: Console, policies: Sequence[str] = ("fcfs", "hmfs"), seconds: float = 12.0,
                   out: str | Path = "fairagents-demo.png", layout: str = "one") -> dict[str, DemoRun]:
    """The demo's load on the simulator (:func:`simulated`) under each policy: the tables and plot, marked simulated."""
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
