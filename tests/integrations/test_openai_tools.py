"""fairagents_openai: tools, structured output and logprobs through the drop-in; calls from any loop; the sync client.

The scripted FakeEngine answers as a model would (a Hermes-syntax tool call, or JSON); the
real engine test checks that a required call is valid on the embedded model.
"""

import asyncio
import json
import threading

import openai
import pytest
from fairagents_openai import AsyncFairOpenAI, ChatCompletionSyncStream, FairOpenAI
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import fairagents as fa
from fairagents.errors import ProtocolError
from fairagents.testing import FakeEngine

pytest.importorskip("vllm")  # the hermes tool parser

WEATHER = {"type": "function", "function": {
    "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "weather in Oslo?"}]
CALL = 'Let me look. <tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'


def pool(reply=CALL):
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", FakeEngine(reply=reply))
    return arbiter, arbiter.app("a").agent("bot")


def accumulate(chunks):
    """What openai's stream helpers rebuild from chunks: content, tool calls by index, the finish reason."""
    content, calls, finish = [], {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content.append(delta.content or "")
        for piece in delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = call["id"] or piece.id
            call["name"] = call["name"] or (piece.function.name if piece.function else None)
            call["arguments"] += (piece.function.arguments or "") if piece.function else ""
        finish = chunk.choices[0].finish_reason or finish
    return "".join(content), [calls[i] for i in sorted(calls)], finish


async def test_a_tool_round_trip_through_the_drop_in():
    arbiter, bot = pool()
    client = AsyncFairOpenAI(arbiter, agent=bot)
    async with arbiter:
        first = await client.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER])
        message = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls"
        [call] = message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("weather", {"city": "Oslo"})
        history = [*ASK, message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "sunny, 14 °C"}]
        arbiter.engine("chat").reply = "It is sunny."
        answer = await client.chat.completions.create(model="chat", messages=history, tools=[WEATHER])
    assert answer.choices[0].message.content == "It is sunny." and answer.choices[0].finish_reason == "stop"
    assert ChatCompletion.model_validate(first.model_dump()).choices[0].message.tool_calls[0].id == call.id


async def test_streamed_tool_calls_add_up_to_the_reply():
    arbiter, bot = pool()
    client = AsyncFairOpenAI(arbiter, agent=bot)
    async with arbiter:
        whole = await client.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER])
        stream = await client.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER], stream=True)
        chunks = [c async for c in stream]
    assert all(isinstance(ChatCompletionChunk.model_validate(c.model_dump()), ChatCompletionChunk) for c in chunks)
    content, calls, finish = accumulate(chunks)
    [call] = whole.choices[0].message.tool_calls
    assert finish == "tool_calls" and content.strip() == whole.choices[0].message.content.strip()
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [(call.function.name,
                                                                         json.loads(call.function.arguments))]
    assert calls[0]["id"].startswith("call_")


async def test_response_format_and_tool_choice_reach_the_engine():
    arbiter, bot = pool(reply='{"answer": "yes"}')
    client = AsyncFairOpenAI(arbiter, agent=bot)
    async with arbiter:
        done = await client.chat.completions.create(model="chat", messages=ASK,
                                                    response_format={"type": "json_object"})
        forced = await client.chat.completions.create(
            model="chat", messages=ASK, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "weather"}})
    assert json.loads(done.choices[0].message.content) == {"answer": "yes"}
    sent = list(arbiter.engine("chat").params.values())
    assert sent[0].structured == {"json_object": True}
    assert sent[1].structured == {"json": WEATHER["function"]["parameters"]}
    assert forced.choices[0].message.tool_calls[0].function.name == "weather"


async def test_bad_tools_are_refused_before_anything_is_charged():
    arbiter, bot = pool()
    client = AsyncFairOpenAI(arbiter, agent=bot)
    async with arbiter:
        for stream in (False, True):
            with pytest.raises(fa.InvalidParameterError):
                await client.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER],
                                                     tool_choice={"type": "function", "function": {"name": "nope"}},
                                                     stream=stream)
    assert not arbiter.ledger.records


def test_the_async_client_works_from_a_loop_other_than_the_arbiters():
    arbiter, bot = pool(reply="hello there")
    ready, done = threading.Event(), threading.Event()

    async def serve():  # the arbiter's loop, in a thread of its own
        async with arbiter:
            ready.set()
            await asyncio.to_thread(done.wait)

    server = threading.Thread(target=asyncio.run, args=(serve(),))
    server.start()
    ready.wait()
    try:
        client = AsyncFairOpenAI(arbiter, agent=bot)

        async def elsewhere():
            reply = await asyncio.wait_for(client.chat.completions.create(model="chat", messages=ASK), 10)
            stream = await client.chat.completions.create(model="chat", messages=ASK, stream=True)
            chunks = [c async for c in stream]
            return reply, chunks

        reply, chunks = asyncio.run(elsewhere())
        assert reply.choices[0].message.content == "hello there"
        assert accumulate(chunks)[0] == "hello there"
    finally:
        done.set()
        server.join()
    with pytest.raises(fa.ShutdownError):  # the arbiter's loop has ended: said, not hung
        asyncio.run(AsyncFairOpenAI(arbiter, agent=bot).chat.completions.create(model="chat", messages=ASK))


def test_the_sync_client_needs_no_event_loop():
    arbiter, bot = pool()
    with FairOpenAI(arbiter, agent=bot) as client:
        completion = client.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER])
        stream = client.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER], stream=True)
        assert isinstance(stream, ChatCompletionSyncStream)
        content, calls, finish = accumulate(list(stream))
        with pytest.raises(fa.UnknownModelError):
            client.chat.completions.create(model="nope", messages=ASK)
        assert client.portal.owns_loop
    assert not client.portal.owns_loop  # closed with the client, the arbiter too
    assert completion.choices[0].message.tool_calls[0].function.name == "weather"
    assert finish == "tool_calls" and calls[0]["name"] == "weather"


async def test_the_sync_client_on_the_arbiters_own_loop_says_it_would_block():
    arbiter, bot = pool()
    async with arbiter:
        with pytest.raises(ProtocolError):
            FairOpenAI(arbiter, agent=bot).chat.completions.create(model="chat", messages=ASK)


def test_the_sync_client_over_http_is_openais_own():
    client = FairOpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-a", agent="bot")
    assert isinstance(client.openai, openai.OpenAI)
    client.close()


@pytest.mark.engine
@pytest.mark.asyncio(loop_scope="session")
async def test_a_required_call_on_the_real_engine_is_valid(text_engine):
    import jsonschema

    city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", text_engine)
    client = AsyncFairOpenAI(arbiter, agent=arbiter.app("a").agent("bot"))
    await arbiter.start()
    try:
        completion = await client.chat.completions.create(
            model="chat", messages=ASK, max_tokens=300, seed=1, tool_choice="required", parallel_tool_calls=False,
            tools=[{"type": "function", "function": {"name": "weather", "parameters": city}}])
        answer = await client.chat.completions.create(
            model="chat", messages=ASK, max_tokens=300, seed=2, logprobs=True, top_logprobs=2,
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": city}})
    finally:
        await arbiter.close(stop_engines=False)
    [call] = completion.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), city)
    jsonschema.validate(json.loads(answer.choices[0].message.content), city)
    tokens = answer.choices[0].logprobs.content
    assert len(tokens) == answer.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in tokens)
