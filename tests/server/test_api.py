"""The HTTP API on FakeEngines (a test double), through the stock openai client and raw HTTP.

Identity and access, bad input, overload and retry, disconnects, engine failure, and the
read-only views: fast, since the engine is a double. The real engine is in test_real.py.
"""

import asyncio
import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import fairagents as fa
from fairagents.constants import HEADER_AGENT, HEADER_APP
from fairagents.server import Config, build_arbiter
from fairagents.testing import FakeEngine

from ._support import KEYS, MSG, FakePainter, client, live, make_config, wait_until


def fake(policy="hmfs", in_flight=4, pool_in_flight=None, **engine_kw):
    arbiter = fa.Arbiter(policy=policy, in_flight=in_flight, pool_in_flight=pool_in_flight, drain_timeout=1.0)
    engine = FakeEngine(**engine_kw)
    arbiter.add_model("chat", engine)
    return arbiter, engine


def nothing_ran(arbiter, engine):
    assert engine.started_order == [] and arbiter.policy.queued() == 0
    assert not arbiter.ledger.charges and not arbiter.ledger.records


async def test_the_key_decides_the_app_and_the_header_the_agent():
    arbiter, _ = fake(tokens_per_reply=3)
    async with live(arbiter, make_config()) as (url, _):
        async with client(url, agent="planner") as c, client(url, KEYS["studio"]) as studio:
            # naming another app in a header changes nothing: the key decides
            reply = await c.chat.completions.create(model="chat", messages=MSG, max_tokens=8, extra_headers={HEADER_APP: "studio"})
            await studio.chat.completions.create(model="chat", messages=MSG, max_tokens=8)
    assert reply.choices[0].message.content == "t0 t1 t2 " and reply.choices[0].finish_reason == "stop"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 3)
    assert reply.usage.model_extra["unified_tokens"] == 3 + 2 * 3  # FakeEngine's profile has scale 1
    stats = arbiter.stats()
    assert stats.agents["driving/planner"].done == 1 and stats.agents["studio/default"].done == 1
    assert stats.apps["driving"].service == stats.apps["studio"].service == 9


async def test_an_unknown_or_missing_key_is_401_and_nothing_runs():
    arbiter, engine = fake()
    async with live(arbiter, make_config()) as (url, _):
        for authorization in ("Bearer sk-wrong", None, "Basic sk-test-driving", "Bearer"):
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": authorization} if authorization else {}) as http:
                for method, path, body in [
                    ("POST", "/v1/chat/completions", {"model": "chat", "messages": MSG}),
                    ("POST", "/v1/completions", {"model": "chat", "prompt": "hi"}),
                    ("POST", "/v1/chat/completions", {"broken": True}),  # the key is checked before the body
                    ("GET", "/v1/models", None),
                ]:
                    response = await http.request(method, path, json=body)
                    assert response.status_code == 401, (authorization, path)
                    assert response.json()["error"]["code"] == "invalid_api_key"
                    assert response.headers["www-authenticate"] == "Bearer"
        async with client(url, key="sk-wrong") as c:
            with pytest.raises(openai.AuthenticationError):
                await c.chat.completions.create(model="chat", messages=MSG)
        nothing_ran(arbiter, engine)


async def test_with_keys_off_the_app_header_names_the_app():
    arbiter, _ = fake(tokens_per_reply=2)
    async with live(arbiter, Config.model_validate({"server": {"auth": False, "max_queued": 3}})) as (url, _):
        async with httpx.AsyncClient(base_url=url) as http:
            ok = await http.post("/v1/chat/completions", json={"model": "chat", "messages": MSG},
                                 headers={HEADER_APP: "notebook", HEADER_AGENT: "call model"})
            assert ok.status_code == 200
            assert (await http.post("/v1/completions", json={"model": "chat", "prompt": "a b"})).status_code == 200
            bad = await http.post("/v1/completions", json={"model": "chat", "prompt": "a"}, headers={HEADER_APP: "team/tool"})
            assert bad.status_code == 400 and "app name" in bad.json()["error"]["message"]
    assert arbiter.stats().agents["notebook/call model"].done == 1 and arbiter.stats().agents["default/default"].done == 1


BAD = [
    ("/v1/chat/completions", {"model": "chat", "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": "chat"}, 400, "messages: Field required"),
    ("/v1/chat/completions", {"messages": MSG}, 400, "model: Field required"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "temperature": 3}, 400, "temperature"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "n": 0}, 400, "n: Input should be greater than or equal to 1"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "n": 129}, 400, "n: Input should be less than or equal to 128"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "tools": [{"type": "function"}]}, 400, "tools[0] must be"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "tool_choice": "required"}, 400, "needs tools"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "response_format": {"type": "xml"}}, 400, "response_format"),
    ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "tool", "content": "x"}]}, 400, "tool_call_id"),
    ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, 400, "only an assistant"),
    ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}, 400, "must be JSON text"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "top_logprobs": 2}, 400, "top_logprobs needs logprobs"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "frequency_penalty": -3}, 400, "frequency_penalty"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "logit_bias": {"five": 1}}, 400, "not a token id"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "audio": {"voice": "alloy"}}, 400, "'audio' is not supported"),
    ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]},
     400, "takes no images"),
    ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}]}]}, 400, "'input_audio' is not supported"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "max_tokens": 100}, 400, "exceeds the context"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "seed": 2**64}, 400, "seed must be a 64-bit"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "temperature": False}, 400, "temperature"),
    ("/v1/chat/completions", {"model": "chat", "messages": MSG, "max_tokens": "8"}, 400, "max_tokens"),
    ("/v1/completions", {"model": "chat", "prompt": "a", "stream": "yes"}, 400, "stream"),
    *[("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": url}}]}]},
      400, "over HTTP an image must be sent as a data URL")
      for url in ("/etc/hostname", "file:///etc/hostname", "http://127.0.0.1/x.png", "/dev/zero")],
    ("/v1/chat/completions", {"model": "gpt-9", "messages": MSG}, 404, "unknown model 'gpt-9'"),
    ("/v1/completions", {"model": "chat", "prompt": ["a", "b"]}, 400, "one prompt per request"),
    ("/v1/completions", {"model": "chat", "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": "chat", "prompt": "a", "echo": True}, 400, "'echo' is not supported"),
    ("/v1/completions", {"model": "chat", "prompt": "a", "logprobs": 6}, 400, "logprobs"),
    ("/v1/completions", [1, 2], 400, "JSON object"),
    ("/v1/images/generations", {"prompt": "a red car", "model": "chat"}, 400, "does not generate images"),
    ("/v1/images/generations", {"prompt": "a red car", "model": "sdxl"}, 404, "no image model 'sdxl'"),
    ("/v1/images/generations", {"prompt": "a red car"}, 404, "no image model None"),
]


async def test_bad_input_is_an_openai_shaped_error_and_costs_nothing():
    arbiter, engine = fake(max_model_len=64)
    async with live(arbiter, make_config()) as (url, _):
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEYS['driving']}"}) as http:
            for path, body, status, message in BAD:
                response = await http.post(path, json=body)
                assert response.status_code == status, (body, response.text)
                error = response.json()["error"]
                assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
                assert message in error["message"], (body, error)
            for path in {path for path, *_ in BAD}:
                garbled = await http.post(path, content=b"{not json", headers={"Content-Type": "application/json"})
                assert garbled.status_code == 400 and "not valid JSON" in garbled.json()["error"]["message"]
            nothing_ran(arbiter, engine)


async def test_the_openai_client_raises_its_own_errors_for_400_and_404():
    arbiter, _ = fake()
    async with live(arbiter, make_config()) as (url, _), client(url) as c:
        with pytest.raises(openai.BadRequestError) as info:
            await c.chat.completions.create(model="chat", messages=MSG, max_tokens=0)
        assert info.value.code == "invalid_parameter"
        with pytest.raises(openai.NotFoundError) as missing:
            await c.chat.completions.create(model="gpt-9", messages=MSG)
        assert missing.value.code == "model_not_found"
        with pytest.raises(openai.NotFoundError):
            await c.images.generate(prompt="a red car", model="sdxl")


async def test_past_its_queue_bound_an_app_gets_429_and_the_client_retry_then_succeeds():
    arbiter, engine = fake(in_flight=1, tokens_per_reply=10, token_time=0.02)
    config = make_config(apps={"driving": {"api_key": KEYS["driving"], "max_queued": 1}, "studio": {"api_key": KEYS["studio"]}})
    async with live(arbiter, config) as (url, _):
        async with client(url) as c, client(url, max_retries=3) as retrying:
            await c.chat.completions.create(model="chat", messages=MSG)  # a measured run time for the retry hint
            running = asyncio.create_task(c.chat.completions.create(model="chat", messages=MSG))
            await wait_until(lambda: arbiter.stats().apps["driving"].in_flight == 1)
            queued = asyncio.create_task(c.chat.completions.create(model="chat", messages=MSG))
            await wait_until(lambda: arbiter.stats().apps["driving"].queued == 1)
            with pytest.raises(openai.RateLimitError) as info:
                await c.chat.completions.create(model="chat", messages=MSG)
            assert info.value.code == "queue_full"
            headers = info.value.response.headers
            assert headers["retry-after"] == "1" and 100 <= int(headers["retry-after-ms"]) < 1000  # ~ one run: 0.2 s
            raw = await retrying.chat.completions.with_raw_response.create(model="chat", messages=MSG)
            assert raw.retries_taken >= 1 and raw.parse().usage.completion_tokens == 10
            await asyncio.gather(running, queued)
        async with httpx.AsyncClient(base_url=url) as http:
            metrics = await http.get("/metrics")
    rejected = _samples(metrics.text, "fairagents_requests_rejected_total")
    assert rejected == {("driving", "default", "chat"): 1 + raw.retries_taken}
    assert arbiter.stats().apps["driving"].done == 4 and len(engine.started_order) == 4


async def test_a_client_that_leaves_while_queued_leaves_the_queue_uncharged():
    arbiter, engine = fake(in_flight=1, tokens_per_reply=40, token_time=0.01)
    async with live(arbiter, make_config()) as (url, _):
        async with client(url) as c, client(url, KEYS["studio"], timeout=0.25) as impatient:
            first = asyncio.create_task(c.chat.completions.create(model="chat", messages=MSG, max_tokens=40))
            await wait_until(lambda: arbiter.stats().apps["driving"].in_flight == 1)
            with pytest.raises(openai.APITimeoutError):
                await impatient.chat.completions.create(model="chat", messages=MSG)
            await wait_until(lambda: any(r.app == "studio" for r in arbiter.ledger.records))
            (record,) = [r for r in arbiter.ledger.records if r.app == "studio"]
            assert record.outcome is fa.Outcome.CANCELLED and record.dispatched is None
            assert arbiter.ledger.service_of("studio") == 0 and arbiter.policy.queued() == 0
            assert (await first).usage.completion_tokens == 40
    assert len(engine.started_order) == 1


async def test_a_client_that_leaves_mid_stream_is_charged_only_for_what_it_got():
    arbiter, engine = fake(in_flight=1, tokens_per_reply=500, token_time=0.002)
    async with live(arbiter, make_config()) as (url, _), client(url) as c:
        stream = await c.chat.completions.create(model="chat", messages=MSG, max_tokens=500, stream=True)
        seen = []
        async for chunk in stream:
            seen.append(chunk)
            if len(seen) == 5:
                break
        await stream.close()
        await wait_until(lambda: arbiter.ledger.records)
    assert [c.choices[0].delta.content for c in seen] == ["", "t0 ", "t1 ", "t2 ", "t3 "]
    (record,) = arbiter.ledger.records
    assert record.outcome is fa.Outcome.CANCELLED and 4 <= record.output_tokens < 500
    assert arbiter.ledger.service_of("driving") == record.prompt_tokens + 2 * record.output_tokens
    assert engine.running == set()


async def test_an_engine_failure_is_503_for_its_model_and_other_models_keep_serving():
    arbiter = fa.Arbiter(in_flight=2, restart=None)
    broken = FakeEngine(tokens_per_reply=200, token_time=0.005)
    arbiter.add_model("broken", broken)
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=3))
    async with live(arbiter, make_config()) as (url, _), client(url) as c, httpx.AsyncClient(base_url=url) as http:
        stream = await c.chat.completions.create(model="broken", messages=MSG, stream=True)
        with pytest.raises(openai.APIError, match="engine failed"):
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    broken.fail()
        with pytest.raises(openai.InternalServerError) as info:
            await c.chat.completions.create(model="broken", messages=MSG)
        assert info.value.status_code == 503 and info.value.code == "engine_unavailable"
        assert info.value.response.headers["x-should-retry"] == "false"  # no automatic restart: down until restarted
        assert (await c.chat.completions.create(model="chat", messages=MSG)).usage.completion_tokens == 3
        health = await http.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "degraded"
        assert health.json()["models"] == {"broken": {"healthy": False, "restarting": False},
                                           "chat": {"healthy": True, "restarting": False}}
        assert (await http.get("/health/live")).status_code == 200  # the process is alive: no reason to restart it
        metrics = (await http.get("/metrics")).text
        await arbiter.restart_model("broken", backoff=0.0)
        assert (await http.get("/health")).status_code == 200
        assert (await c.chat.completions.create(model="broken", messages=MSG, max_tokens=2)).usage.completion_tokens == 2
    assert _samples(metrics, "fairagents_model_up") == {("broken",): 0.0, ("chat",): 1.0}


async def test_a_dead_model_restarts_by_itself_and_health_goes_503_then_200():
    arbiter = fa.Arbiter(in_flight=2, restart=fa.Restart(backoff=0.3))
    broken = FakeEngine(tokens_per_reply=3)
    arbiter.add_model("broken", broken)
    async with live(arbiter, make_config()) as (url, _), client(url) as c, \
            httpx.AsyncClient(base_url=url) as http:
        broken.fail()
        with pytest.raises(openai.InternalServerError):
            await c.chat.completions.create(model="broken", messages=MSG)
        with pytest.raises(openai.InternalServerError) as info:
            await c.chat.completions.create(model="broken", messages=MSG)
        headers = info.value.response.headers
        assert (headers["x-should-retry"], headers["retry-after"]) == ("true", "1")  # it is coming back
        health = await http.get("/health")
        assert health.status_code == 503 and health.json()["models"]["broken"] == {"healthy": False, "restarting": True}
        for _ in range(100):
            if (await http.get("/health")).status_code == 200:
                break
            await asyncio.sleep(0.02)
        assert (await http.get("/health")).json()["models"]["broken"] == {"healthy": True, "restarting": False}
        assert (await c.chat.completions.create(model="broken", messages=MSG)).usage.completion_tokens == 3


async def test_models_fairness_metrics_health_and_dashboard():
    arbiter, _ = fake(tokens_per_reply=4)
    async with live(arbiter, make_config()) as (url, gateway):
        async with client(url, agent="planner") as c, client(url, KEYS["studio"], agent="writer") as s:
            listed = await c.models.list()
            assert [m.id for m in listed.data] == ["chat"] and listed.data[0].model_extra["max_model_len"] == 4096
            one = await c.models.retrieve("chat")
            assert one.id == "chat" and one.model_extra == listed.data[0].model_extra
            with pytest.raises(openai.NotFoundError) as missing:
                await c.models.retrieve("nope")
            assert missing.value.body["code"] == "model_not_found"
            await asyncio.gather(*(c.chat.completions.create(model="chat", messages=MSG) for _ in range(3)),
                                 s.completions.create(model="chat", prompt="once upon a time", max_tokens=2))
        gateway.view.sample()
        async with httpx.AsyncClient(base_url=url) as http:
            fairness = (await http.get("/v1/fairness", params={"history": 60, "app": "studio"})).json()
            metrics = (await http.get("/metrics")).text
            health = await http.get("/health")
            page = await http.get("/dashboard")
            assert (await http.get("/v1/fairness", params={"history": -1})).status_code == 400
    driving, studio = fairness["apps"]["driving"], fairness["apps"]["studio"]
    assert fairness["policy"] == "hmfs" and fairness["unit"] == "unified_tokens" and not fairness["draining"]
    assert fairness["models"]["chat"] == {"healthy": True, "restarting": False, "in_flight": 0, "in_flight_limit": 4, "queued": 0,
                                            "device": "local"}
    assert fairness["pool"] == {"in_flight": 0, "in_flight_limit": None}
    assert (driving["weight"], driving["weight_share"], driving["done"], driving["service"]) == (2.0, 2 / 3, 3, 3 * (3 + 8))
    assert studio["agents"]["writer"]["service"] == 5 + 2 * 2 and driving["agents"]["planner"]["share"] == 1.0
    assert driving["share"] == pytest.approx(33 / 42) and driving["ttft_seconds"]["p50"] >= 0
    assert fairness["history"]["apps"]["driving"][-1] == 33 and fairness["history"]["agents"]["studio/writer"][-1] == 9
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    assert all(name.startswith("fairagents_") for name in families)
    for family in families.values():
        for sample in family.samples:
            assert set(sample.labels) <= {"app", "agent", "model", "le"} or (
                family.name.startswith("fairagents_device_") and set(sample.labels) == {"device", "app"}), sample
    assert _samples(metrics, "fairagents_requests_finished_total") == {("driving", "planner", "chat"): 3, ("studio", "writer", "chat"): 1}
    assert _samples(metrics, "fairagents_completion_tokens_total")[("driving", "planner", "chat")] == 12
    assert _samples(metrics, "fairagents_service_unified_tokens_total") == {("driving", "planner"): 33, ("studio", "writer"): 9}
    assert _samples(metrics, "fairagents_ttft_seconds_count")[("driving", "chat")] == 3  # no agent label
    assert _samples(metrics, "fairagents_app_weight_share_ratio")[("driving",)] == pytest.approx(2 / 3)
    assert _samples(metrics, "fairagents_pool_in_flight_requests") == {(): 0}
    assert "fairagents_pool_in_flight_limit" not in families  # no pool limit configured
    assert health.json() == {"status": "ok", "models": {"chat": {"healthy": True, "restarting": False}}}
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html") and "/v1/fairness" in page.text


async def test_the_fairness_view_tells_a_met_demand_from_a_backlog():
    """An app with nothing waiting has its demand met, however small its share; one with requests waiting has not."""
    arbiter, engine = fake(in_flight=2, manual=True)
    async with live(arbiter, make_config()) as (url, gateway):
        view = gateway.view
        view.max_age = 0  # every read is of now
        async with client(url, agent="planner") as c, client(url, KEYS["studio"], agent="writer") as s, \
                httpx.AsyncClient(base_url=url) as http:
            calls = [asyncio.create_task(c.chat.completions.create(model="chat", messages=MSG))]  # closed loop: one at a time
            await wait_until(lambda: len(engine.running) == 1)
            calls += [asyncio.create_task(s.chat.completions.create(model="chat", messages=MSG)) for _ in range(3)]
            await wait_until(lambda: len(engine.running) == 2 and arbiter.policy.queued() == 2)
            view.samples.clear()  # from here on, every sample sees studio backlogged and driving not
            view.sample()
            held = (await http.get("/v1/fairness")).json()
            ended: set[str] = set()
            while not all(call.done() for call in calls):
                for request_id in set(engine.running) - ended:
                    engine.emit(request_id, 2, finish="stop")
                    ended.add(request_id)
                await asyncio.sleep(0.005)
            await asyncio.gather(*calls)
            view.sample()
            after = (await http.get("/v1/fairness")).json()
    driving, studio = held["apps"]["driving"], held["apps"]["studio"]
    assert (driving["queued"], driving["in_flight"], driving["demand_met"], driving["backlogged"]) == (0, 1, True, 0.0)
    assert driving["agents"]["planner"]["demand_met"] is True  # running is being served, not waiting
    assert (studio["queued"], studio["in_flight"], studio["demand_met"], studio["backlogged"]) == (2, 1, False, 1.0)
    assert studio["agents"]["writer"]["demand_met"] is False and studio["agents"]["writer"]["backlogged"] == 1.0
    assert after["apps"]["studio"]["demand_met"] is True and 0 < after["apps"]["studio"]["backlogged"] < 1
    assert after["apps"]["driving"]["demand_met"] is True and after["apps"]["driving"]["backlogged"] == 0.0
    assert after["apps"]["studio"]["done"] == 3 and after["apps"]["driving"]["done"] == 1


async def test_entitlements_count_the_active_apps_and_a_shortfall_must_pass_the_tolerance():
    """Five apps declared, two busy: each busy app is entitled to half, not a fifth; an even split is no shortfall,
    a share short of the entitlement by less than the tolerance neither, one short by more is."""
    arbiter, engine = fake(in_flight=2, manual=True)
    names = ("driving", "studio", "idle-1", "idle-2", "idle-3")
    apps = {name: {"api_key": f"sk-test-{name}"} for name in names}
    async with live(arbiter, make_config(apps)) as (url, gateway):
        gateway.view.max_age = 0
        async with client(url, "sk-test-driving") as c, client(url, "sk-test-studio") as s, \
                httpx.AsyncClient(base_url=url) as http:
            calls = [asyncio.create_task(x.chat.completions.create(model="chat", messages=MSG)) for x in (c, s, c, s)]
            await wait_until(lambda: len(engine.running) == 2 and arbiter.policy.queued() == 2)
            running = {t.request.agent_key[0]: t.request.id for t in arbiter.dispatcher.tickets() if t.dispatched}
            assert set(running) == {"driving", "studio"}  # one of each runs, one of each waits

            async def fairness(**tokens):
                for app, n in tokens.items():
                    engine.emit(running[app], n)
                await asyncio.sleep(0.01)
                return (await http.get("/v1/fairness")).json()["apps"]

            even = await fairness(driving=10, studio=10)
            close = await fairness(driving=1)  # studio 23 of 48 unified tokens: 47.9 % against 50 %
            short = await fairness(driving=4)  # studio 23 of 56: 41.1 % against 50 %
            ended: set[str] = set()
            while not all(call.done() for call in calls):
                for request_id in set(engine.running) - ended:
                    engine.emit(request_id, 1, finish="stop")
                    ended.add(request_id)
                await asyncio.sleep(0.005)
            await asyncio.gather(*calls)
    for name in names[2:]:
        idle = even[name]
        assert (idle["active"], idle["entitled_share"], idle["below_entitlement"], idle["weight_share"]) == (
            False, None, False, 0.2)
    for name in names[:2]:
        assert (even[name]["active"], even[name]["entitled_share"], even[name]["recent_share"]) == (True, 0.5, 0.5)
        assert even[name]["queued"] == 1 and not even[name]["below_entitlement"]  # 50.0 % of 50.0 %
    assert close["studio"]["recent_share"] == pytest.approx(23 / 48) and not close["studio"]["below_entitlement"]
    assert short["studio"]["recent_share"] == pytest.approx(23 / 56) and short["studio"]["below_entitlement"]
    assert not short["driving"]["below_entitlement"]


async def test_an_observer_key_guards_the_views():
    arbiter, _ = fake()
    async with live(arbiter, make_config(observer_key="sk-observer", public_views=False)) as (url, _):
        async with httpx.AsyncClient(base_url=url) as http:
            for path in ("/v1/fairness", "/metrics", "/dashboard"):
                assert (await http.get(path)).status_code == 401
                assert (await http.get(path, headers={"Authorization": "Bearer sk-observer"})).status_code == 200
            assert (await http.get("/metrics", headers={"Authorization": f"Bearer {KEYS['driving']}"})).status_code == 401
            assert (await http.get("/health")).status_code == 200


def _samples(text, name):
    """Values of one metric by label values (in app, agent, model order)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                key = tuple(sample.labels[k] for k in ("app", "agent", "model") if k in sample.labels)
                out[key] = sample.value
    return out


async def test_a_body_past_the_limit_is_413(monkeypatch):
    import fairagents.server.incoming as incoming

    monkeypatch.setattr(incoming, "MAX_BODY_BYTES", 1000)
    arbiter, engine = fake()
    async with live(arbiter, make_config()) as (url, _), client(url) as c:
        with pytest.raises(openai.APIStatusError) as info:
            await c.chat.completions.create(model="chat", messages=[{"role": "user", "content": "word " * 400}])
        assert info.value.status_code == 413
        assert (await c.chat.completions.create(model="chat", messages=MSG)).usage.completion_tokens == 8
    assert len(engine.started_order) == 1


async def test_a_pool_limit_shows_in_the_fairness_view_and_metrics():
    arbiter, _ = fake(pool_in_flight=1, tokens_per_reply=50, token_time=0.01)
    async with live(arbiter, make_config()) as (url, gateway):
        async with client(url, agent="planner") as c:
            calls = [asyncio.create_task(c.chat.completions.create(model="chat", messages=MSG)) for _ in range(3)]
            await wait_until(lambda: arbiter.pool_running == 1 and arbiter.policy.queued() == 2)
            async with httpx.AsyncClient(base_url=url) as http:
                fairness = (await http.get("/v1/fairness")).json()
                metrics = (await http.get("/metrics")).text
            await asyncio.gather(*calls)
    assert fairness["pool"] == {"in_flight": 1, "in_flight_limit": 1}
    assert fairness["models"]["chat"]["in_flight"] == 1 and fairness["models"]["chat"]["queued"] == 2
    assert _samples(metrics, "fairagents_pool_in_flight_requests") == {(): 1}
    assert _samples(metrics, "fairagents_pool_in_flight_limit") == {(): 1}


@pytest.mark.parametrize(("cap", "expected"), [("context", 64 - 3), (1024, 64 - 3), (10, 10)])
async def test_a_chat_without_max_tokens_fits_the_token_budget(cap, expected):
    """Without max_tokens a chat gets the default, or fills the context, but never more than the model's KV budget holds."""
    arbiter, engine = fake(token_capacity=64, tokens_per_reply=1000)
    async with live(arbiter, make_config(default_max_tokens=cap)) as (url, _), client(url) as c:
        reply = await c.chat.completions.create(model="chat", messages=MSG)
    assert reply.usage.completion_tokens == expected  # FakeEngine runs to max_tokens: 3 prompt tokens here


async def test_deep_nesting_and_lone_surrogates_are_openai_shaped_400s():
    arbiter, engine = fake()
    nested = b'{"model": "chat", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    surrogate = b'{"model": "chat", "prompt": "\\ud800 hello"}'
    async with live(arbiter, make_config()) as (url, _):
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEYS['driving']}"}) as http:
            for path in ("/v1/completions", "/v1/chat/completions"):
                for body, message in ((nested, "nested too deeply"), (surrogate, "not valid Unicode")):
                    response = await http.post(path, content=body, headers={"Content-Type": "application/json"})
                    assert response.status_code == 400, response.text
                    assert message in response.json()["error"]["message"]
            nothing_ran(arbiter, engine)


# One digit past the longest integer Python converts from text (sys.get_int_max_str_digits()).
BIG = "1" * 4301
CALL = ('{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": '
        '{"name": "w", "arguments": %s}}]}, {"role": "tool", "tool_call_id": "c1", "content": "r"}')
UNREADABLE = [  # (path, the body's JSON text as sent, the field the 400 names)
    ("/v1/chat/completions", f'{{"model": "chat", "messages": [{{"role": "user", "content": "hi"}}], "seed": {BIG}}}',
     "seed"),
    ("/v1/chat/completions", f'{{"model": "chat", "messages": [{{"role": "user", "content": "hi"}}], '
                             f'"max_tokens": -{BIG}}}', "max_tokens"),
    ("/v1/chat/completions", f'{{"model": "chat", "messages": [{{"role": "user", "content": [{{"type": "text", '
                             f'"text": "hi", "n": {BIG}}}]}}]}}', "messages[0].content[0].n"),
    ("/v1/chat/completions", '{"model": "chat", "messages": [{"role": "user", "content": "hi"}], '
                             '"logit_bias": {"3": 1e999}}', "logit_bias"),
    ("/v1/chat/completions", '{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
     "temperature"),
    ("/v1/chat/completions", '{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "top_p": -Infinity}',
     "top_p"),
    ("/v1/chat/completions", '{"model": "chat", "messages": [{"role": "user", "content": "hi"}], '
                             '"metadata": {"score": 1' + "0" * 400 + '.5}}', "metadata.score"),
    ("/v1/chat/completions", '{"model": "chat", "messages": [{"role": "user", "content": "hi"}, '
                             + CALL % json.dumps('{"a": %s}' % BIG) + "]}",
     "messages[1].tool_calls[0].function.arguments"),
    ("/v1/chat/completions", '{"model": "chat", "messages": [{"role": "user", "content": "hi"}, '
                             + CALL % json.dumps('{"a": NaN}') + "]}", "messages[1].tool_calls[0].function.arguments"),
    ("/v1/chat/completions", '{"model": "chat", "messages": [{"role": "user", "content": "hi"}, '
                             + CALL % json.dumps("[" * 100_000 + "]" * 100_000) + "]}",  # nested past what json reads
     "messages[1].tool_calls[0].function.arguments"),
    ("/v1/completions", f'{{"model": "chat", "prompt": [1, {BIG}]}}', "prompt[1]"),
    ("/v1/completions", f'{{"model": "chat", "prompt": "a", "logprobs": {BIG}}}', "logprobs"),
    ("/v1/images/generations", f'{{"prompt": "a red car", "n": {BIG}}}', "n"),
]


def with_painter():
    arbiter, engine = fake()
    arbiter.add_model("painter", FakePainter())
    return arbiter, engine


@pytest.mark.parametrize("large", [False, True], ids=["inline", "in the pool"])
@pytest.mark.parametrize(("path", "text", "param"), UNREADABLE,
                         ids=[f"{i}-{param}" for i, (*_, param) in enumerate(UNREADABLE)])
async def test_numbers_json_or_python_cannot_hold_are_400s_naming_the_field(path, text, param, large):
    """Past Python's digits, past the doubles, NaN and Infinity: a 400 naming the field, also from the text pool."""
    if large:  # past INLINE_PARSE_BYTES: parsed in the text preprocessing pool
        text = text[:-1] + ', "user": "' + "u" * (65 * 2**10) + '"}'
    arbiter, engine = with_painter()
    async with live(arbiter, make_config()) as (url, _):
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEYS['driving']}"}) as http:
            response = await http.post(path, content=text.encode(), headers={"Content-Type": "application/json"})
            assert response.status_code == 400, response.text[:300]
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
            assert error["param"] == param, error
            assert param.removesuffix(".arguments") in error["message"], error  # a call's: "the arguments of 'w'"
            assert len(error["message"]) < 300  # the number is not echoed back
            nothing_ran(arbiter, engine)


def edge_cases():
    """(path, body, field) for every numeric field at the edges of JSON: huge ints, ±1e308, the least double."""
    chat = {"model": "chat", "messages": MSG}
    bodies = []
    for field in ("max_tokens", "max_completion_tokens", "n", "seed", "top_logprobs"):
        for value in (10**40, -(10**40), 10**4299, 2**63, -(2**63)):
            bodies.append(("/v1/chat/completions", {**chat, field: value, "logprobs": True}, field))
    for field in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        for value in (1e308, -1e308, 5e-324, -0.0, 10**40):
            bodies.append(("/v1/chat/completions", {**chat, field: value}, field))
    for bias in ({"3": 10**40}, {"3": 1e308}, {"3": 5e-324}, {str(10**40): 1}, {"1" * 4301: 1}, {"0" * 5000 + "3": 1},
                 {"-3": 1}):
        bodies.append(("/v1/chat/completions", {**chat, "logit_bias": bias}, "logit_bias"))
    for field in ("logprobs", "seed", "max_tokens"):
        for value in (10**40, -(10**40), 10**4299):
            bodies.append(("/v1/completions", {"model": "chat", "prompt": "a", field: value}, field))
    for extra in ({"n": 10**40}, {"n": -(10**40)}, {"size": f"{10**40}x{10**40}"}, {"size": "1e308x8"}):
        bodies.append(("/v1/images/generations", {"prompt": "a red car", **extra}, next(iter(extra))))
    return bodies


async def test_numbers_at_the_edges_of_json_are_accepted_or_400s_naming_the_field():
    arbiter, _ = with_painter()
    async with live(arbiter, make_config()) as (url, _):
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEYS['driving']}"}) as http:
            for path, body, field in edge_cases():
                response = await http.post(path, json=body)
                assert response.status_code in (200, 400), (body, response.text[:300])
                if response.status_code == 400:
                    error = response.json()["error"]
                    assert error["type"] == "invalid_request_error" and len(error["message"]) < 300
                    assert field in error["message"] or field == error["param"], (str(body)[:200], error)


async def test_token_ids_outside_the_vocabulary_are_refused_before_anything_runs():
    arbiter, engine = fake(vocab_size=100)
    async with live(arbiter, make_config()) as (url, _), client(url) as c:
        with pytest.raises(openai.BadRequestError, match="token id 5000 is outside the model's vocabulary"):
            await c.completions.create(model="chat", prompt=[1, 5000], max_tokens=2)
        nothing_ran(arbiter, engine)
        assert (await c.completions.create(model="chat", prompt=[1, 99], max_tokens=2)).usage.completion_tokens == 2


@pytest.mark.parametrize("policy", sorted(fa.policies.POLICIES))
async def test_every_policy_name_serves_through_the_server(policy):
    config = make_config(policy=policy, in_flight=2)
    arbiter = build_arbiter(config, engines={"chat": FakeEngine(tokens_per_reply=3)})
    assert arbiter.policy.name == policy
    async with live(arbiter, config) as (url, _), client(url) as c, client(url, KEYS["studio"]) as s:
        replies = await asyncio.gather(*(who.chat.completions.create(model="chat", messages=MSG, max_tokens=4)
                                         for who in (c, s, c, s)))
    assert [r.usage.completion_tokens for r in replies] == [3, 3, 3, 3]


def _asgi(arbiter, config, key=KEYS["driving"]):
    """An HTTP client of the ASGI app itself (no socket), with ``key``."""
    from fairagents.server import create_app

    transport = httpx.ASGITransport(app=create_app(arbiter, config))
    return httpx.AsyncClient(transport=transport, base_url="http://fairagents", headers={"Authorization": f"Bearer {key}"})


def _chat(**fields):
    return {"model": "chat", "messages": MSG, **fields}


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", _chat(max_tokens=0), "max_tokens"),
    ("/v1/chat/completions", _chat(max_completion_tokens=-1), "max_completion_tokens"),
    ("/v1/chat/completions", _chat(temperature=5), "temperature"),
    ("/v1/chat/completions", _chat(temperature=False), "temperature"),
    ("/v1/chat/completions", _chat(top_p=0), "top_p"),
    ("/v1/chat/completions", _chat(presence_penalty=-3), "presence_penalty"),
    ("/v1/chat/completions", _chat(seed=2**64), "seed"),
    ("/v1/chat/completions", _chat(stop=[""]), "stop"),
    ("/v1/chat/completions", _chat(logit_bias={"x": 1}), "logit_bias"),
    ("/v1/chat/completions", _chat(n=0), "n"),
    ("/v1/chat/completions", _chat(echo=True), "echo"),
    ("/v1/chat/completions", _chat(top_logprobs=2), "top_logprobs"),
    ("/v1/chat/completions", _chat(tool_choice="required"), "tool_choice"),
    ("/v1/chat/completions", _chat(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools[0].function.name"),
    ("/v1/chat/completions", _chat(response_format={"type": "xml"}), "response_format"),
    ("/v1/chat/completions", _chat(stream_options={"include_usage": "yes"}), "stream_options.include_usage"),
    ("/v1/chat/completions", {"messages": MSG}, "model"),
    ("/v1/chat/completions", _chat(model="image"), "model"),
    ("/v1/chat/completions", _chat(messages=[]), "messages"),
    ("/v1/chat/completions", _chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    ("/v1/chat/completions", _chat(messages=[{"role": "robot", "content": "hi"}]), "messages[0].role"),
    ("/v1/chat/completions", _chat(messages=[*MSG, {"role": "tool", "content": "42"}]), "messages[1].tool_call_id"),
    ("/v1/chat/completions", _chat(messages=[*MSG, {"role": "tool", "tool_call_id": "call_1", "content": "42"}]),
     "messages[1].role"),  # it answers no call
    ("/v1/chat/completions", _chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                   tool_choice={"type": "function", "function": {"name": ["f"]}}), "tool_choice"),
    ("/v1/chat/completions", _chat(tools=[{"type": "function", "function": {"name": "f\n"}}]), "tools[0].function.name"),
    ("/v1/chat/completions", _chat(messages=[*MSG, {"role": "user", "content": [{"type": "audio"}]}]),
     "messages[1].content"),
    ("/v1/chat/completions", _chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]), "messages[0].content"),
    ("/v1/chat/completions", _chat(max_tokens=100), "messages"),  # the prompt and max_tokens outgrow the context
    ("/v1/completions", {"model": "chat", "prompt": "once upon", "max_tokens": 100}, "prompt"),
    ("/v1/completions", {"model": "chat", "prompt": [1, 5000], "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"model": "chat", "prompt": ["a", "b"]}, "prompt"),
    ("/v1/completions", {"model": "chat", "prompt": "a", "logprobs": 9}, "logprobs"),
    ("/v1/images/generations", {"model": "chat", "prompt": "a red car"}, "model"),
    ("/v1/images/generations", {"model": "image", "prompt": "a red car", "response_format": "url"}, "response_format"),
])
async def test_a_400_names_the_request_field_it_is_about_in_param(path, body, param):
    from ._support import FakePainter

    arbiter, engine = fake(max_model_len=32, vocab_size=1000)
    arbiter.add_model("image", FakePainter())
    async with arbiter, _asgi(arbiter, make_config()) as http:
        response = await http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param), error
    nothing_ran(arbiter, engine)


async def test_an_unknown_model_names_the_model_param():
    arbiter, _ = fake()
    async with arbiter, _asgi(arbiter, make_config()) as http:
        response = await http.post("/v1/chat/completions", json=_chat(model="chta"))
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


async def test_default_max_tokens_the_requests_own_then_its_apps_then_the_servers_clipped_to_the_context():
    arbiter, _ = fake(tokens_per_reply=10_000, max_model_len=64)  # it runs to max_tokens; 3 prompt tokens
    apps = {"driving": {"api_key": KEYS["driving"]},
            "studio": {"api_key": KEYS["studio"], "default_max_tokens": 7},
            "essays": {"api_key": "sk-essays", "default_max_tokens": "context"}}

    async def produced(config, key=KEYS["driving"], path="/v1/chat/completions", **fields):
        async with _asgi(arbiter, config, key) as http:
            body = _chat(**fields) if path.endswith("chat/completions") else {"model": "chat", "prompt": "a b", **fields}
            response = await http.post(path, json=body)
        assert response.status_code == 200, response.text
        return response.json()["usage"]["completion_tokens"]

    async with arbiter:
        served = make_config(apps=apps, default_max_tokens=20)
        assert await produced(served) == 20  # the server's
        assert await produced(served, path="/v1/completions") == 20
        assert await produced(served, KEYS["studio"]) == 7  # the app's own
        assert await produced(served, "sk-essays") == 64 - 3  # the app's own: the rest of the context
        assert await produced(served, KEYS["studio"], max_tokens=9) == 9  # the request's own
        assert await produced(make_config(apps=apps), KEYS["studio"], max_completion_tokens=11) == 11
    arbiter, _ = fake(tokens_per_reply=10_000, max_model_len=64)
    async with arbiter:
        assert await produced(make_config(apps=apps)) == 64 - 3  # 1024 does not fit: clipped to the context
    arbiter, _ = fake(tokens_per_reply=10_000)
    async with arbiter:
        assert await produced(make_config(apps=apps)) == 1024  # the server's default
