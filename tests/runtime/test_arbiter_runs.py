"""Runs on the live arbiter: every call of a run carries it, every run finishes, and stats count them."""

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fairagents as fa
from fairagents.testing import FakeEngine

MESSAGES = [{"role": "user", "content": "one two three"}]


async def play(policy, shapes):
    """Each shape is a run: stages of parallel calls, each stage after the last; every run concurrently."""
    arbiter = fa.Arbiter(policy=policy, in_flight=3)
    arbiter.add_model("m", FakeEngine(tokens_per_reply=2, token_time=0.0005))
    nodes = [arbiter.app("a").agent(name) for name in ("plan", "map", "join")]
    seen: list[tuple[str, str]] = []
    arbiter.runner.submitted.append(lambda request: seen.append((request.id, request.run)))

    async def run(i, stages):
        with arbiter.run(f"r{i}") as run_id:
            for width in stages:
                await asyncio.gather(*(nodes[k % 3].chat("m", MESSAGES, max_tokens=4) for k in range(width)))
            return run_id

    async with arbiter:
        ids = await asyncio.wait_for(asyncio.gather(*(run(i, s) for i, s in enumerate(shapes))), 30)
        stats = arbiter.stats()
    return ids, seen, stats


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(["hmfs", "hmfs_runs", "fcfs"]),
       st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=3), min_size=1, max_size=6))
def test_every_run_finishes_and_its_calls_carry_it(policy, shapes):
    ids, seen, stats = asyncio.run(play(policy, shapes))
    assert ids == [f"r{i}" for i in range(len(shapes))]
    calls = {}
    for _, run in seen:
        calls[run] = calls.get(run, 0) + 1
    assert calls == {f"r{i}": sum(s) for i, s in enumerate(shapes)}
    runs = stats.runs["a"]
    assert runs.completed == len(shapes) and runs.active == 0
    assert runs.calls == sum(map(sum, shapes))


def test_a_bad_run_id_is_refused_and_costs_nothing():
    async def main():
        arbiter = fa.Arbiter()
        arbiter.add_model("m", FakeEngine())
        bot = arbiter.app("a").agent("bot")
        async with arbiter:
            with pytest.raises(fa.InvalidParameterError):
                await bot.chat("m", MESSAGES, run="two words", max_tokens=2)
            return arbiter.stats()

    stats = asyncio.run(main())
    assert stats.apps["a"].service == 0 and stats.apps["a"].done == 0


def test_a_failing_submitted_hook_costs_the_request_nothing():
    async def main():
        arbiter = fa.Arbiter(in_flight=1)
        arbiter.add_model("m", FakeEngine(tokens_per_reply=2))
        bot = arbiter.app("a").agent("bot")

        def broken(request):
            raise ValueError("a hook's bug")

        arbiter.runner.submitted.append(broken)
        async with arbiter:
            first = await asyncio.wait_for(bot.chat("m", MESSAGES, max_tokens=4), 5)
            second = await asyncio.wait_for(bot.chat("m", MESSAGES, max_tokens=4), 5)  # the slot was freed
            return first, second, arbiter.pool_running

    first, second, running = asyncio.run(main())
    assert first.finish_reason == second.finish_reason == "stop" and running == 0
