"""Anthropic's Messages and OpenAI's Responses over HTTP, on FakeEngines, through their official clients.

Both are translated into the one chat request: the tests check that what the engine sees is
what a chat completion would have given it, that answers and streams parse in the official
SDKs (``anthropic``, ``openai.responses``), that tool calls go round, and that bad input is
a 4xx in the protocol's own shape that charges nothing. The real engine is in test_real.py.
"""

import asyncio
import json

import anthropic
import httpx
import openai
import pytest
from pydantic import BaseModel

from fairagents.testing import FakeEngine

from ._support import KEYS, client, live, make_config, wait_until
from .test_openai_surface import CALL_TEXT, Recording, nothing_charged, serve

WEATHER_A = {"name": "weather", "description": "Weather of a city",
             "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
WEATHER_R = {"type": "function", "name": "weather", "description": "Weather of a city",
             "parameters": WEATHER_A["input_schema"]}
ASK = [{"role": "user", "content": "weather in Oslo?"}]


class City(BaseModel):
    city: str


def claude(url, key=KEYS["driving"], **kwargs):
    """The official Anthropic client, as a harness makes it (the key as ``x-api-key``)."""
    return anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0, **kwargs)


# -- Anthropic's Messages --------------------------------------------------------------


async def test_a_tool_use_round_trip_through_the_anthropic_client():
    replies = iter([CALL_TEXT, "It rains in Oslo."])
    engine = Recording(reply=lambda params: next(replies))
    arbiter = serve(engine)
    async with live(arbiter, make_config()) as (url, _), claude(url) as c:
        first = await c.messages.create(model="chat", max_tokens=64, system="Be brief.", messages=ASK,
                                        tools=[WEATHER_A], stop_sequences=["###"],
                                        extra_body={"top_k": 20, "temperature": 0.5})  # no longer the SDK's arguments
        assert first.stop_reason == "tool_use" and first.role == "assistant"
        text, call = first.content
        assert (text.type, text.text) == ("text", "Let me look. ")
        assert (call.type, call.name, call.input) == ("tool_use", "weather", {"city": "Oslo"})
        assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
        history = [*ASK, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "rain"}]}]
        second = await c.messages.create(model="chat", max_tokens=64, messages=history, tools=[WEATHER_A])
    assert second.stop_reason == "end_turn" and second.content[0].text == "It rains in Oslo."
    sent = engine.messages[0]
    assert sent == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "weather in Oslo?"}]
    params = engine.params[engine.started_order[0]]
    assert (params.top_k, params.temperature, params.stop, params.max_tokens) == (20, 0.5, ("###",), 64)
    back = engine.messages[1]
    assert back[1]["tool_calls"][0]["id"] == call.id and json.loads(back[1]["tool_calls"][0]["function"]["arguments"]) \
        == {"city": "Oslo"}
    assert back[2] == {"role": "tool", "content": "rain", "tool_call_id": call.id}
    assert engine.tools[0] == [{"type": "function", "function": {
        "name": "weather", "parameters": WEATHER_A["input_schema"], "description": "Weather of a city"}}]
    assert arbiter.stats().agents["driving/default"].done == 2


async def test_the_anthropic_stream_sends_anthropics_events_and_adds_up_to_the_message():
    engine = FakeEngine(reply=CALL_TEXT)
    async with live(serve(engine), make_config()) as (url, _), claude(url) as c:
        request = {"model": "chat", "max_tokens": 64, "messages": ASK, "tools": [WEATHER_A]}
        whole = await c.messages.create(**request)
        async with c.messages.stream(**request) as stream:
            kinds = [event.type async for event in stream]
            streamed = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    assert [b.model_dump(exclude={"id"}) for b in streamed.content] == [b.model_dump(exclude={"id"}) for b in whole.content]
    assert streamed.stop_reason == whole.stop_reason == "tool_use"
    assert streamed.usage.output_tokens == whole.usage.output_tokens > 0


async def test_anthropic_errors_have_anthropics_shape_and_charge_nothing():
    engine = FakeEngine(reply="hi")
    arbiter = serve(engine)
    good = {"model": "chat", "max_tokens": 8, "messages": ASK}
    bad = [
        ({**good, "model": "nope"}, 404, "not_found_error"),
        ({k: v for k, v in good.items() if k != "max_tokens"}, 400, "invalid_request_error"),
        ({**good, "temperature": 1.5}, 400, "invalid_request_error"),
        ({**good, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, 400,
         "invalid_request_error"),
        ({**good, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "invalid_request_error"),
        ({**good, "tool_choice": {"type": "tool"}, "tools": [WEATHER_A]}, 400, "invalid_request_error"),
        ({**good, "mcp_servers": [{"url": "https://example.com"}]}, 400, "invalid_request_error"),
    ]
    async with live(arbiter, make_config()) as (url, _):
        async with httpx.AsyncClient(base_url=url, headers={"x-api-key": KEYS["driving"]}) as http:
            for body, status, kind in bad:
                for stream in (False, True):
                    response = await http.post("/v1/messages", json={**body, "stream": stream})
                    assert response.status_code == status, (body, response.text)
                    assert response.json()["type"] == "error" and response.json()["error"]["type"] == kind
            unknown = await http.post("/v1/messages", json=good, headers={"x-api-key": "sk-nope"})
            assert unknown.status_code == 401 and unknown.json()["error"]["type"] == "authentication_error"
        async with claude(url) as c:
            with pytest.raises(anthropic.NotFoundError):
                await c.messages.create(**{**good, "model": "nope"})
        async with claude(url, key="sk-nope") as c:
            with pytest.raises(anthropic.AuthenticationError):
                await c.messages.create(**good)
    nothing_charged(arbiter, engine)


async def test_messages_parse_reads_a_json_schema_output():
    engine = FakeEngine(reply='{"city": "Oslo"}')
    async with live(serve(engine), make_config()) as (url, _), claude(url) as c:
        parsed = await c.messages.parse(model="chat", max_tokens=64, messages=ASK, output_format=City)
    assert parsed.parsed_output == City(city="Oslo")
    assert engine.params[engine.started_order[0]].structured is not None  # enforced in decoding


async def test_count_tokens_counts_the_rendered_prompt_and_charges_nothing():
    engine = FakeEngine(reply="hi")
    arbiter = serve(engine)
    async with live(arbiter, make_config()) as (url, _), claude(url) as c:
        short = await c.messages.count_tokens(model="chat", messages=ASK)
        longer = await c.messages.count_tokens(model="chat", messages=ASK, system="You are a careful assistant.",
                                               tools=[WEATHER_A])
    assert 0 < short.input_tokens < longer.input_tokens
    nothing_charged(arbiter, engine)


async def test_a_bearer_key_is_taken_on_the_messages_api_too():
    async with live(serve(FakeEngine(reply="hi")), make_config()) as (url, _):
        async with claude(url, key=None, auth_token=KEYS["studio"]) as c:
            reply = await c.messages.create(model="chat", max_tokens=8, messages=ASK)
    assert reply.content[0].text == "hi"


# -- OpenAI's Responses ----------------------------------------------------------------


async def test_a_function_call_round_trip_through_openais_responses():
    replies = iter([CALL_TEXT, "It rains in Oslo."])
    engine = Recording(reply=lambda params: next(replies))
    arbiter = serve(engine)
    async with live(arbiter, make_config()) as (url, _), client(url) as c:
        first = await c.responses.create(model="chat", instructions="Be brief.", input=ASK, tools=[WEATHER_R],
                                         max_output_tokens=64)
        assert first.status == "completed" and first.output_text == "Let me look. "
        call = next(item for item in first.output if item.type == "function_call")
        assert (call.name, json.loads(call.arguments)) == ("weather", {"city": "Oslo"})
        history = [*ASK, *[item.model_dump(exclude_none=True) for item in first.output],
                   {"type": "function_call_output", "call_id": call.call_id, "output": "rain"}]
        second = await c.responses.create(model="chat", input=history, tools=[WEATHER_R], store=False)
    assert second.output_text == "It rains in Oslo." and second.usage.output_tokens > 0
    assert engine.messages[0][0] == {"role": "system", "content": "Be brief."}
    back = engine.messages[1]
    assert [m["role"] for m in back] == ["user", "assistant", "tool"]
    assert back[1]["content"] == "Let me look. " and back[1]["tool_calls"][0]["id"] == call.call_id
    assert engine.params[engine.started_order[0]].max_tokens == 64
    assert arbiter.stats().agents["driving/default"].done == 2


async def test_the_responses_stream_adds_up_to_the_whole_response():
    engine = FakeEngine(reply=CALL_TEXT)
    async with live(serve(engine), make_config()) as (url, _), client(url) as c:
        request = {"model": "chat", "input": "weather in Oslo?", "tools": [WEATHER_R]}
        whole = await c.responses.create(**request)
        async with c.responses.stream(**request) as stream:
            kinds = [event.type async for event in stream]
            streamed = await stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.function_call_arguments.delta" in kinds
    assert streamed.output_text == whole.output_text == "Let me look. "
    calls = [(i.name, i.arguments) for r in (whole, streamed) for i in r.output if i.type == "function_call"]
    assert calls[0] == calls[1] and json.loads(calls[0][1]) == {"city": "Oslo"}
    assert streamed.usage.output_tokens == whole.usage.output_tokens > 0


async def test_responses_parse_reads_a_json_schema_output():
    engine = FakeEngine(reply='{"city": "Oslo"}')
    async with live(serve(engine), make_config()) as (url, _), client(url) as c:
        parsed = await c.responses.parse(model="chat", input="where?", text_format=City)
    assert parsed.output_parsed == City(city="Oslo")
    assert engine.params[engine.started_order[0]].structured is not None  # enforced in decoding


async def test_a_response_cut_by_max_output_tokens_is_incomplete():
    async with live(serve(FakeEngine(reply="one two three four five")), make_config()) as (url, _), client(url) as c:
        cut = await c.responses.create(model="chat", input="count", max_output_tokens=2)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"


async def test_responses_errors_are_openai_shaped_4xx_and_charge_nothing():
    engine = FakeEngine(reply="hi")
    arbiter = serve(engine)
    good = {"model": "chat", "input": "hi"}
    bad = [
        ({**good, "model": "nope"}, 404, "previous"),
        ({**good, "previous_response_id": "resp_1"}, 400, "not stored"),
        ({**good, "conversation": "conv_1"}, 400, "not stored"),
        ({**good, "tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, 400, "function tools only"),
        ({**good, "input": [{"type": "item_reference", "id": "x"}]}, 400, "input item"),
        ({**good, "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, 400, "content part"),
        ({**good, "text": {"format": {"type": "yaml"}}}, 400, "text.format"),
        ({**good, "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({**good, "input": []}, 400, "input"),
    ]
    async with live(arbiter, make_config()) as (url, _):
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEYS['driving']}"}) as http:
            for body, status, words in bad:
                response = await http.post("/v1/responses", json=body)
                assert response.status_code == status, (body, response.text)
                error = response.json()["error"]
                assert error["type"] == "invalid_request_error" or status == 404
                assert status == 404 or words in error["message"] or words in (error["param"] or ""), (body, error)
        async with client(url) as c:
            with pytest.raises(openai.BadRequestError):
                await c.responses.create(**good, previous_response_id="resp_1")
    nothing_charged(arbiter, engine)


# -- what the harnesses send -----------------------------------------------------------
# The shapes of Claude Code's and Codex CLI's requests, as they send them (their prompts cut to a line).

CLAUDE_CODE_BODY = {
    "model": "chat", "max_tokens": 64, "stream": True,
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cc_entrypoint=sdk-cli;"},
               {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                                     {"type": "text", "text": "say hello", "cache_control": {"type": "ephemeral"}}]},
        {"role": "system", "content": "Agents you can start: none."},
    ],
    "tools": [{"name": "Bash", "description": "Run a command", "input_schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
        "properties": {"command": {"type": "string"}}, "required": ["command"], "additionalProperties": False}}],
    "metadata": {"user_id": '{"device_id":"ab","account_uuid":"","session_id":"5f0c"}'},
    "thinking": {"type": "adaptive"}, "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
    "output_config": {"effort": "high"},
}
CODEX_BODY = {
    "model": "chat", "stream": True, "tool_choice": "auto", "parallel_tool_calls": True, "store": False,
    "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "019a",
    "client_metadata": {"session_id": "019a"},
    "input": [{"type": "message", "id": "m1", "role": "developer", "content": [{"type": "input_text", "text": "Be safe."}]},
              {"type": "message", "id": "m2", "role": "user", "content": [{"type": "input_text", "text": "say hello"}]}],
    "tools": [{"type": "function", "name": "exec_command", "description": "Run", "strict": False,
               "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
              {"type": "namespace", "name": "multi_agent_v1", "description": "Agents", "tools": [
                  {"type": "function", "name": "spawn_agent", "parameters": {"type": "object", "properties": {}}}]},
              {"type": "web_search", "external_web_access": False}],
}


async def test_a_claude_code_request_is_served_as_it_is_sent():
    engine = Recording(reply="hello")
    async with live(serve(engine), make_config()) as (url, _), claude(url) as c:
        known = {"model", "max_tokens", "system", "messages", "tools", "metadata", "thinking", "output_config"}
        async with c.messages.stream(**{k: v for k, v in CLAUDE_CODE_BODY.items() if k in known},
                                     extra_body={"context_management": CLAUDE_CODE_BODY["context_management"]}) as stream:
            reply = await stream.get_final_message()
    assert reply.content[0].text == "hello"
    assert [m["role"] for m in engine.messages[0]] == ["system", "user", "system"]
    assert engine.messages[0][1]["content"] == "<system-reminder>ctx</system-reminder>\nsay hello"
    assert [t["function"]["name"] for t in engine.tools[0]] == ["Bash"]


async def test_a_codex_request_is_served_and_a_namespaced_call_carries_its_namespace():
    engine = Recording(reply='<tool_call>{"name": "spawn_agent", "arguments": {}}</tool_call>')
    async with live(serve(engine), make_config()) as (url, _), client(url) as c:
        async with c.responses.stream(**{k: v for k, v in CODEX_BODY.items() if k not in ("stream", "client_metadata")},
                                      extra_body={"client_metadata": CODEX_BODY["client_metadata"]}) as stream:
            done = await stream.get_final_response()
    (call,) = done.output
    assert call.type == "function_call" and call.name == "spawn_agent" and call.namespace == "multi_agent_v1"
    assert [t["function"]["name"] for t in engine.tools[0]] == ["exec_command", "spawn_agent"]  # no web_search
    assert [m["role"] for m in engine.messages[0]] == ["developer", "user"]


async def test_a_full_queue_is_a_429_with_retry_after_in_each_protocols_shape_and_the_views_count_it():
    engine = FakeEngine(tokens_per_reply=10, token_time=0.02)
    arbiter = serve(engine, in_flight=1)
    config = make_config(apps={"driving": {"api_key": KEYS["driving"], "max_queued": 1}})
    async with live(arbiter, config) as (url, gateway), claude(url) as c, client(url) as gpt:
        running = asyncio.create_task(c.messages.create(model="chat", max_tokens=10, messages=ASK))
        await wait_until(lambda: arbiter.stats().apps["driving"].in_flight == 1)
        queued = asyncio.create_task(gpt.responses.create(model="chat", input="hi", max_output_tokens=10))
        await wait_until(lambda: arbiter.stats().apps["driving"].queued == 1)
        with pytest.raises(anthropic.RateLimitError) as refused:
            await c.messages.create(model="chat", max_tokens=10, messages=ASK)
        assert refused.value.body["error"]["type"] == "rate_limit_error"
        assert int(refused.value.response.headers["retry-after"]) >= 1
        with pytest.raises(openai.RateLimitError) as also:
            await gpt.responses.create(model="chat", input="hi", max_output_tokens=10)
        assert also.value.code == "queue_full"
        await asyncio.gather(running, queued)
        assert gateway.identities.rejected[("driving", "default")] == 2
    assert arbiter.stats().apps["driving"].done == 2


def test_images_a_tool_returns_follow_its_result_as_the_users_in_both_protocols():
    from fairagents.protocols import anthropic as messages_api
    from fairagents.protocols import responses as responses_api

    image = "data:image/png;base64,iVBORw0KGgo="
    _, chat = responses_api.read(json.dumps({"model": "chat", "input": [
        {"role": "user", "content": "look"},
        {"type": "function_call", "call_id": "c1", "name": "view", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_text", "text": "a frame"}, {"type": "input_image", "image_url": image}]}]}).encode())
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool", "user"]
    assert chat.messages[2].content == "a frame" and chat.messages[3].content[0]["image_url"]["url"] == image
    _, chat = messages_api.read(json.dumps({"model": "chat", "max_tokens": 8, "messages": [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "view", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "a frame"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
    ]}).encode())
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool", "user"]
    assert chat.messages[2].content == "a frame" and chat.messages[3].content[0]["image_url"]["url"] == image
