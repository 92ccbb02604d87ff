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


@pytest.mark.parametrize("policy", ["hmfs", "edf"])
async def test_statera_admission_serves_on_the_real_engine_and_learns_lengths(admitted_engine, policy):
    """On vLLM's own KV capacity: once calibrated, requests reserve their predicted length, not max_tokens."""
    statera = fa.Statera()
    arbiter = fa.Arbiter(policy=policy, in_flight=4, admission=statera)
    arbiter.add_model("chat", admitted_engine)
    who = arbiter.app("a").agent("t")
    await arbiter.start()
    try:
        for _ in range(4):
            replies = await asyncio.gather(*(who.chat("chat", MSG, max_tokens=64, stop=(), ignore_eos=False,
                                                      seed=i) for i in range(8)))
            assert all(1 <= r.usage.completion_tokens <= 64 for r in replies)
        state = statera.states["chat"]
        assert state.budget_max == int(arbiter.token_budget_of("chat") * (1 - statera.frag))
        assert statera.calibrated >= 8
    finally:
        await arbiter.close(stop_engines=False)
    m = arbiter.dispatcher.model("chat")
    assert (m.running, m.reserved, m.used) == (0, 0, 0)
