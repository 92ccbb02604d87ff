"""The server on a real in-process vLLM engine (the embedded tiny Llama), through the stock openai client."""

import asyncio
import json
import math
import sys
import time
from pathlib import Path

import httpx
import jsonschema
import pytest
from openai.types.chat import ChatCompletion

import fairagents as fa
from fairagents.metrics import max_service_gap
from fairagents.server import build_arbiter

from ._support import KEYS, MSG, client, live, make_config, wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.engine]

SCALE = 128 / 4096 * 2  # unified tokens per raw token of the embedded model
GREEDY = {"ignore_eos": True}


def shared(engine, **kwargs):
    arbiter = fa.Arbiter(**kwargs)
    arbiter.add_model("chat", engine)
    return arbiter


async def test_chat_streaming_completions_and_models(text_engine):
    arbiter = shared(text_engine)
    prompt_tokens = text_engine.prepare_chat(MSG).n_tokens
    async with live(arbiter, make_config()) as (url, _), client(url, agent="planner") as c:
        models = await c.models.list()
        assert [(m.id, m.model_extra["max_model_len"]) for m in models.data] == [("chat", 1024)]

        reply = await c.chat.completions.create(model="chat", messages=MSG, max_tokens=12, seed=5, extra_body=GREEDY)
        assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.role == "assistant"
        assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (prompt_tokens, 12)
        assert reply.usage.model_extra["unified_tokens"] == pytest.approx(SCALE * (prompt_tokens + 2 * 12))

        stream = await c.chat.completions.create(
            model="chat", messages=MSG, max_tokens=12, seed=5, stream=True,
            stream_options={"include_usage": True}, extra_body=GREEDY,
        )
        chunks = [chunk async for chunk in stream]
        *content, last = chunks
        assert content[0].choices[0].delta.role == "assistant"
        assert "".join(ch.choices[0].delta.content or "" for ch in content) == reply.choices[0].message.content
        assert content[-1].choices[0].finish_reason == "length"
        assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens) == (prompt_tokens, 12)
        assert all(ch.usage is None for ch in content)

        text = await c.completions.create(model="chat", prompt="once upon a time", max_tokens=8, extra_body=GREEDY)
        assert text.usage.completion_tokens == 8 and text.choices[0].finish_reason == "length"
        assert text.usage.prompt_tokens == text_engine.prepare_text("once upon a time").n_tokens
        pieces = [p async for p in await c.completions.create(
            model="chat", prompt=[1, 5, 9, 12], max_tokens=6, stream=True, stream_options={"include_usage": True},
            extra_body=GREEDY,
        )]
        assert pieces[-1].usage.prompt_tokens == 4 and pieces[-1].usage.completion_tokens == 6
        assert "".join(p.choices[0].text for p in pieces[:-1])
    assert arbiter.stats().agents["driving/planner"].done == 4


async def test_an_8_mb_prompt_is_refused_at_once_and_health_keeps_answering(text_engine):
    """The real tokenizer's longest token bounds the prompt: 8 MB cannot fit 1,024 tokens, and is never tokenized."""
    arbiter = shared(text_engine)
    assert text_engine.max_token_bytes and text_engine.max_token_bytes * text_engine.max_model_len < 8 * 2**20
    body = {"model": "chat", "messages": [{"role": "user", "content": "road " * (8 * 2**20 // 5)}], "max_tokens": 4}
    async with live(arbiter, make_config()) as (url, _), httpx.AsyncClient(base_url=url, timeout=60) as http:
        headers = {"Authorization": f"Bearer {KEYS['driving']}"}
        big = asyncio.create_task(http.post("/v1/chat/completions", json=body, headers=headers))
        latencies = []
        while not big.done():
            start = time.perf_counter()
            assert (await http.get("/health")).status_code == 200
            latencies.append(time.perf_counter() - start)
            await asyncio.sleep(0.01)
        r = await big
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert "characters" in r.json()["error"]["message"]  # the cheap check, not the tokenizer
        assert max(latencies, default=0) < 1.0
        assert arbiter.text_preprocessor.used["driving"] < 1.0  # parsed, never tokenized (that takes ~15 s)


async def test_a_client_that_disconnects_mid_stream_is_charged_only_for_tokens_produced(text_engine):
    arbiter = shared(text_engine, in_flight=2)
    async with live(arbiter, make_config()) as (url, _):
        async with client(url) as c:
            stream = await c.chat.completions.create(model="chat", messages=MSG, max_tokens=900, stream=True, extra_body=GREEDY)
            received = 0
            async for chunk in stream:
                received += bool(chunk.choices[0].delta.content)
                if received == 5:
                    break
            await stream.close()
            await wait_until(lambda: arbiter.ledger.records)
            (record,) = arbiter.ledger.records
            assert record.outcome is fa.Outcome.CANCELLED and 5 <= record.output_tokens < 900
            assert arbiter.ledger.service_of("driving") == pytest.approx(SCALE * (record.prompt_tokens + 2 * record.output_tokens))
            # no slot leaked: both run at once again
            replies = await asyncio.gather(*(
                c.chat.completions.create(model="chat", messages=MSG, max_tokens=5, extra_body=GREEDY) for _ in range(2)
            ))
            assert [r.usage.completion_tokens for r in replies] == [5, 5]
    assert arbiter.policy.running() == 0


async def _app_process(url, key, concurrency, per_worker, max_tokens):
    return await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).with_name("_load.py")), url, key, str(concurrency), str(per_worker), str(max_tokens),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )


async def _ready(process):
    assert (await process.stdout.readline()).strip() == b"ready"


async def _finish(process):
    out, _ = await process.communicate()
    assert process.returncode == 0
    return json.loads(out)


@pytest.mark.parametrize("policy", ["hmfs", "fcfs"])
async def test_fairness_over_http_between_two_app_processes(text_engine, policy):
    """Two apps of equal weight as separate processes, one flooding: HMFS keeps the service gap within 2U, FCFS does not."""
    apps = {"flood": {"api_key": "sk-flood", "max_queued": 100}, "victim": {"api_key": "sk-victim", "max_queued": 100}}
    config = make_config(apps=apps, policy=policy, in_flight=4)  # the server's configuration picks the policy
    arbiter = build_arbiter(config, engines={"chat": text_engine})
    assert arbiter.policy.name == policy and arbiter.in_flight_limit("chat") == 4
    async with live(arbiter, config) as (url, _):
        flood = await _app_process(url, "sk-flood", 60, 1, 24)
        victim = await _app_process(url, "sk-victim", 6, 2, 24)
        try:
            await asyncio.gather(_ready(flood), _ready(victim))
            flood.stdin.write(b"go\n")
            await wait_until(lambda: arbiter.stats().apps["flood"].queued >= 40, timeout=30)
            victim.stdin.write(b"go\n")
            got = await asyncio.gather(_finish(flood), _finish(victim))
        finally:
            for process in (flood, victim):
                if process.returncode is None:
                    process.kill()
                    await process.wait()
    assert [g["tokens"] for g in got] == [60 * 24, 12 * 24]
    records, charges = list(arbiter.ledger.records), list(arbiter.ledger.charges)
    bound = arbiter.bound(max(r.prompt_tokens for r in records) + 24)
    gap = max_service_gap(records, charges, {"flood": 1.0, "victim": 1.0})
    if policy == "hmfs":
        assert gap <= 2 * bound
    else:
        assert gap > 2 * bound


async def test_vision_chat_and_image_generation_over_http(vision_engine, image_engine):
    import base64
    import io

    from PIL import Image

    arbiter = fa.Arbiter()
    arbiter.add_model("vision", vision_engine)
    arbiter.add_model("image", image_engine)
    png = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(png, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    ask = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what is it?"}]}]
    expected_prompt = (await arbiter.prepare_chat("vision", ask)).n_tokens
    async with live(arbiter, make_config()) as (base, _), client(base, agent="perception") as c:
        reply = await c.chat.completions.create(model="vision", messages=ask, max_tokens=6, extra_body=GREEDY)
        assert reply.usage.prompt_tokens == expected_prompt and reply.usage.completion_tokens == 6
        assert expected_prompt > 20  # the image's tokens are in the prompt
        images = await c.images.generate(model="image", prompt="a red car", size="64x64", n=2)
        assert len(images.data) == 2 and base64.b64decode(images.data[0].b64_json)[:4] == b"\x89PNG"
        assert images.usage.output_tokens > 0 and images.usage.input_tokens == images.usage.input_tokens_details.text_tokens
        assert images.usage.total_tokens == images.usage.input_tokens + images.usage.output_tokens
        with pytest.raises(Exception) as bad:  # the stock client raises BadRequestError for a 400
            await c.chat.completions.create(model="vision", messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}]}])
        assert getattr(bad.value, "status_code", None) == 400
    stats = arbiter.stats()
    assert stats.agents["driving/perception"].done == 2 and stats.agents["driving/perception"].failed == 0


# -- the OpenAI surface on the real model ------------------------------------------------------

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
        "additionalProperties": False}
ZONE = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Weather of a city", "parameters": CITY}},
         {"type": "function", "function": {"name": "clock", "parameters": ZONE}}]
SCHEMAS = {"weather": CITY, "clock": ZONE}


async def test_a_required_tool_call_over_http_is_a_valid_call_whole_and_streamed(text_engine):
    arbiter = shared(text_engine)
    ask = [{"role": "user", "content": "weather in Oslo?"}]
    request = {"model": "chat", "messages": ask, "tools": TOOLS, "tool_choice": "required",
               "parallel_tool_calls": False, "max_tokens": 400, "seed": 3}
    async with live(arbiter, make_config()) as (url, _), client(url) as c:
        first = await c.chat.completions.create(**request)
        whole = first.choices[0]
        async with c.chat.completions.stream(**request) as stream:
            streamed = (await stream.get_final_completion()).choices[0]
        (call,) = whole.message.tool_calls
        history = [*ask, whole.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "rain"}]
        answer = await c.chat.completions.create(model="chat", messages=history, tools=TOOLS, max_tokens=8)
    assert whole.finish_reason == streamed.finish_reason == "tool_calls" and whole.message.content is None
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    (again,) = streamed.message.tool_calls  # the same seed: the same call
    assert (again.function.name, json.loads(again.function.arguments)) == (call.function.name,
                                                                          json.loads(call.function.arguments))
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result are in the prompt


async def test_a_json_schema_response_format_over_http_is_met(text_engine):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}},
              "required": ["answer", "n"], "additionalProperties": False}
    async with live(shared(text_engine), make_config()) as (url, _), client(url) as c:
        reply = await c.chat.completions.create(
            model="chat", messages=MSG, max_tokens=400, seed=5,
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


async def test_logprobs_logit_bias_and_n_over_http(text_engine):
    arbiter = shared(text_engine)
    token_id = text_engine._tokenizer.encode("road", add_special_tokens=False)[0]
    token = text_engine._tokenizer.decode([token_id])
    headers = {"Authorization": f"Bearer {KEYS['driving']}"}
    async with live(arbiter, make_config()) as (url, _), httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
        body = (await http.post("/v1/chat/completions", json={
            "model": "chat", "messages": MSG, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 3,
            "n": 2, "ignore_eos": True})).json()
        forced = (await http.post("/v1/chat/completions", json={
            "model": "chat", "messages": MSG, "max_tokens": 5, "temperature": 0, "logit_bias": {str(token_id): 100},
            "logprobs": True, "ignore_eos": True})).json()
        before = arbiter.ledger.service_of("driving")
        outside = await http.post("/v1/chat/completions", json={
            "model": "chat", "messages": MSG, "max_tokens": 5, "logit_bias": {str(text_engine.vocab_size): 1}})
        assert outside.status_code == 400 and "logit_bias" in outside.json()["error"]["message"]
        assert arbiter.ledger.service_of("driving") == before  # refused before queueing
    reply = ChatCompletion.model_validate(body)
    assert [c.index for c in reply.choices] == [0, 1] and reply.usage.completion_tokens == 12
    first, second = (c.logprobs.content for c in reply.choices)
    assert [t.token for t in first] == [t.token for t in second]  # greedy twice: the same tokens
    assert len(first) == 6 and all(len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token for t in first)
    assert "".join(t.token for t in first) == reply.choices[0].message.content
    assert {t["token"] for t in forced["choices"][0]["logprobs"]["content"]} == {token}
    assert len([r for r in arbiter.ledger.records if r.app == "driving"]) == 3


async def test_a_request_without_max_tokens_may_fill_the_context_over_http(text_engine):
    arbiter = shared(text_engine)
    prompt_tokens = text_engine.prepare_chat(MSG).n_tokens
    async with live(arbiter, make_config()) as (url, _), client(url) as c:
        reply = await c.chat.completions.create(model="chat", messages=MSG, extra_body=GREEDY)
        text = await c.completions.create(model="chat", prompt="once upon a time", extra_body=GREEDY)
    room = min(text_engine.max_model_len, (arbiter.token_budget_of("chat") or text_engine.token_capacity))
    assert reply.usage.completion_tokens == room - prompt_tokens and reply.choices[0].finish_reason == "length"
    assert text.usage.completion_tokens == room - text.usage.prompt_tokens



async def test_a_tenant_at_the_ends_of_the_weight_range_cannot_stop_the_engine_or_the_server(text_engine):
    """The subnormal-weight attack on the default path (the engine's own fair scheduler, with preemption).

    ``evil`` (app weight 0.001, the least allowed) and ``good`` (1000, the most) each keep 24
    streams in flight on a batch of 32, so the scheduler preempts; evil also sends weight
    1e-320, which is refused. Every request ends, ``/health/live`` answers throughout, and
    every counter stays finite.
    """
    apps = {"evil": {"api_key": "sk-evil", "weight": 0.001}, "good": {"api_key": "sk-good", "weight": 1000.0}}
    config = make_config(apps=apps)
    arbiter = build_arbiter(config, engines={"chat": text_engine})
    body = {"model": "chat", "messages": MSG, "max_tokens": 24, "stream": True, **GREEDY}
    async with live(arbiter, config) as (url, _), httpx.AsyncClient(base_url=url, timeout=120) as http:
        async def caller(key, weight, n):
            codes = []
            for _ in range(n):
                headers = {"Authorization": f"Bearer {key}", "X-Fairagents-Agent": "bot",
                           "X-Fairagents-Agent-Weight": weight}
                async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                    await response.aread()
                    codes.append(response.status_code)
            return codes

        stop = asyncio.Event()

        async def health():
            answers = []
            while not stop.is_set():
                started = time.monotonic()
                answers.append(((await http.get("/health/live", timeout=10)).status_code, time.monotonic() - started))
                await asyncio.sleep(0.05)
            return answers

        watching = asyncio.create_task(health())
        results = await asyncio.gather(*[caller("sk-evil", "1e-320", 1) for _ in range(24)],
                                       *[caller("sk-evil", "0.001", 2) for _ in range(24)],
                                       *[caller("sk-good", "1000", 2) for _ in range(24)])
        stop.set()
        answers = await watching
    assert {c for codes in results[:24] for c in codes} == {400}
    assert {c for codes in results[24:] for c in codes} == {200}
    assert answers and {status for status, _ in answers} == {200}
    policy = arbiter.pool_policy.policy
    counters = [*policy.app_counters().values(), *(c for app in policy.app_counters()
                                                   for c in policy.agent_counters(app).values())]
    assert counters and all(math.isfinite(c) for c in counters)
    assert arbiter.pool_policy.held() == 0
