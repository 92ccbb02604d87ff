"""Models that share one capacity: apps compete across models (FakeEngine: a test double that runs no model)."""

import asyncio

import fairagents as fa
from fairagents.testing import FakeEngine


def engine(width):
    return FakeEngine(tokens_per_reply=8, token_time=0.001, profile=fa.ModelProfile(d_model=width, n_layers=1))


async def main():
    arbiter = fa.Arbiter(pool_in_flight=2)  # at most 2 requests run across the pool
    arbiter.add_model("wide", engine(4096))  # 4x the unified tokens per token of "narrow"
    arbiter.add_model("narrow", engine(1024))
    a, b = arbiter.app("a").agent("bot"), arbiter.app("b").agent("bot")
    messages = [{"role": "user", "content": "go"}]
    async with arbiter:
        await asyncio.gather(*[a.chat("wide", messages) for _ in range(10)],
                             *[b.chat("narrow", messages) for _ in range(40)])
    done = {name: s.done for name, s in arbiter.stats().apps.items()}
    first = [r.app for r in sorted(arbiter.ledger.records, key=lambda r: r.dispatched)][:25]
    print(done, "b ran", first.count("b"), "of the first 25")  # ~4 of b's for each of a's while both waited
    assert done == {"a": 10, "b": 40}
    assert first.count("b") >= 18


if __name__ == "__main__":
    asyncio.run(main())
