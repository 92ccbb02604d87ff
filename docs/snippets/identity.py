"""Declaring apps and agents, and binding identity (FakeEngine: a test double that runs no model)."""

import asyncio

import fairagents as fa
from fairagents.testing import FakeEngine


async def main():
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", FakeEngine())  # or VLLMEngine(...)
    driving = arbiter.app("driving", weight=2.0, slo=fa.SLO(e2e=5.0))
    planner = driving.agent("planner", weight=2.0, slo=fa.SLO(ttft=0.5))
    perception = driving.agent("perception")  # weight 1, the app's SLO
    messages = [{"role": "user", "content": "where next?"}]
    async with arbiter:
        # --8<-- [start:bind]
        await planner.chat("chat", messages)  # through the handle
        await arbiter.chat("chat", messages, agent=perception)  # explicitly

        with fa.acting_as(planner):  # from context
            await arbiter.chat("chat", messages)

        @fa.agent(app="driving", name="perception")  # for every call inside
        async def perceive():
            return await arbiter.chat("chat", messages)

        await perceive()
        # --8<-- [end:bind]
    stats = arbiter.stats()
    for name, agent in stats.agents.items():
        print(f"{name}: {agent.done} calls, weight {agent.weight:g}")  # driving/planner: 2 calls, weight 2 ...
    assert stats.agents["driving/planner"].done == 2
    assert stats.agents["driving/perception"].done == 2


if __name__ == "__main__":
    asyncio.run(main())
