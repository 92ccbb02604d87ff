"""The arbiter on a FakeEngine (a test double): API, identity, faults and bad input, in milliseconds."""

import asyncio
import contextlib

import pytest

import fairagents as fa
from fairagents.testing import FakeClock, FakeEngine, RecordingPolicy

MSG = [{"role": "user", "content": "hello there"}]


def make(policy="hmfs", in_flight=4, **engine_kw):
    arbiter = fa.Arbiter(policy=policy, in_flight=in_flight, drain_timeout=1.0)
    engine = FakeEngine(**engine_kw)
    arbiter.add_model("chat", engine)
    return arbiter, engine


def nothing_happened(arbiter):
    assert arbiter.policy.queued() == 0
    assert not arbiter.ledger.charges and not arbiter.ledger.records


async def test_chat_returns_text_usage_and_timing():
    arbiter, _ = make(tokens_per_reply=5)
    planner = arbiter.app("driving", weight=2.0).agent("planner", slo=fa.SLO(ttft=1.0))
    async with arbiter:
        reply = await planner.chat("chat", MSG, max_tokens=32)
    assert reply.text == "t0 t1 t2 t3 t4 " and reply.finish_reason == "stop"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 5)
    assert reply.usage.unified_tokens == 3 + 2 * 5  # FakeEngine's profile has scale 1
    assert 0 <= reply.timing.queue_wait <= reply.timing.ttft <= reply.timing.e2e
    stats = arbiter.stats()
    assert stats.apps["driving"].done == 1 and stats.apps["driving"].service == 13
    assert stats.agents["driving/planner"].share == 1.0


async def test_finish_reason_length_and_streaming():
    arbiter, _ = make(tokens_per_reply=10)
    a = arbiter.app("a").agent("t")
    async with arbiter:
        deltas = [d async for d in a.stream_chat("chat", MSG, max_tokens=3)]
    assert [d.text for d in deltas] == ["t0 ", "t1 ", "t2 "]
    assert deltas[-1].finish_reason == "length"


async def test_identity_from_context_and_decorator():
    arbiter, _ = make()
    planner = arbiter.app("driving").agent("planner")

    @fa.agent(app="driving", name="planner")
    async def plan():
        return await arbiter.chat("chat", MSG)

    async with arbiter:
        with fa.acting_as(planner):
            await arbiter.chat("chat", MSG)
        await plan()
    assert arbiter.stats().agents["driving/planner"].done == 2


async def test_an_agent_may_be_named_as_app_slash_agent_or_by_a_name_one_app_declares():
    arbiter, _ = make()
    arbiter.app("driving").agent("planner")
    arbiter.app("driving").agent("writer")
    arbiter.app("studio").agent("writer")
    async with arbiter:
        await arbiter.chat("chat", MSG, agent="planner", max_tokens=2)
        await arbiter.chat("chat", MSG, agent="studio/writer", max_tokens=2)
        with pytest.raises(fa.UnknownAgentError, match="declared in apps 'driving', 'studio'"):
            await arbiter.chat("chat", MSG, agent="writer", max_tokens=2)
    agents = arbiter.stats().agents
    assert agents["driving/planner"].done == agents["studio/writer"].done == 1
    assert agents["driving/writer"].done == 0


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda ar, a: ar.chat("nope", MSG, agent=a), fa.UnknownModelError),
        (lambda ar, a: ar.chat("chat", MSG, agent=fa.Agent("t", fa.App("ghost"))), fa.UnknownAppError),
        (lambda ar, a: ar.chat("chat", MSG, agent=fa.Agent("ghost", fa.App("a"))), fa.UnknownAgentError),
        (lambda ar, a: ar.chat("chat", MSG), fa.UnknownAgentError),  # nobody bound
        (lambda ar, a: ar.chat("chat", [], agent=a), fa.InvalidParameterError),
        (lambda ar, a: ar.chat("chat", "hi", agent=a), fa.InvalidParameterError),
        (lambda ar, a: ar.chat("chat", [{"content": "x"}], agent=a), fa.InvalidParameterError),
        (lambda ar, a: ar.chat("chat", MSG, agent=a, max_tokens=0), fa.InvalidParameterError),
        (lambda ar, a: ar.chat("chat", MSG, agent=a, max_tokens=-5), fa.InvalidParameterError),
        (lambda ar, a: ar.chat("chat", MSG, agent=a, temperature=-1), fa.InvalidParameterError),
        (lambda ar, a: ar.chat("chat", MSG, agent=a, temperature=2.5), fa.InvalidParameterError),  # vLLM: [0, 2]
        (lambda ar, a: ar.chat("chat", MSG, agent=a, max_tokens=100), fa.ContextLengthError),
        (lambda ar, a: ar.chat("chat", MSG, agent="planner"), fa.UnknownAgentError),  # a name nobody declared
        (lambda ar, a: ar.chat("chat", MSG, agent=42), fa.InvalidParameterError),
    ],
)
async def test_bad_input_is_a_typed_value_error_and_costs_nothing(call, error):
    arbiter, engine = make(max_model_len=64)
    a = arbiter.app("a").agent("t")
    async with arbiter:
        with pytest.raises(error) as info:
            await call(arbiter, a)
        assert isinstance(info.value, ValueError)
        nothing_happened(arbiter)
        assert (await a.chat("chat", MSG, max_tokens=4)).usage.completion_tokens == 4  # others unaffected
    assert engine.started_order and len(engine.started_order) == 1


async def test_in_flight_limit_keeps_the_engine_queue_short():
    arbiter, engine = make(in_flight=3, tokens_per_reply=4, token_time=0.001)
    agents = [arbiter.app(f"a{i}").agent("t") for i in range(4)]
    async with arbiter:
        await asyncio.gather(*(a.chat("chat", MSG) for a in agents for _ in range(5)))
    assert engine.max_running == 3


async def test_hmfs_serves_a_victim_before_a_flood_backlog_and_fcfs_does_not():
    async def victim_position(policy):
        arbiter, engine = make(policy=policy, in_flight=1, tokens_per_reply=2, token_time=0.001)
        flood, victim = arbiter.app("flood").agent("t"), arbiter.app("victim").agent("t")
        async with arbiter:
            tasks = [asyncio.create_task(flood.chat("chat", MSG)) for _ in range(20)]
            await asyncio.sleep(0.005)
            v = asyncio.create_task(victim.chat("chat", MSG))
            await asyncio.gather(*tasks, v)
        return engine.started_order.index((await v).request_id)

    assert await victim_position("hmfs") <= 3
    assert await victim_position("fcfs") == 20


async def test_cancel_while_queued_leaves_the_queue_uncharged():
    arbiter, engine = make(in_flight=1, tokens_per_reply=50, token_time=0.002)
    a, b = arbiter.app("a").agent("t"), arbiter.app("b").agent("t")
    async with arbiter:
        first = asyncio.create_task(a.chat("chat", MSG))
        await asyncio.sleep(0.005)
        queued = asyncio.create_task(b.chat("chat", MSG))
        await asyncio.sleep(0.005)
        assert arbiter.stats().apps["b"].queued == 1
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert arbiter.stats().apps["b"].queued == 0 and arbiter.policy.queued() == 0
        await first
    assert arbiter.ledger.service_of("b") == 0.0
    assert arbiter.stats().apps["b"].cancelled == 1
    assert len(engine.started_order) == 1


async def test_timeout_while_running_aborts_and_charges_only_what_was_produced():
    arbiter, engine = make(in_flight=1, tokens_per_reply=1000, token_time=0.002)
    a = arbiter.app("a").agent("t")
    async with arbiter:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await a.chat("chat", MSG, max_tokens=1000)
        (record,) = arbiter.ledger.records
        assert record.outcome is fa.Outcome.CANCELLED and 0 < record.output_tokens < 1000
        assert arbiter.ledger.service_of("a") == 3 + 2 * record.output_tokens
        assert engine.running == set()
        # the slot was released: the next request runs at once
        assert (await a.chat("chat", MSG, max_tokens=2)).usage.completion_tokens == 2


async def test_breaking_out_of_a_stream_cancels_the_request():
    arbiter, engine = make(in_flight=1, tokens_per_reply=100)
    a = arbiter.app("a").agent("t")
    async with arbiter:
        async with contextlib.aclosing(a.stream_chat("chat", MSG, max_tokens=100)) as stream:
            n = 0
            async for _ in stream:
                n += 1
                if n == 3:
                    break
        (record,) = arbiter.ledger.records
        assert record.outcome is fa.Outcome.CANCELLED and record.output_tokens == 3
        assert arbiter.policy.running() == 0 and engine.running == set()


async def test_engine_failure_fails_its_requests_and_spares_other_models():
    arbiter = fa.Arbiter(in_flight=1)
    broken, healthy = FakeEngine(tokens_per_reply=100, token_time=0.002), FakeEngine(tokens_per_reply=3)
    arbiter.add_model("broken", broken)
    arbiter.add_model("healthy", healthy)
    a = arbiter.app("a").agent("t")
    async with arbiter:
        running = asyncio.create_task(a.chat("broken", MSG))
        queued = asyncio.create_task(a.chat("broken", MSG))
        await asyncio.sleep(0.01)
        broken.fail()
        for task in (running, queued):
            with pytest.raises(fa.EngineError):
                await task
        with pytest.raises(fa.EngineError, match="down"):
            await a.chat("broken", MSG)
        assert (await a.chat("healthy", MSG)).usage.completion_tokens == 3
    assert arbiter.stats().apps["a"].failed == 2


async def test_exit_drains_then_aborts_the_rest_with_shutdown_error():
    arbiter, engine = make(in_flight=1, tokens_per_reply=1000, token_time=0.002)
    arbiter.drain_timeout = 0.05
    a = arbiter.app("a").agent("t")
    quick = long = None
    async with arbiter:
        long = asyncio.create_task(a.chat("chat", MSG, max_tokens=1000))
        quick = asyncio.create_task(a.chat("chat", MSG, max_tokens=1000))
        await asyncio.sleep(0.01)
    for task in (long, quick):
        with pytest.raises(fa.ShutdownError):
            await task
    assert engine.running == set() and not engine.started
    with pytest.raises(fa.ShutdownError):
        await a.chat("chat", MSG)


async def test_exit_waits_for_work_that_finishes_in_time():
    arbiter, _ = make(in_flight=1, tokens_per_reply=5, token_time=0.001)
    a = arbiter.app("a").agent("t")
    async with arbiter:
        tasks = [asyncio.create_task(a.chat("chat", MSG)) for _ in range(3)]
        await asyncio.sleep(0)
    assert [t.result().usage.completion_tokens for t in tasks] == [5, 5, 5]


def test_declarations_are_checked():
    arbiter, _ = make()
    app = arbiter.app("a", weight=2.0)
    assert arbiter.app("a", weight=2.0).identity is app.identity
    with pytest.raises(fa.InvalidParameterError):
        arbiter.app("a", weight=3.0)
    app.agent("t")
    with pytest.raises(fa.InvalidParameterError):
        app.agent("t", weight=5.0)
    with pytest.raises(fa.InvalidParameterError):
        arbiter.add_model("chat", FakeEngine())
    with pytest.raises(fa.InvalidParameterError):
        fa.Arbiter(in_flight=0)


async def test_a_dropped_stream_is_cleaned_up_by_the_event_loop():
    arbiter, engine = make(in_flight=1, tokens_per_reply=100)
    a = arbiter.app("a").agent("t")
    async with arbiter:
        async for _ in a.stream_chat("chat", MSG, max_tokens=100):
            break  # no aclosing: the loop's async-generator finalizer closes it
        for _ in range(50):
            if arbiter.ledger.records:
                break
            await asyncio.sleep(0.001)
        assert arbiter.ledger.records[0].outcome is fa.Outcome.CANCELLED
        assert engine.running == set()


async def test_an_app_past_its_queue_bound_is_overloaded_and_nothing_is_queued():
    arbiter, engine = make(in_flight=1, tokens_per_reply=3, token_time=0.002)
    flood, other = arbiter.app("flood", max_queued=2).agent("t"), arbiter.app("other").agent("t")
    async with arbiter:
        await flood.chat("chat", MSG)  # gives the retry hint a measured run time
        tasks = [asyncio.create_task(flood.chat("chat", MSG)) for _ in range(3)]  # one runs, two wait
        await asyncio.sleep(0)
        with pytest.raises(fa.errors.OverloadedError) as info:
            await flood.chat("chat", MSG)
        assert not isinstance(info.value, ValueError)
        assert 0.05 <= info.value.retry_after < 1.0
        assert arbiter.stats().apps["flood"].queued == 2
        assert (await other.chat("chat", MSG)).usage.completion_tokens == 3  # other apps are not bounded by it
        await asyncio.gather(*tasks)
        assert (await flood.chat("chat", MSG)).usage.completion_tokens == 3  # room again
    assert arbiter.stats().apps["flood"].done == 5 and len(engine.started_order) == 6
    with pytest.raises(fa.InvalidParameterError):
        arbiter.app("flood")  # declared with another bound
    with pytest.raises(fa.InvalidParameterError):
        arbiter.app("x", max_queued=0)


async def test_complete_takes_text_or_a_prepared_prompt():
    arbiter, engine = make(tokens_per_reply=4)
    a = arbiter.app("a").agent("t")
    async with arbiter:
        reply = await a.complete("chat", "once upon a time", max_tokens=8)
        assert reply.usage.prompt_tokens == 5 and reply.usage.completion_tokens == 4
        deltas = [d async for d in a.stream_complete("chat", engine.prepare_chat(MSG), max_tokens=2)]
        assert [d.finish_reason for d in deltas] == [None, "length"]
        for bad in ("", fa.engines.Prompt(token_ids=()), ["not", "text"]):
            with pytest.raises(fa.InvalidParameterError):
                await a.complete("chat", bad)
    assert arbiter.stats().apps["a"].done == 2


async def test_listeners_see_every_record_and_a_failing_one_is_contained():
    arbiter, _ = make(tokens_per_reply=2)
    seen = []
    arbiter.add_listener(seen.append)
    arbiter.add_listener(lambda record: 1 / 0)
    a = arbiter.app("a").agent("t")
    async with arbiter:
        reply = await a.chat("chat", MSG)
    assert [(r.id, r.outcome, r.output_tokens) for r in seen] == [(reply.request_id, fa.Outcome.FINISHED, 2)]


async def test_request_ids_are_unique_across_arbiters_sharing_an_engine():
    engine = FakeEngine(tokens_per_reply=1)
    ids = []
    for _ in range(2):
        arbiter = fa.Arbiter()
        arbiter.add_model("chat", engine)
        a = arbiter.app("a").agent("t")
        async with arbiter:
            ids += [(await a.chat("chat", MSG)).request_id for _ in range(3)]
    assert len(set(ids)) == 6


# -- a pool-wide in-flight limit: apps compete across models ------------------------


def pooled(policy, pool_in_flight=1, token_time=0.001, in_flight=None):
    """Two models sharing a pool: 'big' costs 4x 'small' per token (unified)."""
    recording = RecordingPolicy(fa.policies.make_policy(policy, fa.UnifiedTokenCost(d_base=64)))
    arbiter = fa.Arbiter(policy=recording, pool_in_flight=pool_in_flight, in_flight=in_flight, d_base=64,
                         drain_timeout=1.0)
    big = FakeEngine(tokens_per_reply=2, token_time=token_time, profile=fa.ModelProfile(d_model=128, n_layers=2))
    small = FakeEngine(tokens_per_reply=2, token_time=token_time, profile=fa.ModelProfile(d_model=64, n_layers=1))
    arbiter.add_model("big", big)
    arbiter.add_model("small", small)
    return arbiter, big, small


async def backlog(arbiter, n=12):
    a, b = arbiter.app("a").agent("t"), arbiter.app("b").agent("t")
    calls = [a.chat("big", MSG) for _ in range(n)] + [b.chat("small", MSG) for _ in range(n)]
    return await asyncio.gather(*calls)


async def test_pool_limit_bounds_requests_in_flight_across_models():
    arbiter, big, small = pooled("fcfs", pool_in_flight=3)
    async with arbiter:
        replies = await backlog(arbiter, n=6)
    assert len(replies) == 12
    records = arbiter.ledger.records
    events = sorted([(r.dispatched, 1) for r in records] + [(r.finished, -1) for r in records])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak == 3 and big.max_running <= 3 and small.max_running <= 3
    assert arbiter.pool_running == 0


async def test_hmfs_splits_the_pool_by_unified_tokens():
    # A request on 'big' costs 4x one on 'small' (3 prompt + 2x2 output tokens, scaled by 4
    # or 1): with one slot for the pool, b's cheap requests take four turns for each of a's.
    arbiter, _, _ = pooled("hmfs")
    async with arbiter:
        await backlog(arbiter, n=20)
    apps = "".join(d.app for d in arbiter.policy.decisions)
    # a's first request runs alone before b arrives (b is lifted to a's counter), then 1:4
    assert apps[1:21].count("a") == 4, apps
    service = {name: s.service for name, s in arbiter.stats().apps.items()}
    assert service["a"] == 20 * 28 and service["b"] == 20 * 7


async def test_vtc_splits_the_pool_by_raw_tokens():
    arbiter, _, _ = pooled("vtc")
    async with arbiter:
        await backlog(arbiter, n=20)
    apps = "".join(d.app for d in arbiter.policy.decisions)
    assert apps[:20].count("a") == 10, apps


async def test_without_a_pool_limit_models_do_not_compete():
    arbiter = fa.Arbiter(RecordingPolicy(fa.policies.HMFS(fa.UnifiedTokenCost(d_base=64))), in_flight=1)
    arbiter.add_model("big", FakeEngine(tokens_per_reply=2, token_time=0.001,
                                        profile=fa.ModelProfile(d_model=128, n_layers=2)))
    arbiter.add_model("small", FakeEngine(tokens_per_reply=2, token_time=0.001,
                                          profile=fa.ModelProfile(d_model=64, n_layers=1)))
    async with arbiter:
        await backlog(arbiter, n=4)
    apps = [d.app for d in arbiter.policy.decisions[:2]]
    assert sorted(apps) == ["a", "b"]  # one of each at once: each model has its own slot


async def test_a_cancelled_or_failed_request_gives_its_pool_slot_back():
    arbiter, big, small = pooled("hmfs", token_time=0.05)
    a, b = arbiter.app("a").agent("t"), arbiter.app("b").agent("t")
    async with arbiter:
        slow = asyncio.create_task(a.chat("big", MSG))
        await asyncio.sleep(0.02)
        assert arbiter.pool_running == 1
        slow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await slow
        assert arbiter.pool_running == 0
        big.fail()
        with pytest.raises(fa.EngineError):
            await a.chat("big", MSG)
        reply = await b.chat("small", MSG)  # the failure leaked no slot
    assert reply.usage.completion_tokens == 2 and arbiter.pool_running == 0


async def test_pool_limit_is_validated_and_tightens_the_bound():
    with pytest.raises(fa.InvalidParameterError):
        fa.Arbiter(pool_in_flight=0)
    free, _, _ = pooled("hmfs", pool_in_flight=None, in_flight=4)
    one, _, _ = pooled("hmfs", pool_in_flight=1, in_flight=4)
    async with free, one:
        # 4 requests of 10 tokens on each model (scale 4 and 1), charged at most 2x: 2*(160+40);
        # one pool slot holds one request at a time, the dearest: 2*40
        assert free.bound(10) == 400.0 and one.bound(10) == 80.0


# -- regressions: races, pricing and lifecycle traps ---------------------------------------------


async def settle(rounds=10):
    for _ in range(rounds):
        await asyncio.sleep(0)


async def test_a_finish_and_a_waiting_callers_cancel_in_one_tick_harm_neither():
    """A finishes and B (waiting) is cancelled in the same loop tick: B must not be dispatched."""
    engine = FakeEngine(manual=True)
    arbiter = fa.Arbiter(in_flight=1, drain_timeout=1.0)
    arbiter.add_model("chat", engine)
    records = []
    arbiter.add_listener(records.append)
    a, b = arbiter.app("a").agent("t"), arbiter.app("b").agent("t")
    async with arbiter:
        first = asyncio.create_task(a.chat("chat", MSG))
        await settle()
        second = asyncio.create_task(b.chat("chat", MSG))
        await settle()
        [running] = engine.running
        engine.emit(running, 2, finish="stop")
        second.cancel()
        reply = await first  # no InvalidStateError leaks into A's caller
        with pytest.raises(asyncio.CancelledError):
            await second
        assert reply.usage.completion_tokens == 2
    assert engine.started_order == [running]  # B never reached the engine
    by_app = {r.app: r for r in records}
    assert by_app["b"].outcome is fa.Outcome.CANCELLED and by_app["b"].dispatched is None
    assert sum(c.amount for c in arbiter.ledger.charges) == reply.usage.unified_tokens  # B was charged nothing
    assert arbiter.pool_running == 0 and not arbiter.stats().apps["b"].queued


async def test_close_after_the_drain_timeout_fails_waiting_and_running_alike():
    engine = FakeEngine(manual=True)
    arbiter = fa.Arbiter(in_flight=1)
    arbiter.add_model("chat", engine)
    who = arbiter.app("a").agent("t")
    await arbiter.start()
    tasks = [asyncio.create_task(who.chat("chat", MSG)) for _ in range(3)]
    await settle()
    await arbiter.close(timeout=0.01)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [type(r) for r in results] == [fa.ShutdownError] * 3
    assert {r.outcome for r in arbiter.ledger.records} == {fa.Outcome.FAILED}
    assert len(arbiter.ledger.records) == 3
    assert sum(c.amount for c in arbiter.ledger.charges) == 3  # only the running one's input (3 tokens)


async def test_close_waits_abort_timeout_for_an_aborted_request_whose_caller_stopped_reading():
    arbiter, _ = make(tokens_per_reply=100)
    who = arbiter.app("a").agent("t")
    await arbiter.start()
    stream = who.stream_chat("chat", MSG)
    await anext(stream)  # running; its caller reads no further, so the abort reaches it only when it reads again
    loop = asyncio.get_running_loop()
    started = loop.time()
    await arbiter.close(timeout=0, abort_timeout=0.05)
    assert loop.time() - started < 1  # not the default 5 s
    with pytest.raises(fa.ShutdownError):
        await anext(stream)
    await stream.aclose()


@pytest.mark.parametrize("policy", [fa.policies.HMFS(), fa.policies.VTC(fa.UnifiedTokenCost())],
                         ids=["HMFS()", "VTC(UnifiedTokenCost())"])
async def test_a_policy_object_prices_with_the_arbiter_on_one_path(policy):
    arbiter = fa.Arbiter(policy=policy)
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=2, profile=fa.ModelProfile(d_model=8192, n_layers=1)))
    who = arbiter.app("a").agent("t")
    async with arbiter:
        reply = await who.chat("chat", MSG)
    assert arbiter.cost is policy.cost
    assert reply.usage.unified_tokens == 2 * (3 + 2 * 2)  # width 8192 over d_base 4096
    counters = policy.app_counters() if isinstance(policy, fa.policies.HMFS) else policy.counters()
    assert counters["a"] == reply.usage.unified_tokens == arbiter.stats().apps["a"].service


def test_a_policy_object_and_contradicting_pricing_is_an_error():
    with pytest.raises(fa.InvalidParameterError, match="w_output=2.0, not 3.0"):
        fa.Arbiter(policy=fa.policies.HMFS(), w_output=3.0)
    assert fa.Arbiter(policy=fa.policies.HMFS(), w_output=2.0).cost.w_output == 2.0


async def test_the_policy_is_fixed_at_construction():
    with pytest.raises(AttributeError):
        fa.Arbiter().policy = fa.policies.FCFS()


async def test_a_model_added_to_a_running_arbiter_is_started():
    arbiter, _ = make()
    who = arbiter.app("a").agent("t")
    late = FakeEngine(tokens_per_reply=1)
    async with arbiter:
        with pytest.raises(fa.InvalidParameterError, match="start_model"):
            arbiter.add_model("late", late)
        assert "late" not in arbiter.models
        await arbiter.start_model("late", late, in_flight=2)
        assert late.started and arbiter.in_flight_limit("late") == 2
        assert (await who.chat("late", MSG)).usage.completion_tokens == 1


class _Broken(FakeEngine):
    async def start(self):
        await asyncio.sleep(0.01)
        raise fa.EngineError("no such model")


async def test_a_start_that_fails_part_way_stops_the_engines_it_started():
    arbiter, good = make()
    arbiter.add_model("broken", _Broken())
    with pytest.raises(fa.EngineError, match="no such model"):
        await arbiter.start()
    assert not good.started
    with pytest.raises(fa.ShutdownError):
        await arbiter.app("a").agent("t").chat("chat", MSG)


async def test_queue_wait_is_zero_for_a_request_dispatched_at_time_zero():
    clock = FakeClock()
    engine = FakeEngine(manual=True)
    arbiter = fa.Arbiter(clock=clock)
    arbiter.add_model("chat", engine)
    who = arbiter.app("a").agent("t")
    async with arbiter:
        task = asyncio.create_task(who.chat("chat", MSG))
        await settle()
        clock.advance(5.0)
        engine.emit(next(iter(engine.running)), 1, finish="stop")
        reply = await task
    assert reply.timing.queue_wait == 0.0 and reply.timing.ttft == reply.timing.e2e == 5.0


def test_engine_streams_are_typed_as_closable_generators():
    import typing
    from collections.abc import AsyncGenerator

    hint = typing.get_type_hints(fa.engines.Engine.generate)["return"]
    assert typing.get_origin(hint) is AsyncGenerator  # the arbiter closes them (aclose)


async def test_identity_settings_that_contradict_the_declaration_are_refused():
    arbiter, _ = make(tokens_per_reply=1)
    arbiter.app("driving", weight=2.0).agent("planner", weight=3.0)

    @fa.agent(app="driving", name="planner", weight=1.5)
    async def wrong_weight():
        return await arbiter.chat("chat", MSG)

    @fa.agent(app="driving", name="planner")
    async def as_declared():
        return await arbiter.chat("chat", MSG)

    async with arbiter:
        with pytest.raises(fa.InvalidParameterError, match="called with weight=1.5, but it is declared with weight=3.0"):
            await wrong_weight()
        with pytest.raises(fa.InvalidParameterError, match="app weight=1.0"):
            await arbiter.chat("chat", MSG, agent=fa.Agent("planner", fa.App("driving", weight=1.0), weight=3.0))
        assert (await as_declared()).usage.completion_tokens == 1
        # an identity that states no settings takes the declaration's
        assert (await arbiter.chat("chat", MSG, agent=fa.Agent("planner", fa.App("driving")))).usage.completion_tokens
    assert len(arbiter.ledger.records) == 2


async def test_the_token_budget_admits_what_the_kv_holds_and_refuses_what_never_fits():
    engine = FakeEngine(manual=True, token_capacity=32, kv_block_size=8)
    arbiter = fa.Arbiter(in_flight=8)
    arbiter.add_model("chat", engine)
    who = arbiter.app("a").agent("t")
    async with arbiter:
        assert arbiter.token_budget_of("chat") == 32
        with pytest.raises(fa.ContextLengthError, match="needs 40 tokens of KV cache") as err:
            await who.chat("chat", MSG, max_tokens=37)  # 3 + 37 = 40 > 32
        assert err.value.model == "chat" and err.value.app == "a"
        nothing_happened(arbiter)
        tasks = [asyncio.create_task(who.chat("chat", MSG, max_tokens=10)) for _ in range(3)]  # 16 each
        await settle()
        assert len(engine.running) == 2  # 2 × 16 = 32: the third waits for KV, not in the engine
        for rid in list(engine.running):
            engine.emit(rid, 1, finish="stop")
        await settle()
        assert len(engine.running) == 1
        engine.emit(next(iter(engine.running)), 1, finish="stop")
        await asyncio.gather(*tasks)
    unbounded = fa.Arbiter(token_budget=None)
    unbounded.add_model("chat", FakeEngine(token_capacity=32))
    async with unbounded:
        assert unbounded.token_budget_of("chat") is None


async def test_errors_name_what_they_are_about():
    arbiter, _ = make()
    who = arbiter.app("a", max_queued=1).agent("t")
    async with arbiter:
        with pytest.raises(fa.UnknownModelError) as unknown:
            await who.chat("nope", MSG)
        assert unknown.value.model == "nope"
        with pytest.raises(fa.UnknownAgentError) as agent:
            await arbiter.chat("chat", MSG, agent=fa.Agent("ghost", fa.App("a")))
        assert (agent.value.app, agent.value.agent) == ("a", "ghost")


async def test_one_request_failing_in_a_healthy_engine_does_not_take_the_model_down():
    engine = FakeEngine(manual=True)
    arbiter = fa.Arbiter(in_flight=2)
    arbiter.add_model("chat", engine)
    a, b = arbiter.app("a").agent("t"), arbiter.app("b").agent("t")
    async with arbiter:
        bad, good = asyncio.create_task(a.chat("chat", MSG)), asyncio.create_task(b.chat("chat", MSG))
        await settle()
        first, second = engine.started_order
        engine.fail_request(first, RuntimeError("a bug in this request's stream"))
        with pytest.raises(fa.EngineError, match="a bug") as err:
            await bad
        assert err.value.request_id == first and err.value.model == "chat"
        engine.emit(second, 1, finish="stop")
        assert (await good).usage.completion_tokens == 1
        later = asyncio.create_task(a.chat("chat", MSG))  # the model still takes requests
        await settle()
        engine.emit(engine.started_order[-1], 1, finish="stop")
        assert (await later).usage.completion_tokens == 1
    assert arbiter.dispatcher.model("chat").down is None


async def test_a_dead_model_is_restarted_by_hand_and_serves_again():
    arbiter, engine = make(tokens_per_reply=2)
    who = arbiter.app("a").agent("t")
    async with arbiter:
        engine.fail()
        with pytest.raises(fa.EngineError):
            await who.chat("chat", MSG)
        with pytest.raises(fa.EngineError, match="is down"):
            await who.chat("chat", MSG)  # fails fast while it is down
        await arbiter.restart_model("chat", backoff=0.0)
        assert (await who.chat("chat", MSG)).usage.completion_tokens == 2


class _Flaky(FakeEngine):
    """Fails to start the first ``failures`` times after its first start."""

    def __init__(self, failures, **kw):
        super().__init__(**kw)
        self.failures, self.starts = failures, 0

    async def start(self):
        self.starts += 1
        if 1 < self.starts <= 1 + self.failures:
            raise fa.EngineError("not yet")
        await super().start()


async def test_a_restart_retries_with_backoff_and_gives_up_with_the_model_down():
    arbiter = fa.Arbiter()
    flaky = _Flaky(2, tokens_per_reply=1)
    arbiter.add_model("chat", flaky)
    who = arbiter.app("a").agent("t")
    async with arbiter:
        await arbiter.restart_model("chat", attempts=3, backoff=0.0)  # two failed starts, then up
        assert flaky.starts == 4 and (await who.chat("chat", MSG)).usage.completion_tokens == 1
        flaky.starts, flaky.failures = 1, 5
        with pytest.raises(fa.EngineError, match="not yet"):
            await arbiter.restart_model("chat", attempts=2, backoff=0.0)
        with pytest.raises(fa.EngineError, match="down"):
            await who.chat("chat", MSG)


async def test_a_dead_model_restarts_by_itself_with_backoff_and_serves_again():
    arbiter = fa.Arbiter(restart=fa.Restart(attempts=4, backoff=0.01))
    flaky = _Flaky(2, tokens_per_reply=1)
    arbiter.add_model("chat", flaky)
    arbiter.add_model("other", FakeEngine(tokens_per_reply=1))
    who = arbiter.app("a").agent("t")
    async with arbiter:
        flaky.fail()
        with pytest.raises(fa.EngineError):
            await who.chat("chat", MSG)
        assert arbiter.restarting("chat") and not arbiter.serving("chat")
        with pytest.raises(fa.EngineError, match="is down"):
            await who.chat("chat", MSG)  # refused at once while it restarts: nothing waits on a dead engine
        assert (await who.chat("other", MSG)).usage.completion_tokens == 1  # other models serve meanwhile
        for _ in range(200):
            if arbiter.serving("chat"):
                break
            await asyncio.sleep(0.01)
        assert flaky.starts == 4 and not arbiter.restarting("chat")  # two failed starts, then up
        assert (await who.chat("chat", MSG)).usage.completion_tokens == 1


async def test_an_automatic_restart_gives_up_after_its_attempts_and_the_model_stays_down():
    arbiter = fa.Arbiter(restart=fa.Restart(attempts=2, backoff=0.0))
    flaky = _Flaky(5, tokens_per_reply=1)
    arbiter.add_model("chat", flaky)
    who = arbiter.app("a").agent("t")
    async with arbiter:
        flaky.fail()
        with pytest.raises(fa.EngineError):
            await who.chat("chat", MSG)
        for _ in range(100):
            if not arbiter.restarting("chat"):
                break
            await asyncio.sleep(0.01)
        assert flaky.starts == 3 and not arbiter.serving("chat")
        flaky.failures = 0
        await arbiter.restart_model("chat", backoff=0.0)  # by hand, as the log says
        assert (await who.chat("chat", MSG)).usage.completion_tokens == 1


async def test_without_automatic_restart_a_dead_model_stays_down_and_close_cancels_a_pending_restart():
    arbiter, engine = make(tokens_per_reply=1)
    arbiter.restart = None
    who = arbiter.app("a").agent("t")
    async with arbiter:
        engine.fail()
        with pytest.raises(fa.EngineError):
            await who.chat("chat", MSG)
        await asyncio.sleep(0.05)
        assert not arbiter.restarting("chat") and not arbiter.serving("chat")
    slow = fa.Arbiter(restart=fa.Restart(backoff=60.0))
    engine = FakeEngine(tokens_per_reply=1)
    slow.add_model("chat", engine)
    who = slow.app("a").agent("t")
    async with slow:
        engine.fail()
        with pytest.raises(fa.EngineError):
            await who.chat("chat", MSG)
        assert slow.restarting("chat")
    assert not slow.restarting("chat")  # the close cancelled it: nothing outlives the arbiter


def test_restart_settings_are_checked():
    with pytest.raises(fa.InvalidParameterError, match="backoff"):
        fa.Restart(backoff=-1)
    with pytest.raises(fa.InvalidParameterError, match="restart must be"):
        fa.Arbiter(restart=3)
    with pytest.raises(fa.InvalidParameterError, match="max_in_flight_share"):
        fa.Arbiter(max_in_flight_share=1.5)
    arbiter = fa.Arbiter()
    arbiter.app("a", max_in_flight_share=0.5)
    with pytest.raises(fa.InvalidParameterError, match="already declared"):
        arbiter.app("a", max_in_flight_share=0.25)


async def test_a_flooding_app_capped_to_half_the_slots_leaves_room_for_another():
    arbiter = fa.Arbiter(in_flight=4, max_in_flight_share=0.5, token_budget=None)
    engine = FakeEngine(manual=True)
    arbiter.add_model("chat", engine)
    flood = arbiter.app("flood").agent("t")
    victim = arbiter.app("victim").agent("t")
    async with arbiter:
        floods = [asyncio.create_task(flood.chat("chat", MSG, max_tokens=4)) for _ in range(8)]
        await asyncio.sleep(0.01)
        assert len(engine.running) == 2 and arbiter.queued("chat") == 6
        v = asyncio.create_task(victim.chat("chat", MSG, max_tokens=4))
        await asyncio.sleep(0.01)
        assert len(engine.running) == 3  # the victim did not wait behind the flood
        for rid in list(engine.running):
            engine.emit(rid, 1, finish="stop")
        assert (await v).usage.completion_tokens == 1
        while not all(f.done() for f in floods):
            await asyncio.sleep(0.001)
            for rid in list(engine.running):
                engine.emit(rid, 1, finish="stop")
        assert all(f.result().usage.completion_tokens == 1 for f in floods)


async def test_an_engine_that_dies_while_idle_is_noticed_by_the_next_call_and_restarted():
    arbiter = fa.Arbiter(restart=fa.Restart(backoff=0.0))
    engine = FakeEngine(tokens_per_reply=1)
    arbiter.add_model("chat", engine)
    who = arbiter.app("a").agent("t")
    async with arbiter:
        engine.fail()  # nothing running: no stream reports it
        with pytest.raises(fa.EngineError, match="engine is dead"):
            await who.chat("chat", MSG)  # refused before it is queued, and the restart begins
        assert arbiter.restarting("chat")
        for _ in range(100):
            if arbiter.serving("chat"):
                break
            await asyncio.sleep(0.01)
        assert (await who.chat("chat", MSG)).usage.completion_tokens == 1


async def test_the_restart_eta_is_the_backoff_plus_the_engines_last_start_time():
    class Slow(FakeEngine):
        async def start(self):
            await asyncio.sleep(0.05)
            await super().start()

    arbiter = fa.Arbiter(restart=fa.Restart(backoff=2.0))
    engine = Slow(tokens_per_reply=1)
    arbiter.add_model("chat", engine)
    who = arbiter.app("a").agent("t")
    async with arbiter:
        assert arbiter.restart_eta("chat") is None  # not restarting
        engine.fail()
        with pytest.raises(fa.EngineError):
            await who.chat("chat", MSG)
        assert 2.05 <= arbiter.restart_eta("chat") < 2.5


async def test_a_call_arrives_when_it_is_made_not_after_the_engines_checks():
    """The engine's own parameter check (a grammar to compile, say) runs before queueing, off the loop:
    the time it takes is the request's wait, in its place in the queue, for chat and completions alike."""
    clock = FakeClock(start=100.0)

    class SlowChecks(FakeEngine):
        def check_params(self, params):
            clock.advance(5.0)

    arbiter = fa.Arbiter(clock=clock)
    arbiter.add_model("chat", SlowChecks())
    bot = arbiter.app("a").agent("bot")
    records = []
    arbiter.add_listener(records.append)
    async with arbiter:
        await bot.chat("chat", MSG, max_tokens=2, logprobs=True)
        await bot.complete("chat", "once upon", max_tokens=2, logprobs=True)
        [_ async for _ in bot.stream_complete("chat", "once upon", max_tokens=2, logprobs=True)]
    assert [r.arrival for r in records] == [100.0, 105.0, 110.0]  # each made right after the last check
    assert [r.queue_wait for r in records] == [5.0, 5.0, 5.0]


async def test_a_calls_max_tokens_then_its_apps_default_then_the_arbiters_then_the_rest_of_the_context():
    arbiter = fa.Arbiter(in_flight=4, default_max_tokens=20)
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=10_000, max_model_len=64))  # it runs to max_tokens
    plain = arbiter.app("plain").agent("a")
    terse = arbiter.app("terse", default_max_tokens=5).agent("a")
    wordy = arbiter.app("wordy", default_max_tokens=1000).agent("a")  # more than fits: the rest of the context
    async with arbiter:
        got = [(await who.chat("chat", MSG, **kw)).usage.completion_tokens
               for who, kw in [(plain, {}), (terse, {}), (wordy, {}), (terse, {"max_tokens": 12})]]
        streamed = [d.new_tokens async for d in terse.stream_complete("chat", "once upon a time")]
        with fa.acting_as(terse):  # the app of the agent bound in context
            bound = (await arbiter.complete("chat", "once upon a time")).usage.completion_tokens
    assert got == [20, 5, 64 - 3, 12] and sum(streamed) == 5 and bound == 5
    unset = fa.Arbiter()
    unset.add_model("chat", FakeEngine(max_model_len=64))
    assert unset.default_max_tokens("chat", 3) == 61  # no default anywhere: the rest of the context


def test_a_default_max_tokens_is_checked_and_declared_once():
    with pytest.raises(fa.InvalidParameterError, match="default_max_tokens must be an integer ≥ 1"):
        fa.Arbiter(default_max_tokens=0)
    arbiter = fa.Arbiter()
    with pytest.raises(fa.InvalidParameterError, match="default_max_tokens"):
        arbiter.app("a", default_max_tokens=True)
    arbiter.app("b", default_max_tokens=64)
    assert arbiter.app("b", default_max_tokens=64).identity.name == "b"
    with pytest.raises(fa.InvalidParameterError, match="default_max_tokens=64"):
        arbiter.app("b")
