"""Every built-in policy serves on the real tiny engine, through the arbiter."""

import asyncio

import pytest

import fairagents as fa

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.engine]

MSG = [{"role": "user", "content": "plan a route through the city"}]


@pytest.mark.parametrize("policy", sorted(fa.policies.POLICIES))
async def test_every_policy_serves_two_apps_on_the_real_engine(text_engine, policy):
    arbiter = fa.Arbiter(policy=policy, in_flight=2)
    arbiter.add_model("chat", text_engine)
    agents = [arbiter.app(name, slo=fa.SLO(ttft=5.0, tpot=1.0, e2e=20.0)).agent("t") for name in ("a", "b")]
    await arbiter.start()
    try:
        replies = await asyncio.gather(*(
            who.chat("chat", MSG, max_tokens=4 + i, ignore_eos=True) for i in range(3) for who in agents
        ))
    finally:
        await arbiter.close(stop_engines=False)  # the session's engine outlives the test
    assert sorted(r.usage.completion_tokens for r in replies) == [4, 4, 5, 5, 6, 6]
    stats = arbiter.stats()
    assert stats.apps["a"].done == stats.apps["b"].done == 3
    assert arbiter.policy.queued() == 0 and arbiter.policy.running() == 0
