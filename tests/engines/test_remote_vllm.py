"""OpenAIEngine against two real ``vllm serve`` replicas on loopback (the embedded tiny model)."""

import asyncio
import re

import httpx
import pytest

import fairagents as fa

from .._vllm_servers import kill_server, start_server, stop_server, wait_healthy

pytest.importorskip("vllm")
pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="module")]

MSG = [{"role": "user", "content": "plan a route through the city"}]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    logs = [tmp_path_factory.mktemp("replicas") / f"replica{i}.log" for i in range(2)]
    servers = [start_server(log) for log in logs]  # both start at once
    try:
        for (proc, url), log in zip(servers, logs, strict=True):
            wait_healthy(proc, url, log)
        yield servers
    finally:
        for proc, _ in servers:
            stop_server(proc)


def pool(replicas):
    """An OpenAIEngine over the replicas, an arbiter over it, and an agent of app ``a``."""
    from fairagents.engines.remote import OpenAIEngine
    from fairagents.models import ensure_default_models

    engine = OpenAIEngine([url for _, url in replicas], model="chat", backoff=0.2, max_backoff=1.0,
                          model_path=ensure_default_models(["text"])["text"])
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", engine)
    return engine, arbiter, arbiter.app("a").agent("t")


def running_on(url):
    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=5).text
    found = re.search(r'^vllm:num_requests_running\{[^}]*\} ([0-9.]+)', text, re.M)
    return float(found.group(1)) if found else 0.0


async def test_requests_stream_through_the_arbiter_with_the_servers_usage(replicas):
    engine, arbiter, who = pool(replicas)
    async with arbiter:
        assert engine.token_capacity and arbiter.token_budget_of("chat") == engine.token_capacity
        reply = await who.chat("chat", MSG, max_tokens=12, ignore_eos=True)
        streamed = [d async for d in who.stream_chat("chat", MSG, max_tokens=9, ignore_eos=True)]
        replies = await asyncio.gather(*(who.chat("chat", MSG, max_tokens=6, ignore_eos=True) for _ in range(8)))
    assert reply.usage.completion_tokens == 12 and reply.text
    assert sum(d.new_tokens for d in streamed) == 9
    assert all(r.usage.completion_tokens == 6 for r in replies)
    assert all(r.served >= 3 for r in engine.replicas)  # least loaded: both replicas took a share
    stats = arbiter.stats()
    assert stats.apps["a"].done == 10 and stats.apps["a"].service > 0


async def test_tools_are_rendered_here_and_required_calls_enforced_by_the_replica(replicas):
    import jsonschema

    city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
    tools = [{"type": "function", "function": {"name": "weather", "parameters": city}}]
    engine, arbiter, who = pool(replicas)
    async with arbiter:
        reply = await who.chat("chat", MSG, tools=tools, tool_choice="required", parallel_tool_calls=False,
                               max_tokens=200, seed=1)
        answer = await who.chat("chat", MSG, max_tokens=200, seed=2, response_format={
            "type": "json_schema", "json_schema": {"name": "city", "schema": city}})
    assert engine.tool_parser_name == "hermes"  # read from the model's files here
    [call] = reply.tool_calls
    assert call.name == "weather" and reply.finish_reason == "tool_calls"
    jsonschema.validate(call.parsed_arguments(), city)
    jsonschema.validate(answer.json(), city)


async def test_cancelling_a_stream_stops_the_replica_generating(replicas):
    engine, arbiter, who = pool(replicas)
    async with arbiter:
        got = 0
        async for delta in who.stream_chat("chat", MSG, max_tokens=400, ignore_eos=True):
            got += delta.new_tokens
            if got >= 3:
                break  # the caller leaves: the stream closes, the replica aborts
        for _ in range(50):
            if all(running_on(url) == 0 for _, url in replicas):
                break
            await asyncio.sleep(0.1)
    assert all(running_on(url) == 0 for _, url in replicas)
    assert all(r.running == 0 for r in engine.replicas)


async def test_a_replica_killed_mid_run_fails_its_requests_typed_and_the_other_keeps_serving(replicas):
    """Six callers send requests back to back; one replica is killed (server and engine) a second in."""
    engine, arbiter, who = pool(replicas)
    outcomes = []

    async def caller():
        for _ in range(5):
            try:
                reply = await who.chat("chat", MSG, max_tokens=200, ignore_eos=True)
                outcomes.append(reply.usage.completion_tokens)
            except fa.EngineError as err:  # typed: the rule is in the module docs
                outcomes.append(err)

    async with arbiter:
        callers = [asyncio.create_task(caller()) for _ in range(6)]
        await asyncio.sleep(1.0)
        victim_proc, victim_url = replicas[0]
        kill_server(victim_proc)  # the server and its engine processes, as a crash
        await asyncio.wait_for(asyncio.gather(*callers), timeout=120)  # nothing hangs
        dead = next(r for r in engine.replicas if r.url == victim_url)
        alive = next(r for r in engine.replicas if r.url != victim_url)
        served_before = alive.served
        after = await who.chat("chat", MSG, max_tokens=5, ignore_eos=True)  # the survivor serves
        assert after.usage.completion_tokens == 5 and alive.served == served_before + 1
        assert arbiter.serving("chat")
    assert len(outcomes) == 30
    assert all(o == 200 or isinstance(o, fa.EngineError) for o in outcomes)
    assert sum(o == 200 for o in outcomes) >= 24  # only requests caught mid-output may fail
    assert not dead.healthy and dead.failures == 1 and engine.healthy
