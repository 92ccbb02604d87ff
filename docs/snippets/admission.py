"""Statera admission: callers ask for 200 tokens and use 5; once calibrated, requests reserve what they use."""

import asyncio

import fairagents as fa
from fairagents.testing import FakeEngine


async def main():
    arbiter = fa.Arbiter(policy="hmfs", admission=fa.Statera(epsilon=0.05, frag=0.05))
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=5, token_time=0.001), token_budget=1000)
    bot = arbiter.app("docs").agent("writer")
    messages = [{"role": "user", "content": "go"}]
    async with arbiter:
        for _ in range(4):  # rounds of 8 requests asking max_tokens=200
            await asyncio.gather(*[bot.chat("chat", messages, max_tokens=200) for _ in range(8)])
    statera = arbiter.admission
    print(statera.covered, "of", statera.calibrated, "within their bound")
    assert statera.calibrated >= 16 and statera.covered == statera.calibrated
    assert statera.states["chat"].budget_max == 950  # 1000 tokens less the 5 % fragmentation margin


if __name__ == "__main__":
    asyncio.run(main())
