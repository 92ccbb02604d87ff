"""``VLLMEngine(scheduler="fair")`` under the arbiter: handed everything, ordering by the pool's one set of counters."""

import asyncio

import pytest

import fairagents as fa

pytest.importorskip("vllm")
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.engine]

MSG = [{"role": "user", "content": "plan a route through the city"}]


async def test_the_arbiter_hands_a_fair_engine_everything_and_the_engine_keeps_apps_fair():
    from fairagents.engines.vllm import VLLMEngine

    engine = VLLMEngine(kv_cache_bytes=8 * 2**20, max_model_len=512, max_num_seqs=4, scheduler="fair")
    arbiter = fa.Arbiter(policy="fcfs")  # the arbiter's own order no longer matters: it queues nothing
    arbiter.add_model("chat", engine)
    flood, victim = arbiter.app("flood").agent("bulk"), arbiter.app("victim").agent("chat")
    finished = []

    async def call(who, tag):
        await who.chat("chat", MSG, max_tokens=32, ignore_eos=True)
        finished.append(tag)

    async with arbiter:
        assert arbiter.in_flight_limit("chat") > 1000 and arbiter.token_budget_of("chat") is None
        flood_calls = [asyncio.create_task(call(flood, "flood")) for _ in range(20)]
        await asyncio.sleep(0.05)  # the flood is in the engine first
        assert arbiter.queued("chat") == 0  # nothing waits in the arbiter: the engine holds it all
        await asyncio.gather(*[call(victim, "victim") for _ in range(4)], *flood_calls)
    assert engine.fair_counters is arbiter.fair_counters
    charged = arbiter.fair_counters.charged
    assert set(charged) == {"flood", "victim"}
    # FCFS inside the engine would finish the victim last; the engine's counters serve it alongside the flood
    assert max(i for i, tag in enumerate(finished) if tag == "victim") < 14


async def test_two_fair_engines_of_one_pool_share_counters_across_models():
    """``busy`` is served on model ``a`` while both apps wait on model ``b``: ``b`` goes mostly to ``fresh``."""
    from fairagents.engines.vllm import VLLMEngine

    engines = {"a": VLLMEngine(kv_cache_bytes=8 * 2**20, max_model_len=512, max_num_seqs=4, scheduler="fair"),
               "b": VLLMEngine(kv_cache_bytes=8 * 2**20, max_model_len=512, max_num_seqs=1, scheduler="fair")}
    arbiter = fa.Arbiter()
    for name, engine in engines.items():
        arbiter.add_model(name, engine)
    busy, fresh = arbiter.app("busy").agent("t"), arbiter.app("fresh").agent("t")
    on_b = []

    async def call_b(who, tag):
        await who.chat("b", MSG, max_tokens=8, ignore_eos=True)
        on_b.append(tag)

    async with arbiter:
        on_a = [asyncio.ensure_future(busy.chat("a", MSG, max_tokens=200, ignore_eos=True)) for _ in range(8)]
        counters = arbiter.fair_counters
        async with asyncio.timeout(60):
            while counters.charged.get("busy", 0.0) < 200:  # busy is being served on a (prompts charged, and more)
                await asyncio.sleep(0.01)
        # fresh's calls are handed over first: an order by arrival alone (per-model counters) would then
        # alternate after the first, so "mostly fresh" is the shared counters' doing, not who came first.
        await asyncio.gather(*on_a, *[call_b(fresh, "fresh") for _ in range(6)],
                             *[call_b(busy, "busy") for _ in range(6)])
    assert engines["a"].fair_counters is engines["b"].fair_counters is arbiter.fair_counters
    # Per-model counters would split b evenly between two backlogged apps. One set of
    # counters charges busy's service on a too, so fresh takes b while busy is served on a.
    assert on_b[:6].count("fresh") >= 5


async def test_a_started_fair_engine_brings_its_counters_to_the_next_arbiter():
    from fairagents.vllm.scheduler import FairCounters
    from fairagents.engines.vllm import VLLMEngine

    engine = VLLMEngine(kv_cache_bytes=8 * 2**20, max_model_len=512, max_num_seqs=2, scheduler="fair")
    first = fa.Arbiter()
    first.add_model("chat", engine)
    async with first:
        await first.app("a").agent("t").chat("chat", MSG, max_tokens=4)
    second = fa.Arbiter()
    second.add_model("chat", engine)  # the same engine, its counters with it
    assert second.fair_counters is first.fair_counters is engine.fair_counters
    third = fa.Arbiter()
    third.fair_counters = FairCounters()
    with pytest.raises(fa.InvalidParameterError, match="another arbiter's counters"):
        third.add_model("chat", engine)
