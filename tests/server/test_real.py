"""The server on a real in-process vLLM engine (the embedded tiny Llama), through the stock openai client."""

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

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
    import httpx

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
        with pytest.raises(Exception) as bad:  # the stock client raises BadRequestError for a 400
            await c.chat.completions.create(model="vision", messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}]}])
        assert getattr(bad.value, "status_code", None) == 400
    stats = arbiter.stats()
    assert stats.agents["driving/perception"].done == 2 and stats.agents["driving/perception"].failed == 0
