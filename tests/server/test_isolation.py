"""No app can harm another: every attack in turn, while two well-behaved apps keep being served.

Each attack comes from its own app (``mallory``) over HTTP on loopback, at the real
server. While it runs, ``driving`` and ``studio`` send ordinary requests, and every
one of them must succeed. An attack of bad input must cost nothing: no charge and no
slot for mallory.
"""

import asyncio
import json
import statistics
import time

import httpx
import pytest

import fairagents as fa
from fairagents.server import Config
from fairagents.testing import FakeEngine

from ._support import KEYS, live, wait_until

pytestmark = pytest.mark.asyncio(loop_scope="session")

MALLORY = "sk-test-mallory"


def config(**server):
    apps = {
        "driving": {"api_key": KEYS["driving"]},
        "studio": {"api_key": KEYS["studio"]},
        "mallory": {"api_key": MALLORY, "max_queued": 4},
    }
    return Config.model_validate({"apps": apps, "models": {"chat": {}}, "server": server})


def arbiter(**engine):
    a = fa.Arbiter(in_flight=4, preprocess_queue_per_app=4)
    a.add_model("chat", FakeEngine(tokens_per_reply=2, token_time=0.002, vocab_size=1000, max_token_bytes=16,
                                   max_model_len=2048, **engine))
    return a


def chat(content="hello there", **extra):
    return {"model": "chat", "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def nested(depth):
    return ("[" * depth + "]" * depth).encode()


# name -> (path, body (a dict, or raw bytes), expected status)
ATTACKS = {
    "seed past 64 bits": ("/v1/chat/completions", chat(seed=2**64), 400),
    "a file path as an image": ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "/etc/hostname"}}]}]}, 400),
    "a file:// URL as an image": ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file:///dev/zero"}}]}]}, 400),
    "JSON nested 100,000 deep": ("/v1/chat/completions", b'{"model": "chat", "messages": ' + nested(100_000) + b"}", 400),
    "a lone surrogate": ("/v1/completions", b'{"model": "chat", "prompt": "a \\ud800 b"}', 400),
    "token ids outside the vocabulary": ("/v1/completions", {"model": "chat", "prompt": [1, 2, 10**9]}, 400),
    "temperature false": ("/v1/chat/completions", chat(temperature=False), 400),
    "an 8 MB prompt": ("/v1/chat/completions", chat("word " * (8 * 2**20 // 5)), 400),
    "a 33 MB body": ("/v1/completions", b" " * (33 * 2**20), 413),
    "an unknown model": ("/v1/chat/completions", {**chat(), "model": "nope"}, 404),
}


async def _served(url, key, stop):
    """A well-behaved app: one chat after another until ``stop``; every reply must be a 200."""
    statuses = []
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        while not stop.is_set() or not statuses:
            r = await http.post("/v1/chat/completions", json=chat())
            statuses.append(r.status_code)
    return statuses


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_two_apps_keep_being_served_while_a_third_attacks(attack):
    path, body, expected = ATTACKS[attack]
    a = arbiter()
    async with live(a, config()) as (url, _):
        stop = asyncio.Event()
        victims = [asyncio.create_task(_served(url, KEYS[app], stop)) for app in ("driving", "studio")]
        headers = {"Authorization": f"Bearer {MALLORY}", "Content-Type": "application/json"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            for _ in range(3):
                r = await http.post(path, content=raw)
                assert r.status_code == expected, r.text
                error = r.json()["error"]  # OpenAI's shape, never a bare 500 or a dropped connection
                assert error["message"] and error["type"] == "invalid_request_error"
                assert "/etc" not in error["message"] and "/dev" not in error["message"]
        stop.set()
        statuses = sum(await asyncio.gather(*victims), [])
        assert statuses and set(statuses) == {200}
        assert a.serving("chat")
        stats = a.stats()
    assert "mallory" not in stats.apps or stats.apps["mallory"].service == 0  # bad input is charged nothing


async def test_a_flood_is_refused_alone_and_the_others_keep_their_latency():
    """mallory sends 60 requests at once; past its queue bound it gets 429s, the others 200s."""
    a = arbiter()
    async with live(a, config()) as (url, _):
        stop = asyncio.Event()
        victims = [asyncio.create_task(_served(url, KEYS[app], stop)) for app in ("driving", "studio")]
        headers = {"Authorization": f"Bearer {MALLORY}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30,
                                     limits=httpx.Limits(max_connections=100)) as http:
            flood = await asyncio.gather(*(http.post("/v1/chat/completions", json=chat()) for _ in range(60)))
        stop.set()
        statuses = sum(await asyncio.gather(*victims), [])
    codes = [r.status_code for r in flood]
    assert set(codes) <= {200, 429} and codes.count(429) > 0
    assert all(r.headers["retry-after"] for r in flood if r.status_code == 429)
    assert set(statuses) == {200}


async def test_a_full_queue_is_refused_before_the_prompt_is_tokenized():
    a = arbiter(prepare_time=1.0, manual=True)
    async with live(a, config()) as (url, _):
        headers = {"Authorization": f"Bearer {MALLORY}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
            engine = a.engine("chat")
            engine.prepare_time = 0.0
            held = []
            for n in range(1, 9):  # 4 running in the engine, then 4 queued: mallory's bound
                held.append(asyncio.create_task(http.post("/v1/chat/completions", json=chat())))
                await wait_until(lambda n=n: len(engine.running) + a.queued("chat") == n)
            engine.prepare_time = 1.0
            used = a.text_preprocessor.used["mallory"]
            start = time.perf_counter()
            refused = await http.post("/v1/chat/completions", json=chat())
            waited = time.perf_counter() - start
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
            assert a.text_preprocessor.used["mallory"] == used  # no worker time spent on it
            assert waited < 1.0  # refused before a tokenizing that takes a second
            for rid in list(engine.running):
                engine.emit(rid, 1, finish="stop")
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)


async def test_health_answers_at_once_while_a_prompt_is_being_prepared():
    """Preparing a prompt takes two seconds of CPU; /health keeps answering in milliseconds meanwhile."""
    a = arbiter(prepare_time=2.0)
    async with live(a, config()) as (url, _):
        headers = {"Authorization": f"Bearer {KEYS['driving']}"}
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            slow = asyncio.create_task(http.post("/v1/chat/completions", json=chat(), headers=headers))
            await asyncio.sleep(0.1)
            latencies = []
            while not slow.done():
                start = time.perf_counter()
                assert (await http.get("/health")).status_code == 200
                latencies.append(time.perf_counter() - start)
                await asyncio.sleep(0.05)
            assert (await slow).status_code == 200
    assert len(latencies) >= 10  # the loop kept turning for the whole preparation
    assert statistics.median(latencies) < 0.1 and max(latencies) < 1.0


async def test_error_messages_do_not_reveal_server_paths():
    a = arbiter(manual=True)
    async with live(a, config()) as (url, _):
        engine = a.engine("chat")
        headers = {"Authorization": f"Bearer {KEYS['driving']}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
            pending = asyncio.create_task(http.post("/v1/chat/completions", json=chat()))
            await wait_until(lambda: engine.running)
            engine.fail_request(next(iter(engine.running)), OSError("cannot read /srv/models/llama/tokenizer.json"))
            r = await pending
        assert r.status_code == 503
        message = r.json()["error"]["message"]
        assert "cannot read <path>" in message and "/srv" not in message
        assert a.serving("chat")  # one request's failure; the model serves on


async def test_a_client_that_leaves_mid_body_is_not_an_error(caplog):
    a = arbiter()
    async with live(a, config()) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS['driving']}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"model\": ".encode())
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()
        await writer.wait_closed()
        await asyncio.sleep(0.1)
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEYS['driving']}"}) as http:
            assert (await http.post("/v1/chat/completions", json=chat())).status_code == 200
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
