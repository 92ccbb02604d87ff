"""Errors carry what they are about (FakeEngine: a test double that runs no model)."""

import asyncio

import fairagents as fa
from fairagents.testing import FakeEngine


async def main():
    engine = FakeEngine(token_capacity=64)  # a model whose KV cache holds 64 tokens
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", engine)
    planner = arbiter.app("driving").agent("planner")
    messages = [{"role": "user", "content": "plan the route"}]
    async with arbiter:
        try:
            await planner.chat("chat", messages, max_tokens=100)
        except fa.ContextLengthError as err:  # prompt + max_tokens needs more KV than the model has
            print(f"refused for {err.app}/{err.agent} on {err.model}: {err}")
        assert not arbiter.ledger.records and not arbiter.ledger.charges  # nothing was queued or charged


if __name__ == "__main__":
    asyncio.run(main())
