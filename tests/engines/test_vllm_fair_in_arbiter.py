"""``VLLMEngine()`` (``scheduler="fair"``, the default) under the arbiter: handed each request at once, ordering by the arbiter's policy."""

import asyncio

import pytest

import fairagents as fa

pytest.importorskip("vllm")
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.engine]

MSG = [{"role": "user", "content": "plan a route through the city"}]


async def test_the_arbiter_hands_a_fair_engine_everything_and_the_engine_keeps_apps_fair():
    from fairagents.engines.vllm import VLLMEngine

    engine = VLLMEngine(kv_cache_bytes=8 * 2**20, max_model_len=512, max_num_seqs=4)
    arbiter = fa.Arbiter(policy="hmfs")
    arbiter.add_model("chat", engine)
    flood, victim = arbiter.app("flood").agent("bulk"), arbiter.app("victim").agent("chat")
    finished = []

    async def call(who, tag):
        await who.chat("chat", MSG, max_tokens=32, ignore_eos=True)
        finished.append(tag)

    async with arbiter:
        assert arbiter.in_flight_limit("chat") == 4 and arbiter.token_budget_of("chat") is None  # the batch's size
        flood_calls = [asyncio.create_task(call(flood, "flood")) for _ in range(20)]
        await asyncio.sleep(0.05)  # the flood is in the engine first
        assert arbiter.dispatcher.model("chat").running == 20  # all handed over: the engine holds them
        assert arbiter.queued("chat") >= 16  # waiting in the engine's queue, for their first token
        await asyncio.gather(*[call(victim, "victim") for _ in range(4)], *flood_calls)
    seat = arbiter.pool_policy
    assert engine.pool_policy is seat and seat.policy is arbiter.policy  # the engine orders by the arbiter's policy
    assert set(seat.charged) == {"flood", "victim"}
    # FCFS inside the engine would finish the victim last; the arbiter's HMFS serves it alongside the flood
    assert max(i for i, tag in enumerate(finished) if tag == "victim") < 14
    # the engine's charges are the arbiter's ledger's: each prompt once, and the output produced
    ledger = arbiter.stats().apps
    assert seat.charged == pytest.approx({app: ledger[app].service for app in ("flood", "victim")})
    assert arbiter.policy.queued() == arbiter.policy.running() == 0 and seat.held() == 0


@pytest.mark.parametrize("policy", sorted(fa.policies.POLICIES))
async def test_every_policy_orders_the_engines_own_queue(text_engine, policy):
    """The policy contract inside the engine: more calls than the batch holds, every one served once, nothing left."""
    arbiter = fa.Arbiter(policy=policy)
    arbiter.add_model("chat", text_engine)
    agents = [arbiter.app(name, slo=fa.SLO(ttft=5.0, tpot=1.0, e2e=20.0)).agent("t") for name in ("a", "b")]
    await arbiter.start()
    try:
        assert arbiter.dispatcher.model("chat").in_engine
        replies = await asyncio.gather(*(
            who.chat("chat", MSG, max_tokens=4 + i % 3, ignore_eos=True) for i in range(40) for who in agents))
    finally:
        await arbiter.close(stop_engines=False)  # the session's engine outlives the test
    assert len(replies) == 80 and all(r.usage.completion_tokens in (4, 5, 6) for r in replies)
    seat = arbiter.pool_policy
    assert text_engine.pool_policy is seat
    assert arbiter.policy.queued() == 0 and seat.held() == 0
    assert getattr(arbiter.policy, "running", lambda: 0)() == 0
    assert seat.charged == pytest.approx({app: s.service for app, s in arbiter.stats().apps.items()})


async def test_two_engines_of_one_pool_share_the_arbiters_policy_across_models():
    """``busy`` is served on model ``a`` while both apps wait on model ``b``: ``b`` goes mostly to ``fresh``."""
    from fairagents.engines.vllm import VLLMEngine

    engines = {"a": VLLMEngine(kv_cache_bytes=8 * 2**20, max_model_len=512, max_num_seqs=4),
               "b": VLLMEngine(kv_cache_bytes=8 * 2**20, max_model_len=512, max_num_seqs=1)}
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
        counters = arbiter.pool_policy
        async with asyncio.timeout(60):
            while counters.charged.get("busy", 0.0) < 200:  # busy is being served on a (prompts charged, and more)
                await asyncio.sleep(0.01)
        # fresh's calls are handed over first: an order by arrival alone (per-model counters) would then
        # alternate after the first, so "mostly fresh" is the shared counters' doing, not who came first.
        await asyncio.gather(*on_a, *[call_b(fresh, "fresh") for _ in range(6)],
                             *[call_b(busy, "busy") for _ in range(6)])
    assert engines["a"].pool_policy is engines["b"].pool_policy is arbiter.pool_policy
    # Per-model counters would split b evenly between two backlogged apps. One set of
    # counters charges busy's service on a too, so fresh takes b while busy is served on a.
    assert on_b[:6].count("fresh") >= 5


async def test_an_idle_engine_follows_the_policy_of_the_arbiter_it_joins():
    from fairagents.engines.vllm import VLLMEngine

    engine = VLLMEngine(kv_cache_bytes=8 * 2**20, max_model_len=512, max_num_seqs=2)
    first = fa.Arbiter()
    first.add_model("chat", engine)
    async with first:
        await first.app("a").agent("t").chat("chat", MSG, max_tokens=4)
        busy = asyncio.ensure_future(first.app("a").agent("t").chat("chat", MSG, max_tokens=200, ignore_eos=True))
        await asyncio.sleep(0.2)
        with pytest.raises(fa.InvalidParameterError, match="running under another arbiter's policy"):
            fa.Arbiter(policy="fcfs").add_model("chat", engine)  # it serves the first arbiter's requests
        await busy
    await engine.start()  # started again, idle: the next arbiter's policy takes over
    second = fa.Arbiter(policy="vtc")
    second.add_model("chat", engine)
    assert engine.pool_policy is second.pool_policy and engine.pool_policy.policy.name == "vtc"
    async with second:
        await second.app("b").agent("t").chat("chat", MSG, max_tokens=4)
    assert set(second.pool_policy.charged) == {"b"} and set(first.pool_policy.charged) == {"a"}


async def test_an_agent_resending_its_history_pays_for_what_the_engine_computes(text_engine):
    """The second turn's prompt is mostly the first turn's, read from vLLM's prefix cache: charged at ``w_cached``,
    in the engine's policy and in the arbiter's ledger alike."""
    arbiter = fa.Arbiter(policy="hmfs")
    arbiter.add_model("chat", text_engine)
    who = arbiter.app("notes").agent("writer")
    history = [{"role": "user", "content": " ".join(f"note {i} on the harbour cranes" for i in range(40))}]
    await arbiter.start()
    try:
        first = await who.chat("chat", history, max_tokens=4, ignore_eos=True)
        turn = [*history, {"role": "assistant", "content": first.text}, {"role": "user", "content": "and then?"}]
        second = await who.chat("chat", turn, max_tokens=4, ignore_eos=True)
    finally:
        await arbiter.close(stop_engines=False)  # the session's engine outlives the test
    cost = arbiter.cost
    assert first.usage.cached_tokens == 0 and first.usage.unified_tokens == pytest.approx(
        cost.input_cost("chat", first.usage.prompt_tokens) + cost.output_cost("chat", 4))
    hits = second.usage.cached_tokens
    assert 0.8 * first.usage.prompt_tokens <= hits < second.usage.prompt_tokens  # its history: whole cached blocks
    assert second.usage.unified_tokens == pytest.approx(
        fa.prompt_cost(cost, "chat", second.usage.prompt_tokens, hits) + cost.output_cost("chat", 4))
    assert second.usage.unified_tokens < 0.5 * cost.input_cost("chat", second.usage.prompt_tokens)
    seat = arbiter.pool_policy  # the engine charged the policy the same
    assert seat.charged == pytest.approx({"notes": first.usage.unified_tokens + second.usage.unified_tokens})
    assert seat.tally("chat").cached == hits


CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
WEATHER = [{"type": "function", "function": {"name": "weather", "parameters": CITY}}]


@pytest.mark.parametrize(("level", "calls"), [("apps", "chat"), ("agents of one app", "chat"),
                                              ("agents of one app", "tool call")])
async def test_the_engine_holds_a_client_ahead_while_one_behind_waits_on_another_engine_of_its_device(
        text_engine, level, calls):
    """One device, one order: vLLM's batch takes no new request of a client ahead while one behind waits elsewhere."""
    from fairagents.testing import FakeEngine

    image = FakeEngine(manual=True)  # a model of the same device, one request at a time, released by hand
    arbiter = fa.Arbiter(policy="hmfs")
    arbiter.add_model("chat", text_engine)
    arbiter.add_model("image", image, in_flight=1)
    assert arbiter.devices == {"local": ["chat", "image"]}
    if level == "apps":
        ahead, behind = arbiter.app("ahead").agent("t"), arbiter.app("behind").agent("t")
    else:  # a writer on the LLM and an illustrator on the image model, of one app
        ahead, behind = arbiter.app("studio").agent("writer"), arbiter.app("studio").agent("illustrator")
    ahead_app = "ahead" if level == "apps" else "studio"

    async def until(condition):
        for _ in range(500):
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("not reached")

    async with arbiter:
        running = asyncio.create_task(behind.chat("image", MSG, max_tokens=4))
        await until(lambda: len(image.running) == 1)
        waiting = asyncio.create_task(behind.chat("image", MSG, max_tokens=4))  # waits on the image model
        await ahead.chat("chat", MSG, max_tokens=16, ignore_eos=True)  # 'ahead' is now served beyond 'behind'
        who = arbiter.tenants.resolve(ahead)
        served = arbiter.ledger.service_of(ahead_app, who.name)
        ask = {"max_tokens": 4, "ignore_eos": True} if calls == "chat" else {
            "max_tokens": 64, "tools": WEATHER, "tool_choice": "required", "parallel_tool_calls": False}
        held = asyncio.create_task(ahead.chat("chat", MSG, **ask))
        await asyncio.sleep(0.5)  # the engine looks again every few milliseconds: it does not take the request
        assert not held.done() and arbiter.ledger.service_of(ahead_app, who.name) == served
        assert arbiter.pool_policy.holds("chat", who)
        first = next(iter(image.running))
        image.emit(first, 1, finish="stop")  # the image model frees its slot: 'behind' runs and catches up
        await until(lambda: len(image.running) == 1 and first not in image.running)
        image.emit(next(iter(image.running)), 40, finish="stop")
        await asyncio.gather(running, waiting)
        reply = await asyncio.wait_for(held, 30)
    if calls == "chat":
        assert reply.usage.completion_tokens == 4
    else:  # its grammar compiled while it was held: the call comes out whole once the client has caught up
        [call] = reply.tool_calls
        assert call.name == "weather" and reply.finish_reason == "tool_calls"
