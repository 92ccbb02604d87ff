"""VLLMEngine and the arbiter on a real in-process vLLM engine (the embedded tiny Llama)."""

import asyncio
import contextlib
import random

import pytest

import fairagents as fa
from fairagents.engines import GenerationParams, Prompt
from fairagents.engines.vllm import VLLMEngine

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.engine]

MSG = [{"role": "user", "content": "plan a route through the city"}]


class Shared:
    """An arbiter over the session's engine that does not stop it on exit."""

    def __init__(self, engine, **kwargs):
        self.arbiter = fa.Arbiter(**kwargs)
        self.arbiter.add_model("chat", engine)
        self.engine = engine

    async def __aenter__(self):
        await self.arbiter.start()
        return self.arbiter

    async def __aexit__(self, *exc):
        await self.arbiter.close(stop_engines=False)  # the next test uses the engine too


async def test_profile_and_context_come_from_the_model(text_engine):
    assert text_engine.profile == fa.ModelProfile(d_model=128, n_layers=2)
    assert text_engine.max_model_len == 1024
    assert text_engine.vocab_size == len(text_engine._tokenizer)
    prompt = text_engine.prepare_chat(MSG)
    assert 5 < prompt.n_tokens < 40


async def test_token_capacity_is_the_usable_kv_cache(text_engine):
    """vLLM cuts ``kv_cache_bytes`` into blocks and keeps one back (the null block)."""
    capacity, block = text_engine.token_capacity, text_engine.kv_block_size
    assert block > 1 and capacity > 0 and capacity % block == 0
    config = text_engine._engine.model_config
    text = config.hf_text_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    bytes_per_token = 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * config.dtype.itemsize  # K and V
    kv_cache_bytes = text_engine.engine_args()["kv_cache_memory_bytes"]  # what the fixture asked for
    assert capacity // block == kv_cache_bytes // (block * bytes_per_token) - 1
    assert text_engine._engine.vllm_config.cache_config.kv_cache_size_tokens == capacity + block  # vLLM's count keeps it


def _fill(blocks, block, max_len, max_tokens=40):
    """(prompt, max_tokens) pairs that end up holding ``blocks`` blocks in all, each crossing into its last block while decoding."""
    per = max_len // block
    sizes = [per] * (blocks // per) + ([blocks % per] if blocks % per else [])
    assert min(sizes) >= 2 and max_tokens > 8
    # the prompt fills all but the last block (8 tokens short); max_tokens - 1 more tokens need the last one
    return [((k - 1) * block - 8, max_tokens) for k in sizes]


@contextlib.contextmanager
def _watch_scheduler(engine):
    """Record, on the engine's own thread, the running and waiting counts after each schedule, and each preemption."""
    scheduler = engine._engine.engine_core.engine_core.scheduler
    seen = {"running": [], "waiting": [], "preempted": []}
    schedule, preempt = scheduler.schedule, scheduler._preempt_request

    def watched_schedule(*args, **kwargs):
        out = schedule(*args, **kwargs)
        seen["running"].append(len(scheduler.running))
        seen["waiting"].append(len(scheduler.waiting))
        return out

    def watched_preempt(request, *args, **kwargs):
        seen["preempted"].append(request.request_id)
        return preempt(request, *args, **kwargs)

    scheduler.schedule, scheduler._preempt_request = watched_schedule, watched_preempt
    try:
        yield seen
    finally:
        del scheduler.schedule, scheduler._preempt_request


async def test_requests_that_fill_token_capacity_run_together(text_engine):
    """Block-rounded prompt + max_tokens adding up to the capacity: all run at once; one block more: one waits."""
    block, blocks = text_engine.kv_block_size, text_engine.token_capacity // text_engine.kv_block_size
    rng = random.Random(5)
    vocab = text_engine._engine.model_config.hf_text_config.vocab_size

    async def run(plan, tag):
        assert len(plan) <= text_engine.max_num_seqs, "the plan must not be limited by max_num_seqs"
        async with asyncio.timeout(30):
            while text_engine._engine.has_unfinished_requests():  # earlier tests' requests are gone
                await asyncio.sleep(0.01)

        async def one(i, prompt, max_tokens):
            ids = tuple(rng.randrange(3, vocab) for _ in range(prompt))  # random: no prefix-cache sharing
            stream = text_engine.generate(f"{tag}{i}", Prompt(token_ids=ids), GenerationParams(max_tokens, ignore_eos=True))
            return sum([d.new_tokens async for d in stream])

        with _watch_scheduler(text_engine) as seen:
            produced = await asyncio.gather(*(one(i, p, m) for i, (p, m) in enumerate(plan)))
        assert produced == [m for _, m in plan]
        return seen

    exact = _fill(blocks, block, text_engine.max_model_len)
    assert sum(-(-(p + m) // block) for p, m in exact) == blocks
    seen = await run(exact, "fill")
    assert max(seen["running"]) == len(exact) and not seen["preempted"]
    assert all(w == 0 for r, w in zip(seen["running"], seen["waiting"]) if r == len(exact))

    over = _fill(blocks + 1, block, text_engine.max_model_len)
    assert len(over) == len(exact)
    seen = await run(over, "over")
    # all are admitted on their prompts; the last block one of them needs is not there: it is preempted and waits
    assert seen["preempted"]
    assert any(r == len(over) - 1 and w == 1 for r, w in zip(seen["running"], seen["waiting"]))


async def test_generate_streams_exactly_max_tokens(text_engine):
    deltas = [d async for d in text_engine.generate("g1", text_engine.prepare_chat(MSG), GenerationParams(12, ignore_eos=True, seed=1))]
    assert sum(d.new_tokens for d in deltas) == 12
    assert deltas[-1].finish_reason == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])


async def test_same_seed_same_text(text_engine):
    async def once(rid):
        return "".join([d.text async for d in text_engine.generate(rid, text_engine.prepare_chat(MSG), GenerationParams(16, seed=7, ignore_eos=True))])

    assert await once("s1") == await once("s2")


async def test_abort_ends_the_stream(text_engine):
    stream = text_engine.generate("a1", text_engine.prepare_chat(MSG), GenerationParams(500, ignore_eos=True))
    seen = 0
    async for delta in stream:
        seen += delta.new_tokens
        if seen == 3:
            await text_engine.abort("a1")
        if delta.finish_reason:
            break
    assert delta.finish_reason == "abort" and seen < 20


async def test_non_text_content_is_bad_input(text_engine):
    with pytest.raises(fa.InvalidParameterError):
        text_engine.prepare_chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


async def test_chat_and_concurrent_streams_through_the_arbiter(text_engine):
    async with Shared(text_engine) as arbiter:
        agents = [arbiter.app(f"app{i}").agent("bot") for i in range(3)]

        async def stream(agent):
            deltas = [d async for d in agent.stream_chat("chat", MSG, max_tokens=20, ignore_eos=True, seed=3)]
            return deltas

        results = await asyncio.gather(*(stream(a) for a in agents for _ in range(4)))
        assert all(sum(d.new_tokens for d in deltas) == 20 for deltas in results)
        reply = await agents[0].chat("chat", MSG, max_tokens=8, ignore_eos=True)
        assert reply.usage.completion_tokens == 8
        assert reply.usage.prompt_tokens == text_engine.prepare_chat(MSG).n_tokens
        scale = 128 / 4096 * 2
        assert reply.usage.unified_tokens == pytest.approx(scale * (reply.usage.prompt_tokens + 2 * 8))
        assert 0 <= reply.timing.queue_wait <= reply.timing.ttft <= reply.timing.e2e
        stats = arbiter.stats()
        assert [stats.apps[f"app{i}"].done for i in range(3)] == [5, 4, 4]


async def test_identity_from_decorator_and_context(text_engine):
    async with Shared(text_engine) as arbiter:
        planner = arbiter.app("driving").agent("planner")

        @fa.agent(app="driving", name="planner")
        async def plan():
            return await arbiter.chat("chat", MSG, max_tokens=4)

        await plan()
        with fa.acting_as(planner):
            await arbiter.chat("chat", MSG, max_tokens=4)
        assert arbiter.stats().agents["driving/planner"].done == 2


async def test_prompt_longer_than_context_costs_nothing(text_engine):
    async with Shared(text_engine) as arbiter:
        a = arbiter.app("a").agent("t")
        long = [{"role": "user", "content": "word " * 2000}]
        with pytest.raises(fa.ContextLengthError):
            await a.chat("chat", long)
        with pytest.raises(fa.ContextLengthError):
            await a.chat("chat", MSG, max_tokens=1020)
        assert not arbiter.ledger.charges and arbiter.policy.queued() == 0


async def test_cancel_aborts_in_the_engine_and_charges_only_produced_tokens(text_engine):
    async with Shared(text_engine, in_flight=2) as arbiter:
        a = arbiter.app("a").agent("t")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await a.chat("chat", MSG, max_tokens=900, ignore_eos=True)
        (record,) = arbiter.ledger.records
        assert record.outcome is fa.Outcome.CANCELLED and 0 < record.output_tokens < 900
        scale = 128 / 4096 * 2
        assert arbiter.ledger.service_of("a") == pytest.approx(scale * (record.prompt_tokens + 2 * record.output_tokens))
        # no slot leaked: both slots serve at once again
        replies = await asyncio.gather(*(a.chat("chat", MSG, max_tokens=5, ignore_eos=True) for _ in range(2)))
        assert [r.usage.completion_tokens for r in replies] == [5, 5]
        assert arbiter.policy.running() == 0


@pytest.mark.parametrize("policy", ["hmfs", "fcfs"])
async def test_fairness_on_the_real_engine(text_engine, policy):
    """Equal weights, one app sends 10x: HMFS keeps the gap within 2U; FCFS lets it grow with the flood."""

    async def run(flood_size):
        async with Shared(text_engine, policy=policy, in_flight=4) as arbiter:
            flood, victim = arbiter.app("flood").agent("bot"), arbiter.app("victim").agent("bot")
            call = dict(max_tokens=24, ignore_eos=True)
            tasks = [asyncio.create_task(flood.chat("chat", MSG, **call)) for _ in range(flood_size)]
            await asyncio.sleep(0.05)
            tasks += [asyncio.create_task(victim.chat("chat", MSG, **call)) for _ in range(flood_size // 10)]
            await asyncio.gather(*tasks)
            records, charges = list(arbiter.ledger.records), list(arbiter.ledger.charges)
            longest = max(r.prompt_tokens for r in records) + 24
            bound = arbiter.bound(longest)
        from fairagents.metrics import max_service_gap

        return max_service_gap(records, charges, {"flood": 1.0, "victim": 1.0}), bound

    gap, bound = await run(60)
    if policy == "hmfs":
        assert gap <= 2 * bound
    else:
        bigger, _ = await run(120)
        assert gap > 2 * bound and bigger > 1.5 * gap


async def test_a_model_that_cannot_load_is_a_model_load_error():
    engine = VLLMEngine(model="/nonexistent/model", kv_cache_bytes=2**20)
    with pytest.raises(fa.ModelLoadError, match="no folder '/nonexistent/model'"):  # an EngineError too
        await engine.start()
    assert not engine.healthy


async def test_engine_failure_fails_requests_and_spares_other_models(text_engine):
    broken = VLLMEngine(kv_cache_bytes=16 * 2**20, max_model_len=512)
    arbiter = fa.Arbiter(in_flight=2)
    arbiter.add_model("broken", broken)
    arbiter.add_model("chat", text_engine)
    a = arbiter.app("a").agent("t")
    await arbiter.start()
    try:
        assert (await a.chat("broken", MSG, max_tokens=3)).usage.completion_tokens == 3

        def crash():
            raise RuntimeError("simulated device fault")

        running = [asyncio.create_task(a.chat("broken", MSG, max_tokens=400, ignore_eos=True)) for _ in range(3)]
        await asyncio.sleep(0.2)
        broken._engine.step = crash  # the engine thread's next step fails
        for task in running:
            with pytest.raises(fa.EngineError):
                await asyncio.wait_for(task, 30)
        assert not broken.healthy
        with pytest.raises(fa.EngineError):
            await a.chat("broken", MSG)
        assert (await a.chat("chat", MSG, max_tokens=3)).usage.completion_tokens == 3
    finally:
        await arbiter.close(stop_engines=False)
        await broken.stop()


async def test_stopping_one_engine_leaves_the_others_serving(text_engine):
    """vLLM's shutdown tears down process-wide state; the other engines of the process must survive it."""
    other = VLLMEngine(kv_cache_bytes=16 * 2**20, max_model_len=512)
    assert other.max_num_seqs is None  # vLLM's own default, read on start
    await other.start()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    assert other.max_num_seqs == EngineArgs.get_batch_defaults(1)[1][UsageContext.OPENAI_API_SERVER]  # as `vllm serve`
    await other.stop()
    deltas = [d async for d in text_engine.generate("after-stop", text_engine.prepare_chat(MSG), GenerationParams(4, ignore_eos=True))]
    assert sum(d.new_tokens for d in deltas) == 4


async def test_an_engine_that_dies_restarts_by_itself_and_serves_again():
    """Its own engine (the session's is shared): the step raises, the model goes down, the automatic restart brings it back."""
    arbiter = fa.Arbiter(restart=fa.Restart(backoff=0.0))
    engine = VLLMEngine(kv_cache_bytes=16 * 2**20, max_model_len=512)
    arbiter.add_model("chat", engine)
    who = arbiter.app("a").agent("t")
    async with arbiter:
        assert (await who.chat("chat", MSG, max_tokens=4, ignore_eos=True)).usage.completion_tokens == 4

        def broken_step():
            raise RuntimeError("the step blew up")

        engine._engine.step = broken_step  # the engine's own thread calls it at the next step
        with pytest.raises(fa.EngineError, match="blew up"):
            await who.chat("chat", MSG, max_tokens=4)
        assert arbiter.dispatcher.model("chat").down is not None and arbiter.restarting("chat")
        for _ in range(1200):
            if arbiter.serving("chat"):
                break
            await asyncio.sleep(0.1)
        assert engine.healthy and engine.token_capacity and not arbiter.restarting("chat")
        assert (await who.chat("chat", MSG, max_tokens=4, ignore_eos=True)).usage.completion_tokens == 4


# -- sampling parameters past temperature and top_p --------------------------------------------


async def _greedy(engine, rid, tokens=12, **params):
    deltas = [d async for d in engine.generate(rid, engine.prepare_chat(MSG),
                                               GenerationParams(tokens, temperature=0.0, ignore_eos=True, **params))]
    return "".join(d.text for d in deltas), [t for d in deltas for t in d.logprobs]


async def test_logprobs_are_each_tokens_with_the_most_likely_alternatives(text_engine):
    text, tokens = await _greedy(text_engine, "lp1", logprobs=3)
    assert len(tokens) == 12 and "".join(t.token for t in tokens) == text
    for token in tokens:
        assert len(token.top) == 3 and [a.logprob for a in token.top] == sorted((a.logprob for a in token.top), reverse=True)
        assert token.logprob <= 0 and token.token == token.top[0].token  # greedy: the sampled token is the likeliest
        assert token.logprob == pytest.approx(token.top[0].logprob)
    assert (await _greedy(text_engine, "lp2"))[1] == []  # none asked, none given


async def test_a_logit_bias_of_100_forces_a_token_and_penalties_change_greedy_output(text_engine):
    token_id = text_engine._tokenizer.encode("road", add_special_tokens=False)[0]
    _, tokens = await _greedy(text_engine, "lb1", logit_bias={token_id: 100}, logprobs=0)
    assert {t.token for t in tokens} == {text_engine._tokenizer.decode([token_id])}
    plain, _ = await _greedy(text_engine, "pen0", tokens=48)
    assert (await _greedy(text_engine, "pen1", tokens=48))[0] == plain  # greedy is deterministic
    assert (await _greedy(text_engine, "pen2", tokens=48, frequency_penalty=2.0))[0] != plain
    assert (await _greedy(text_engine, "pen3", tokens=48, presence_penalty=2.0))[0] != plain
    sampling = text_engine._sampling(GenerationParams(4, presence_penalty=0.5, frequency_penalty=-1.0,
                                                      logit_bias={7: -100}, logprobs=2))
    assert (sampling.presence_penalty, sampling.frequency_penalty, sampling.logit_bias, sampling.logprobs) == (
        0.5, -1.0, {7: -100.0}, 2)


async def test_what_vllm_refuses_of_logprobs_and_logit_bias_is_bad_input_before_queueing(text_engine):
    async with Shared(text_engine) as arbiter:
        bot = arbiter.app("a").agent("bot")
        outside = text_engine.vocab_size
        with pytest.raises(fa.InvalidParameterError, match="logit_bias"):
            await bot.chat("chat", MSG, max_tokens=4, logit_bias={outside: 5})
        with pytest.raises(fa.InvalidParameterError, match="logit_bias"):
            [d async for d in bot.stream_complete("chat", "once", max_tokens=4, logit_bias={outside + 10: 5})]
        with pytest.raises(fa.InvalidParameterError, match="top_logprobs"):
            await bot.chat("chat", MSG, max_tokens=4, logprobs=True, top_logprobs=21)
        with pytest.raises(fa.InvalidParameterError, match="logprobs"):
            text_engine.check_params(GenerationParams(4, logprobs=21))  # past vLLM's max_logprobs (20)
        assert not arbiter.ledger.charges and arbiter.policy.queued() == 0
        reply = await bot.chat("chat", MSG, max_tokens=4, ignore_eos=True, logprobs=True, top_logprobs=2)
    assert reply.usage.completion_tokens == len(reply.logprobs) == 4 and all(len(t.top) == 2 for t in reply.logprobs)


async def test_without_max_tokens_a_call_may_run_to_the_end_of_the_context(text_engine):
    async with Shared(text_engine) as arbiter:
        bot = arbiter.app("a").agent("bot")
        prompt = text_engine.prepare_chat(MSG).n_tokens
        expected = arbiter.default_max_tokens("chat", prompt)
        room = min(text_engine.max_model_len, arbiter.token_budget_of("chat") or text_engine.token_capacity)
        assert expected == room - prompt
        reply = await bot.chat("chat", MSG, ignore_eos=True)
    assert reply.usage.completion_tokens == expected and reply.finish_reason == "length"


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
async def test_max_num_seqs_is_a_positive_integer_or_none_for_vllms_default(bad):
    with pytest.raises(fa.InvalidParameterError, match="max_num_seqs"):
        VLLMEngine(max_num_seqs=bad)
    assert "max_num_seqs" not in VLLMEngine().engine_args(gpu=False)  # vLLM chooses it for the platform
    assert VLLMEngine(max_num_seqs=8).engine_args(gpu=False)["max_num_seqs"] == 8
