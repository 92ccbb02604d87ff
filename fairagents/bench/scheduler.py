"""How many scheduling decisions per second a policy makes, by number of active agents.

One *decision* is what the arbiter asks of a policy per request: an arrival, a
``select`` on a model with room, the dispatch (input charged), four progress
updates (output charged as it streams) and the finish. Every agent stays backlogged
with two waiting requests spread over two models, so every decision runs the full
path. Agents are grouped into ``ceil(√n)`` apps; HMFS schedules apps, then agents,
and VTC (``client="agent"``) schedules the same agents flat.

Only the policy is timed: requests are built beforehand and re-queued as they
finish, so Python object construction is not in the numbers. Each cell is the best
of ``repeats`` runs (as ``timeit`` does): on a shared machine the slower runs
measure the neighbours.

Examples:
    >>> from fairagents.bench import scheduler
    >>> result = scheduler.run(agents=(10,), policies=("hmfs",), decisions=2_000, repeats=1)
    >>> result["hmfs"]["10"] > 0
    True
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from fairagents.cost import ModelProfile, UnifiedTokenCost
from fairagents.identity import Agent, App
from fairagents.policies import VTC, Policy, make_policy
from fairagents.request import Outcome, Request

__all__ = ["render", "run"]

MODELS = ("text", "vision")
PROGRESS_UPDATES = 4


def _policy(name: str, cost: UnifiedTokenCost) -> Policy:
    """VTC with a client per agent (as many clients as HMFS has agents); any other policy by name."""
    if name == "vtc":
        return VTC(client="agent")
    return make_policy(name, cost)


def measure(policy_name: str, n_agents: int, decisions: int) -> float:
    """Decisions per second of ``policy_name`` with ``n_agents`` backlogged agents."""
    cost = UnifiedTokenCost(
        {"text": ModelProfile(d_model=4096, n_layers=32), "vision": ModelProfile(d_model=2048, n_layers=24)}
    )
    policy = _policy(policy_name, cost)
    n_apps = math.ceil(math.sqrt(n_agents))
    apps = [App(f"app{i}", weight=1.0 + i % 3) for i in range(n_apps)]
    agents = [Agent(f"agent{i}", apps[i % n_apps], weight=1.0 + i % 2) for i in range(n_agents)]
    requests = [
        Request(f"r{i}-{k}", who, MODELS[(i + k) % 2], 64 + i % 7, 128, 0.0)
        for i, who in enumerate(agents)
        for k in range(2)
    ]
    for req in requests:
        policy.on_arrival(req, 0.0)
    select, dispatch, progress = policy.select, policy.on_dispatch, policy.on_progress
    finish, arrive = policy.on_finish, policy.on_arrival
    finished = Outcome.FINISHED
    now = 0.0
    start = time.perf_counter()
    for i in range(decisions):
        req = select(MODELS[i & 1], now)
        dispatch(req, now)  # type: ignore[arg-type]
        for _ in range(PROGRESS_UPDATES):
            progress(req, 8, now)  # type: ignore[arg-type]
        finish(req, finished, now)  # type: ignore[arg-type]
        arrive(req, now)  # type: ignore[arg-type]
        now += 1e-4
    return decisions / (time.perf_counter() - start)


def run(
    agents: Sequence[int] = (10, 1_000, 10_000),
    policies: Sequence[str] = ("hmfs", "vtc"),
    decisions: int = 50_000,
    repeats: int = 5,
) -> dict[str, Any]:
    """``{policy: {str(n_agents): decisions_per_s}}``, best of ``repeats``, measured now on this machine."""
    return {p: {str(n): max(measure(p, n, decisions) for _ in range(repeats)) for n in agents} for p in policies}


def render(result: dict[str, Any]) -> Table:
    """A table of decisions/s and µs/decision per policy and agent count."""
    table = Table(title="Scheduling decisions per second (arrival + select + dispatch + 4 progress + finish)")
    table.add_column("policy")
    counts = list(next(iter(result.values())))
    for n in counts:
        table.add_column(f"{int(n):,} agents", justify="right")
    for policy, row in result.items():
        table.add_row(policy, *(f"{row[n]:,.0f}/s ({1e6 / row[n]:.1f} µs)" for n in counts))
    return table
