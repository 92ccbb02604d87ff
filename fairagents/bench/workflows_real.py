"""The workflow scenarios on a real engine: the same runs, sent through the arbiter in real time.

``fairagents bench workflows --real`` (:func:`fairagents.bench.workflows.run` with
``real=True``): every closed-loop user and every open-loop run is a task, and each call
of a run is a real ``arbiter.complete`` carrying ``run=`` the run's id. The result has
the simulator's shape (:class:`~fairagents.simulation.SimResult`), so one summary reads both.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from fairagents.engines.base import Prompt, capabilities
from fairagents.errors import EngineError, OverloadedError
from fairagents.identity import Agent, App
from fairagents.records import RequestRecord
from fairagents.simulation import SimResult, SimRun, Workflows

if TYPE_CHECKING:
    from fairagents.engines.base import Engine

__all__ = ["MODEL", "run_real"]

#: The one model of every scenario.
MODEL = "chat"


def run_real(flows: Workflows, policies: list[str], seconds: float, engine: Engine | None) -> dict[str, SimResult]:
    """Play ``flows`` under each of ``policies`` for ``seconds`` on ``engine`` (default: the embedded text model, 4 MiB KV)."""
    return asyncio.run(_real(flows, policies, seconds, engine))


async def _real(flows: Workflows, policies: list[str], seconds: float, engine: Engine | None) -> dict[str, SimResult]:
    if engine is None:
        from fairagents.engines.vllm import VLLMEngine

        engine = VLLMEngine(None, kv_cache_bytes=4 * 2**20, max_model_len=1024)  # a long request fits twice
    await engine.start()
    try:
        return {p: await _play_real(flows, p, seconds, engine) for p in policies}
    finally:
        await engine.stop()


async def _play_real(flows: Workflows, policy: str, seconds: float, engine: Engine) -> SimResult:
    """Every closed-loop user and open-loop run as a task: each run's stages sent as concurrent calls carrying ``run=``."""
    from fairagents.runtime.arbiter import Arbiter
    from fairagents.stats import Ledger

    origin = time.monotonic()

    def clock() -> float:
        return time.monotonic() - origin

    arbiter = Arbiter(policy, clock=clock)
    arbiter.runner.ledger = Ledger(keep=sys.maxsize)  # the summary reads every record and charge
    arbiter.add_model(MODEL, engine)
    apps: dict[str, App] = {}
    agents: dict[tuple[str, str], Agent] = {}
    for shape in flows.shapes():
        for call in shape.calls:
            if call.agent.key not in agents:
                arbiter.app(call.agent.app.name, call.agent.app.weight).agent(call.agent.name, call.agent.weight)
                apps[call.agent.app.name], agents[call.agent.key] = call.agent.app, call.agent
    run_of: dict[str, str] = {}  # request id → its run
    arbiter.runner.submitted.append(lambda request: run_of.__setitem__(request.id, request.run))
    limit = min(engine.max_model_len or 2**31, capabilities(engine).token_capacity or 2**31)
    vocab = capabilities(engine).vocab_size or 1000
    done: list[SimRun] = []

    async def send(call: Any, prompt: int, output: int, rng: random.Random, run_id: str) -> None:
        output = min(output, max(1, limit // 4))
        ids = tuple(rng.randrange(3, vocab) for _ in range(max(1, min(prompt, limit - output - 1))))
        try:
            await arbiter.complete(MODEL, Prompt(token_ids=ids), agent=call.agent, max_tokens=output,
                                   ignore_eos=True, run=run_id)
        except (EngineError, OverloadedError):
            pass  # the ledger has it as failed; the run goes on

    async def play(run_id: str, mix: Any, user: str | None) -> None:
        start = clock()
        shape, stages = flows.draw(run_id, mix)
        rng = random.Random(f"{run_id}/{policy}")  # prompt ids: no prefix-cache hits between runs or policies
        for stage in stages:
            await asyncio.gather(*(send(call, p, o, rng, run_id) for call, p, o in stage))
        done.append(SimRun(run_id, shape.app.name, shape.label, start, clock(), len(shape.calls), 0.0, user))

    async def arriving(index: int, at: float, mix: Any) -> None:
        await asyncio.sleep(max(0.0, at - clock()))
        await play(f"o{index}", mix, None)

    async def user(index: int) -> None:
        group, name = flows.user_names()[index]
        await asyncio.sleep(max(0.0, flows.first_start(index) - clock()))
        k = 0
        while clock() < group.until:
            await play(f"u{index}.{k}", group.mix, name)
            k += 1
            if group.think:
                await asyncio.sleep(group.think)

    await arbiter.start()
    origin = time.monotonic()  # the clock starts once the arbiter is up
    try:
        await asyncio.gather(*(user(i) for i in range(len(flows.user_names()))),
                             *(arriving(i, at, mix) for i, (at, mix) in enumerate(flows.open)))
    finally:
        await arbiter.close(stop_engines=False)
    records: list[RequestRecord] = list(arbiter.ledger.records)
    service: dict[str, float] = defaultdict(float)
    for r in records:
        if (run := run_of.get(r.id)) is not None:
            service[run] += arbiter.cost.input_cost(r.model, r.prompt_tokens) + arbiter.cost.output_cost(
                r.model, r.output_tokens)
    done = [SimRun(r.id, r.app, r.label, r.start, r.end, r.calls, service[r.id], r.user) for r in done]
    return SimResult(policy=arbiter.policy.name, records=records, charges=list(arbiter.ledger.charges), apps=apps,
                     agents=agents, cost=arbiter.cost, bound=arbiter.dispatcher.bound(),
                     end=max((r.finished for r in records), default=0.0), idle_with_backlog=0, runs=done)
