"""A simulated multi-app scenario: three apps share a text, a vision and an image model.

It runs on :class:`~fairagents.engines.SimEngine` on a virtual clock (``fairagents demo
--simulated``) and says so in its output: a quick way to compare policies at a scale
the real engines of this machine would take hours for. One app floods the text model;
the table shows what each policy gives each app and agent against its weight.

Examples:
    >>> from fairagents.scenarios import scenario
    >>> workload, engines = scenario(seed=0)
    >>> sorted(engines)
    ['image', 'text', 'vision']
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from fairagents.cost import ModelProfile
from fairagents.engines.sim import SimEngine
from fairagents.identity import SLO, Agent, App, Modality
from fairagents.simulation import SimResult, Workload, simulate

__all__ = ["main", "scenario"]

PROFILES = {
    "text": ModelProfile(d_model=4096, n_layers=32),
    "vision": ModelProfile(d_model=2048, n_layers=24, modality=Modality.VISION),
    "image": ModelProfile(d_model=1152, n_layers=28, modality=Modality.IMAGE),
}


DURATION = 60.0
"""Seconds of traffic; shares count the service delivered while traffic arrives."""


def scenario(seed: int = 0) -> tuple[Workload, dict[str, SimEngine]]:
    """Three apps over 60 virtual seconds; ``flood`` sends ten times what the others send."""
    driving = App("driving", weight=2.0)
    studio = App("studio", weight=1.0)
    flood = App("flood", weight=1.0)
    perception = Agent("perception", driving, slo=SLO(ttft=0.5))
    planner = Agent("planner", driving, weight=2.0, slo=SLO(ttft=1.0))
    writer = Agent("writer", studio)
    illustrator = Agent("illustrator", studio)
    chatty = Agent("chatty", flood)
    work = Workload(seed=seed)
    work.poisson(perception, "vision", rate=4.0, until=DURATION, prompt=(300, 600), output=(16, 48))
    work.poisson(planner, "text", rate=3.0, until=DURATION, prompt=(200, 800), output=(64, 192))
    work.poisson(writer, "text", rate=3.0, until=DURATION, prompt=(100, 400), output=(128, 256))
    # An image request's tokens are latent tokens per denoising step (see the cost docs).
    work.poisson(illustrator, "image", rate=1.0, until=DURATION, prompt=(16, 64), output=(64, 128))
    work.poisson(chatty, "text", rate=30.0, until=DURATION, prompt=(200, 800), output=(64, 192))
    engines = {
        name: SimEngine(profile, max_running=16, kv_capacity=16_384, jitter=0.1, seed=seed)
        for name, profile in PROFILES.items()
    }
    return work, engines


def _table(result: SimResult) -> Table:
    apps = result.app_stats(until=DURATION)
    table = Table(title=f"policy {result.policy}: Jain's index of weighted app service {result.jain(DURATION):.3f}")
    for column in ("app / agent", "weight", "served", "done", "wait p50", "wait p99", "TTFT p99", "SLO met"):
        table.add_column(column, justify="left" if column == "app / agent" else "right")
    agents = result.agent_stats(until=DURATION)
    for app in apps:
        table.add_row(
            f"[bold]{app.name}[/]", f"{app.weight_share:.0%}", f"{app.share:.0%}", str(app.done),
            f"{app.wait_p50:.2f}s", f"{app.wait_p99:.2f}s", f"{app.ttft_p99:.2f}s", _slo(app.slo_attainment),
        )
        for s in agents:
            if s.name.startswith(f"{app.name}/"):
                table.add_row(
                    f"  {s.name.split('/', 1)[1]}", f"{s.weight_share:.0%}", f"{s.service / max(app.service, 1e-9):.0%}",
                    str(s.done), f"{s.wait_p50:.2f}s", f"{s.wait_p99:.2f}s", f"{s.ttft_p99:.2f}s",
                    _slo(s.slo_attainment),
                )
    return table


def _slo(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def main(console: Console, policies: Sequence[str] = ("fcfs", "vtc", "hmfs"), seed: int = 0) -> dict[str, SimResult]:
    """Run the scenario under each policy and print a table per policy."""
    console.print(
        "[bold yellow]SIMULATED[/]: this demo runs on SimEngine, a discrete-event simulator on a virtual "
        "clock (60 s of traffic, three models), not on real engines."
    )
    results = {}
    for name in policies:
        workload, engines = scenario(seed)
        results[name] = result = simulate(workload, name, engines)
        console.print(_table(result))
    console.print(
        f"served: an app's share of all service (unified tokens) delivered in the first {DURATION:.0f} s; an "
        "agent's share of its app's. weight: what the weights entitle it to while everyone is backlogged; "
        "an app that asks for less leaves the rest to the others (work conservation)."
    )
    return results
